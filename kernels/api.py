"""Host API of the CSA compressor kernels: validation, dispatch, allocation, launch.

Used by the gate and by library users. Tensors follow docs/CONTRACT.md section 1:

    kv, score (T, coff*d) bf16;  ape (ratio, coff*d) fp32;  cu, cuc (B+1,) int32;
    out / grad_out (N, d) bf16 with N >= cuc[B] (rows past cuc[B] are capacity padding);
    dkv, dscore (T, coff*d) bf16;  dape (ratio, coff*d) fp32.

* :func:`check_support` raises ValueError naming the offending argument for every rule of
  the envelope (docs/KERNELS.md section 5); meta tensors are accepted for shape-only checks.
* :func:`forward` / :func:`backward` allocate their outputs; :func:`run_forward` /
  :func:`run_backward` write into caller buffers and return the :class:`KernelKey` they
  launched (None when N == 0: nothing is launched).
* :func:`build` compiles every kernel a configuration can select (or one bucket), so a
  CUDA-graph capture finds them compiled; :func:`kernel_for` is the dispatch decision alone.

Launches go to the given torch stream, else the current stream of ``kv``'s device, and are
anchored to that device. N is the static row count of ``out``/``grad_out``; the kernels read
segment boundaries from ``cu``/``cuc`` on the device, so no call here synchronizes, except
:func:`forward` without ``n_rows`` (it reads ``cuc[-1]``; pass ``n_rows`` under capture).
"""

from __future__ import annotations

import functools

import torch
from csagate.kernels import registry
from csagate.kernels._dsl import sm_count
from csagate.kernels.cache import CACHE, BuildRecord
from csagate.kernels.registry import COFFS, RATIOS, KernelKey, keys_for, make_key
from csagate.kernels.schedule import ARCHES, MAX_GRID_Y, R4_FWD_THREADS_WIDE
from csagate.kernels.schedule import rows_per_cta as _rows_per_cta
from csagate.kernels.small_schedule import SMALL_RATIOS

__all__ = ["ALIGN_BYTES", "COFFS", "RATIOS", "backward", "build", "check_support", "forward",
           "kernel_for", "run_backward", "run_forward"]
MAX_HEAD_DIM = R4_FWD_THREADS_WIDE * MAX_GRID_Y  # the forward's gridDim.y bound at vec=1
INT32_LIMIT = 2**31
# Base-pointer alignment the launchers promise the compiler (vector accesses need 16 B).
ALIGN_BYTES = {torch.bfloat16: 16, torch.float32: 16, torch.int32: 4}

_DTYPES = {"kv": torch.bfloat16, "score": torch.bfloat16, "ape": torch.float32,
           "cu_seqlens": torch.int32, "cu_seqlens_comp": torch.int32}


# --- validation -----------------------------------------------------------------------


def check_support(kv, score, ape, cu, cuc, out_or_grad_out=None, *, ratio: int, coff: int,
                  out_name: str = "out", devices: bool = True) -> None:
    """Raise ValueError, naming the argument, unless the inputs are in the kernels' envelope.

    ``cu`` is ``cu_seqlens`` and ``cuc`` is ``cu_seqlens_comp`` in the messages. Values of
    cu/cuc are not read (that would synchronize): N >= cuc[B] is the caller's promise.
    """
    _check_ratio_coff(ratio, coff)
    named = {"kv": kv, "score": score, "ape": ape, "cu_seqlens": cu, "cu_seqlens_comp": cuc}
    if out_or_grad_out is not None:
        named[out_name] = out_or_grad_out
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    for name, dtype in _DTYPES.items():
        if named[name].dtype != dtype:
            raise ValueError(f"{name} must be {dtype}, got {named[name].dtype}")
    if out_or_grad_out is not None and out_or_grad_out.dtype != torch.bfloat16:
        raise ValueError(f"{out_name} must be {torch.bfloat16}, got {out_or_grad_out.dtype}")

    if kv.dim() != 2:
        raise ValueError(f"kv must be 2-D (T, coff*head_dim), got shape {tuple(kv.shape)}")
    n_tokens, width = kv.shape
    if width < coff or width % coff:
        raise ValueError(f"kv width {width} must be coff*head_dim = {coff}*head_dim with "
                         "head_dim >= 1")
    d = width // coff
    if score.shape != kv.shape:
        raise ValueError(f"score shape {tuple(score.shape)} must equal kv shape "
                         f"{tuple(kv.shape)}")
    if tuple(ape.shape) != (ratio, width):
        raise ValueError(f"ape shape {tuple(ape.shape)} must be (ratio, coff*head_dim) = "
                         f"{(ratio, width)}")
    if cu.dim() != 1 or cu.shape[0] < 2:
        raise ValueError(f"cu_seqlens must be 1-D with B + 1 >= 2 entries, got shape "
                         f"{tuple(cu.shape)}")
    if cuc.dim() != 1 or cuc.shape[0] != cu.shape[0]:
        raise ValueError(f"cu_seqlens_comp must be 1-D with B + 1 = {cu.shape[0]} entries "
                         f"(as cu_seqlens), got shape {tuple(cuc.shape)}")
    n_rows = None
    if out_or_grad_out is not None:
        if out_or_grad_out.dim() != 2 or out_or_grad_out.shape[1] != d:
            raise ValueError(f"{out_name} must be (N, head_dim) = (N, {d}), got shape "
                             f"{tuple(out_or_grad_out.shape)}")
        n_rows = out_or_grad_out.shape[0]

    if d > MAX_HEAD_DIM:
        raise ValueError(f"head_dim {d} exceeds {R4_FWD_THREADS_WIDE}*{MAX_GRID_Y} = "
                         f"{MAX_HEAD_DIM} (forward gridDim.y)")
    for what, size in (("T*coff*head_dim (kv/score)", n_tokens * width),
                       ("ratio*coff*head_dim (ape)", ratio * width),
                       (f"N*head_dim ({out_name})", (0 if n_rows is None else n_rows) * d)):
        # _guard_or_false: under torch.compile N may be an unbacked size (the op's forward
        # without n_rows); a rule that cannot be decided there is left to the run time.
        if _guard_or_false(size >= INT32_LIMIT):
            raise ValueError(f"{what} = {size} does not fit int32 flat offsets (< 2^31)")
    registry.family(ratio, "fwd").check_shape(coff, d)
    if n_rows is not None and _guard_or_false(n_rows != 0) and _guard_or_false(n_tokens < ratio):
        raise ValueError(f"N={n_rows} > 0 requires at least ratio={ratio} tokens in kv, "
                         f"got T={n_tokens}")

    for name, t in named.items():
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous (row-major), got strides {t.stride()}")
    if devices:  # off for fake tensors (no data pointers): shapes and dtypes only
        _check_devices(named)


def _guard_or_false(cond) -> bool:
    """``cond`` for plain bools; torch's ``guard_or_false`` for symbolic ones (a rule that
    cannot be decided while tracing is left to the run time). Imported only then: the module
    pulls in sympy, a second of import for every process that never traces."""
    if isinstance(cond, bool):
        return cond
    from torch.fx.experimental.symbolic_shapes import guard_or_false

    return guard_or_false(cond)


def _check_ratio_coff(ratio: int, coff: int) -> None:
    if ratio not in RATIOS:
        raise ValueError(f"kernels are validated for ratio in {{{', '.join(map(str, RATIOS))}}} "
                         f"only, got {ratio}")
    if coff not in COFFS:
        raise ValueError(f"ratio={ratio} supports coff in {COFFS}, got coff={coff}")


def _check_devices(named: dict) -> None:
    """CUDA (or meta) tensors on one device, base pointers aligned for the vector accesses."""
    device = None
    for name, t in named.items():
        if t.device.type == "meta":
            continue
        if t.device.type != "cuda":
            raise ValueError(f"{name} must be a CUDA tensor (or meta for checks), "
                             f"got device {t.device}")
        if device is None:
            device = (name, t.device)
        elif t.device != device[1]:
            raise ValueError(f"all tensors must be on one CUDA device: {device[0]} is on "
                             f"{device[1]}, {name} on {t.device}")
        align = ALIGN_BYTES[t.dtype]
        if t.data_ptr() % align:
            raise ValueError(f"{name} base pointer 0x{t.data_ptr():x} is not {align}-byte "
                             f"aligned (a view at a storage offset?); pass an aligned tensor")


def _check_grad_buffers(kv, ape, dkv, dscore, dape) -> None:
    named = {"dkv": dkv, "dscore": dscore, "dape": dape}
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    for name, t, like, dtype in (("dkv", dkv, kv, torch.bfloat16),
                                 ("dscore", dscore, kv, torch.bfloat16),
                                 ("dape", dape, ape, torch.float32)):
        if t.dtype != dtype:
            raise ValueError(f"{name} must be {dtype}, got {t.dtype}")
        if t.shape != like.shape:
            raise ValueError(f"{name} shape {tuple(t.shape)} must equal "
                             f"{'kv' if like is kv else 'ape'} shape {tuple(like.shape)}")
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous (row-major), got strides {t.stride()}")
    _check_devices({"kv": kv, **named})


def _require_cuda() -> None:
    if not torch.cuda.is_available():
        raise RuntimeError("CUDA is not available: the CSA compressor kernels need a CUDA GPU")


def _check_launchable(tensors: dict, stream) -> torch.device:
    """The device to launch on (the inputs passed check_support); no meta tensors."""
    for name, t in tensors.items():
        if t.device.type == "meta":
            raise ValueError(f"{name} is a meta tensor: it can be checked, not launched")
    device = tensors["kv"].device
    if stream is not None and stream.device != device:
        raise ValueError(f"stream is on {stream.device} but the tensors are on {device}")
    _device_arch(device.index)
    return device


@functools.cache
def _device_arch(index: int) -> str:
    from csagate.kernels._dsl import device_arch

    arch = device_arch(index)
    if arch not in ARCHES:
        cc = torch.cuda.get_device_capability(index)
        raise RuntimeError(f"cuda:{index} has compute capability {cc[0]}.{cc[1]} ({arch}); the "
                           f"kernels build for {', '.join(ARCHES)} (H200, B200, B300)")
    return arch


def _deterministic(flag: bool | None) -> bool:
    """The backward's mode: ``deterministic`` as given, None follows torch's flag
    (``torch.use_deterministic_algorithms``, warn-only included: the mode is deterministic)."""
    return torch.are_deterministic_algorithms_enabled() if flag is None else bool(flag)


# Test hook: when not None, the deterministic path fills its dAPE partials buffer with this
# value before the launch (NaN proves that the kernel writes every slot).
PARTIALS_FILL: float | None = None


def _bwd_ctas(key: KernelKey, n_rows: int, rows_per_cta: int | None, device_index: int
              ) -> tuple[int, int | None]:
    """(gx, rows_per_cta) of a backward launch: the CTAs along the rows (each owns one slice of
    the deterministic dAPE partials buffer) and the rows per CTA of a family that takes them
    (``schedule.rows_per_cta`` for N and the device's SMs unless given); None for the others,
    whose rows per CTA are compile-time."""
    if not key.family.takes_rows_per_cta:
        return -(-n_rows // key.schedule.rows_per_cta), None
    if rows_per_cta is None:
        rows_per_cta = _rows_per_cta(n_rows, key.d, key.coff, key.schedule,
                                     sm_count(device_index))
    return -(-n_rows // int(rows_per_cta)), int(rows_per_cta)


def _launch_deterministic(ratio: int, coff: int, d: int, n_rows: int, device, stream,
                          tensors: dict, rows_per_cta: int | None, zero_dape: bool,
                          **launch_args) -> KernelKey:
    """The deterministic backward: the ``_det`` kernel stores per-CTA dAPE partials into a
    (gx, ratio, W) fp32 buffer (allocated here, on the launch stream: the caching allocator
    serves it under CUDA graph capture too), then kernels/reduce.py adds their sum, in
    ascending CTA order, to dape (to +0.0 with ``zero_dape``)."""
    import dataclasses

    from csagate.kernels import reduce

    remember = stream is None and rows_per_cta is None
    with torch.cuda.device(device):
        stream = _launch_stream(device, stream)
        arch = _device_arch(device.index)
        base = kernel_for("bwd", ratio, coff, d, n_rows, arch)
        key = dataclasses.replace(
            base, schedule=dataclasses.replace(base.schedule, deterministic=True))
        gx, rpc = _bwd_ctas(key, n_rows, rows_per_cta, device.index)
        dape = launch_args.pop("dape")
        with torch.cuda.stream(stream):  # the capture check looks at the launch stream
            fn = CACHE.executor(key, device.index)
            red = reduce.executor(arch, device.index)
            partials = torch.empty((gx, *dape.shape), dtype=torch.float32, device=device)
            if PARTIALS_FILL is not None:
                partials.fill_(PARTIALS_FILL)
        _keep_alive(stream, device, tensors.values())
        extra = {"rows_per_cta": rpc} if rpc is not None else {}
        with torch.cuda.stream(stream):  # the compiled functions launch on the current one
            # partials[0] has dape's shape and the buffer's base: the kernel reaches its CTA's
            # slice bx by a pointer offset (device.store_partial_f32)
            key.family.launch(fn, key, **launch_args, dape=partials[0], **extra)
            reduce.launch_reduce(red, partials=partials, dape=dape, zero_dape=zero_dape)
    if remember:
        _remember("bwd", ratio, coff, tensors["kv"], d, n_rows, key, fn, rpc,
                  partials=partials, reduce_fn=red)
    return key


# --- dispatch -------------------------------------------------------------------------


def kernel_for(direction: str, ratio: int, coff: int, d: int, n_rows: int, arch: str
               ) -> KernelKey | None:
    """The kernel a call would launch (no compile); None for N == 0 (nothing launches)."""
    family = registry.family(ratio, direction)
    _check_ratio_coff(ratio, coff)
    if n_rows < 0:
        raise ValueError(f"n_rows must be >= 0, got {n_rows}")
    if n_rows == 0:
        return None
    return make_key(direction, ratio, coff, d, family.select(coff, d, n_rows, arch), arch)


def build(ratio: int, *, arch: str | None = None, coff: int | None = None,
          d: int | None = None, n_rows: int | None = None, progress=None
          ) -> list[BuildRecord]:
    """Compile every kernel the configuration can select, or the bucket of ``n_rows`` only.

    ``arch`` defaults to the current CUDA device's. When the kernels are for the current
    device, they are also loaded onto it, so a later CUDA-graph capture does no loading.
    ``progress(record, i, n)`` is called after each kernel.
    """
    if coff is not None:
        _check_ratio_coff(ratio, coff)
    if arch is not None and arch not in ARCHES:
        raise ValueError(f"arch must be one of {ARCHES}, got {arch!r}")
    load_on = None
    if torch.cuda.is_available():
        current = torch.cuda.current_device()
        if arch is None:
            arch = _device_arch(current)
            load_on = current
        else:
            try:
                load_on = current if _device_arch(current) == arch else None
            except RuntimeError:  # a GPU we do not build for: cross-compiling is still fine
                load_on = None
    if arch is None:
        raise RuntimeError("no CUDA device to take the arch from: pass arch= one of "
                           f"{', '.join(ARCHES)}")
    if n_rows is None:
        keys = keys_for(ratio, arch, coff=coff, d=d)
    else:
        keys = []
        for c, hd in registry.family(ratio, "fwd").configs(coff, d):
            for direction in registry.DIRECTIONS:
                key = kernel_for(direction, ratio, c, hd, n_rows, arch)
                if key is not None and key not in keys:
                    keys.append(key)
    records = CACHE.build(keys, progress=progress)
    if load_on is not None:
        device = torch.device("cuda", load_on)
        for key in keys:
            _warm(key, device)
        torch.cuda.current_stream(device).synchronize()
    return records


def _warm(key: KernelKey, device: torch.device) -> None:
    """One tiny launch of ``key`` on ``device`` (one block, zero inputs): the kernel's module
    is then loaded there, so a CUDA-graph capture later finds it ready."""
    ratio, width, d = key.ratio, key.coff * key.d, key.d
    bf16 = dict(dtype=torch.bfloat16, device=device)
    with torch.cuda.device(device):
        kv = torch.zeros(ratio, width, **bf16)
        tensors = dict(kv=kv, score=torch.zeros_like(kv),
                       ape=torch.zeros(ratio, width, dtype=torch.float32, device=device),
                       cu=torch.tensor([0, ratio], dtype=torch.int32, device=device),
                       cuc=torch.tensor([0, 1], dtype=torch.int32, device=device))
        if key.direction == "fwd":
            tensors["out"] = torch.empty(1, d, **bf16)
        else:
            tensors.update(grad_out=torch.zeros(1, d, **bf16), dkv=torch.empty_like(kv),
                           dscore=torch.empty_like(kv), dape=torch.zeros_like(tensors["ape"]))
        key.family.launch(CACHE.executor(key, device.index), key, **tensors)


# --- launch ---------------------------------------------------------------------------


def _launch_stream(device: torch.device, stream):
    return stream if stream is not None else torch.cuda.current_stream(device)


def _keep_alive(stream, device: torch.device, tensors) -> None:
    """On a stream other than the current one, tell the allocator the tensors are in use there
    (so freeing them on the current stream cannot recycle memory the kernel still reads)."""
    if stream != torch.cuda.current_stream(device):
        for t in tensors:
            t.record_stream(stream)


def run_forward(kv, score, ape, cu, cuc, out, *, ratio: int, coff: int, stream=None
                ) -> KernelKey | None:
    """out = the compressor forward of the inputs, every row of ``out`` (padding included)."""
    if stream is None:
        try:
            t, w = kv.shape
            e = _FAST.get(("fwd", ratio, coff, w, kv.get_device(), out.shape[0]))
            if e is not None and ratio <= t <= e[3] and cu.shape[0] >= 2:
                e[1](kv, score, ape, cu, cuc, out, *(_depth(cu) if e[2] is None else e[2]))
                return e[0]
        except _NOT_FAST:  # an unusual argument (the compiled checks refuse before launching)
            pass  # the full path below raises the api's one-line error
    _require_cuda()
    check_support(kv, score, ape, cu, cuc, out, ratio=ratio, coff=coff)
    tensors = {"kv": kv, "score": score, "ape": ape, "cu_seqlens": cu,
               "cu_seqlens_comp": cuc, "out": out}
    device = _check_launchable(tensors, stream)
    n_rows, d = out.shape
    if n_rows == 0:
        return None
    return _launch("fwd", ratio, coff, d, n_rows, device, stream, tensors,
                   kv=kv, score=score, ape=ape, cu=cu, cuc=cuc, out=out)


# --- the launch fast path ------------------------------------------------------------------
# A call whose signature (direction, ratio, coff, width, device, N) has launched before, with no
# explicit stream, skips the Python validation: the compiled TVM-FFI function checks dtypes,
# shapes, strides, alignment and the device itself (and switches to the tensors' device), and
# the rules it cannot see (B + 1 >= 2, ratio <= T, T*width < 2^31) are re-checked here per
# call. Anything unusual (a new signature, an explicit stream, an explicit rows_per_cta, a
# refused argument) takes the full path, whose errors are the api's one-line messages. The
# deterministic backward has entries of its own (kind "bwd_det"). A backward launch takes the
# zero_dape flag last (1: the launcher zeroes dape first, or the reduction stores into it).
# An entry is a plain tuple (the cheapest thing to unpack on a path measured in us):
#   (key, call, args, max_tokens, template, reduce)
# call: the tvm_ffi.Function itself; args: the trailing launch arguments (None for the small
# ratios, whose segment-search depth follows from B at each call); template: an expanded view of one
# element whose empty_like is the cheapest contiguous allocation of the forward's (N, d) out
# or the deterministic backward's (gx, ratio, W) partials (None otherwise); reduce: the
# deterministic backward's dAPE reduction (its tvm_ffi.Function, called on flat views).

_FAST: dict = {}
_FAST_MAX = 4096  # signatures remembered (N varies little in training)
# What sends a call from the fast path to the full one: a refused argument (the compiled
# function checks before it launches), a tensor of another rank, or not a tensor at all.
_NOT_FAST = (ValueError, TypeError, AttributeError)


def _depth(cu) -> tuple[int]:
    """The small ratios' trailing launch argument: the bits of a segment index (B =
    len(cu) - 1)."""
    return ((cu.shape[0] - 1).bit_length(),)


def _raw_call(fn):
    """The ``tvm_ffi.Function`` behind a compiled function (no Python ``__call__`` layer)."""
    import tvm_ffi

    inner = getattr(fn, "__tvm_ffi_object__", None)
    if inner is not None:  # the DSL's kwargs wrapper around a tvm_ffi.Function
        inner = inner()
        if inner is not None:
            return inner
    if type(fn) is not tvm_ffi.Function and isinstance(fn, tvm_ffi.Function):
        return functools.partial(tvm_ffi.Function.__call__, fn)
    return fn


def _remember(direction: str, ratio: int, coff: int, kv, d: int, n_rows: int, key, fn,
              rows_per_cta, *, partials=None, reduce_fn=None) -> None:
    """Add the fast-path entry of a launch that took the full path (``partials`` and
    ``reduce_fn``: the deterministic backward's buffer, as a shape to allocate, and reduction)."""
    if len(_FAST) >= _FAST_MAX:
        return
    width = kv.shape[1]
    if ratio in SMALL_RATIOS:
        args = None  # derived from B at each call (_depth)
    elif direction == "bwd":
        args = (int(rows_per_cta),)
    else:
        args = ()
    tmpl = red = None
    kind = direction
    if direction == "fwd":
        tmpl = torch.empty((1, 1), dtype=torch.bfloat16, device=kv.device).expand(n_rows, d)
    elif partials is not None:
        kind = "bwd_det"
        tmpl = partials.new_empty((1, 1, 1)).expand(partials.shape)
        red = _raw_call(reduce_fn)
    _FAST[(kind, ratio, coff, width, kv.get_device(), n_rows)] = (
        key, _raw_call(fn), args, (INT32_LIMIT - 1) // width, tmpl, red)


def _fast_deterministic(e, kv, score, ape, cu, cuc, grad_out, dkv, dscore, dape, tail,
                        zero: int) -> None:
    """The deterministic backward from a fast-path entry: partials, kernel, reduction."""
    partials = torch.empty_like(e[4])
    if PARTIALS_FILL is not None:
        partials.fill_(PARTIALS_FILL)
    e[1](kv, score, ape, cu, cuc, grad_out, dkv, dscore, partials[0], *tail, 0)
    e[5](partials.view(-1), dape.view(-1), zero)  # reduce.launch_reduce's call, inlined


def _launch(direction: str, ratio: int, coff: int, d: int, n_rows: int, device, stream,
            tensors: dict, **launch_args) -> KernelKey:
    """Dispatch, load onto ``device`` and launch on ``stream`` (or the current one); a launch
    on the current stream with the default rows per CTA is remembered for the fast path."""
    with torch.cuda.device(device):
        remember = stream is None and launch_args.get("rows_per_cta") is None
        stream = _launch_stream(device, stream)
        key = kernel_for(direction, ratio, coff, d, n_rows, _device_arch(device.index))
        with torch.cuda.stream(stream):  # the capture check looks at the launch stream
            fn = CACHE.executor(key, device.index)
        _keep_alive(stream, device, tensors.values())
        if direction == "bwd" and key.family.takes_rows_per_cta:
            _, launch_args["rows_per_cta"] = _bwd_ctas(key, n_rows,
                                                       launch_args.get("rows_per_cta"),
                                                       device.index)
        with torch.cuda.stream(stream):  # the compiled function launches on the current one
            key.family.launch(fn, key, **launch_args)
    if remember:
        _remember(direction, ratio, coff, tensors["kv"], d, n_rows, key, fn,
                  launch_args.get("rows_per_cta"))
    return key


def run_backward(kv, score, ape, cu, cuc, grad_out, dkv, dscore, dape, *, ratio: int,
                 coff: int, rows_per_cta: int | None = None, stream=None,
                 deterministic: bool | None = None, accumulate: bool = True
                 ) -> KernelKey | None:
    """Write dkv and dscore (every slot) and accumulate into dape (the caller zeroes it), or
    with ``accumulate=False`` write dape (the launch zeroes it first: any buffer will do).

    ``rows_per_cta`` (ratio=128 only) defaults to ``schedule.rows_per_cta`` for N and the
    device's SM count. ``deterministic`` (None: follow
    ``torch.are_deterministic_algorithms_enabled()``): dAPE from per-CTA partials summed in a
    fixed order, bitwise identical run to run; out, dKV and dScore are the same either way.
    Otherwise dAPE is accumulated with fp32 atomics.
    """
    deterministic = (torch.are_deterministic_algorithms_enabled() if deterministic is None
                     else bool(deterministic))  # _deterministic, inlined: a hot path
    zero = 0 if accumulate else 1
    if stream is None and rows_per_cta is None:
        try:
            t, w = kv.shape
            e = _FAST.get(("bwd_det" if deterministic else "bwd", ratio, coff, w,
                           kv.get_device(), grad_out.shape[0]))
            if e is not None and ratio <= t <= e[3] and cu.shape[0] >= 2:
                tail = _depth(cu) if e[2] is None else e[2]
                if deterministic:
                    _fast_deterministic(e, kv, score, ape, cu, cuc, grad_out, dkv, dscore,
                                        dape, tail, zero)
                else:
                    e[1](kv, score, ape, cu, cuc, grad_out, dkv, dscore, dape, *tail, zero)
                return e[0]
        except _NOT_FAST:  # an unusual argument (the compiled checks refuse before launching)
            pass  # the full path below raises the api's one-line error
    return _run_backward(kv, score, ape, cu, cuc, grad_out, dkv, dscore, dape, ratio=ratio,
                         coff=coff, rows_per_cta=rows_per_cta, stream=stream,
                         deterministic=deterministic, zero_dape=bool(zero))


def _run_backward(kv, score, ape, cu, cuc, grad_out, dkv, dscore, dape, *, ratio, coff,
                  rows_per_cta, stream, deterministic: bool = False, zero_dape: bool = False
                  ) -> KernelKey | None:
    _require_cuda()
    check_support(kv, score, ape, cu, cuc, grad_out, ratio=ratio, coff=coff,
                  out_name="grad_out")
    _check_grad_buffers(kv, ape, dkv, dscore, dape)
    if rows_per_cta is not None:
        if not registry.family(ratio, "bwd").takes_rows_per_cta:
            raise ValueError(f"rows_per_cta is a ratio=128 launch parameter (ratio={ratio})")
        if int(rows_per_cta) < 1:
            raise ValueError(f"rows_per_cta must be >= 1, got {rows_per_cta}")
    tensors = {"kv": kv, "score": score, "ape": ape, "cu_seqlens": cu, "cu_seqlens_comp": cuc,
               "grad_out": grad_out, "dkv": dkv, "dscore": dscore, "dape": dape}
    device = _check_launchable(tensors, stream)
    n_rows, d = grad_out.shape
    if n_rows == 0:
        if zero_dape:  # nothing launches, dape is still the (zero) gradient
            with torch.cuda.device(device), torch.cuda.stream(_launch_stream(device, stream)):
                dape.zero_()
        return None
    if deterministic:
        return _launch_deterministic(ratio, coff, d, n_rows, device, stream, tensors,
                                     rows_per_cta, zero_dape, kv=kv, score=score, ape=ape,
                                     cu=cu, cuc=cuc, grad_out=grad_out, dkv=dkv,
                                     dscore=dscore, dape=dape)
    # rows_per_cta None: the launch derives it (schedule.rows_per_cta, the device's SMs).
    extra = {"rows_per_cta": rows_per_cta} if rows_per_cta is not None else {}
    return _launch("bwd", ratio, coff, d, n_rows, device, stream, tensors, kv=kv, score=score,
                   ape=ape, cu=cu, cuc=cuc, grad_out=grad_out, dkv=dkv, dscore=dscore,
                   dape=dape, zero_dape=zero_dape, **extra)


def forward(kv, score, ape, cu, cuc, *, ratio: int, coff: int, n_rows: int | None = None,
            stream=None) -> torch.Tensor:
    """The compressor output (N, d) bf16, N = ``n_rows`` (default ``cuc[-1]``).

    The default reads ``cuc[-1]`` on the host, a device sync that a CUDA graph cannot
    capture: pass ``n_rows`` (the static capacity) when capturing.
    """
    if stream is None and n_rows is not None:  # the fast path (see run_forward)
        try:
            t, w = kv.shape
            e = _FAST.get(("fwd", ratio, coff, w, kv.get_device(), n_rows))
            if e is not None and ratio <= t <= e[3] and cu.shape[0] >= 2:
                out = torch.empty_like(e[4])
                e[1](kv, score, ape, cu, cuc, out, *(_depth(cu) if e[2] is None else e[2]))
                return out
        except _NOT_FAST:  # an unusual argument (the compiled checks refuse before launching)
            pass  # the full path below raises the api's one-line error
    _require_cuda()
    check_support(kv, score, ape, cu, cuc, ratio=ratio, coff=coff)
    device = _check_launchable({"kv": kv, "score": score, "ape": ape, "cu_seqlens": cu,
                                "cu_seqlens_comp": cuc}, stream)
    if n_rows is None:
        with torch.cuda.device(device):
            if torch.cuda.is_current_stream_capturing():
                raise RuntimeError("forward(n_rows=None) reads cuc[-1] (a sync) under CUDA "
                                   "graph capture: pass n_rows")
        n_rows = int(cuc[-1].item())
    d = kv.shape[1] // coff
    with torch.cuda.device(device), torch.cuda.stream(_launch_stream(device, stream)):
        out = torch.empty((n_rows, d), dtype=torch.bfloat16, device=device)
    run_forward(kv, score, ape, cu, cuc, out, ratio=ratio, coff=coff, stream=stream)
    return out


def backward(kv, score, ape, cu, cuc, grad_out, *, ratio: int, coff: int, stream=None,
             deterministic: bool | None = None
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dkv, dscore, dape) for ``grad_out`` (its capacity padding rows are ignored).

    dkv/dscore/dape are allocated uninitialized on the launch stream (the kernel writes every
    dkv/dscore slot and the launch zeroes dape before the kernel adds into it; zeros when
    N == 0, where nothing launches). ``deterministic`` as in :func:`run_backward`.
    """
    deterministic = (torch.are_deterministic_algorithms_enabled() if deterministic is None
                     else bool(deterministic))  # _deterministic, inlined: a hot path
    if stream is None:  # the fast path (see run_backward)
        try:
            t, w = kv.shape
            e = _FAST.get(("bwd_det" if deterministic else "bwd", ratio, coff, w,
                           kv.get_device(), grad_out.shape[0]))
            if e is not None and ratio <= t <= e[3] and cu.shape[0] >= 2:
                tail = _depth(cu) if e[2] is None else e[2]
                dkv, dscore = torch.empty_like(kv), torch.empty_like(score)
                dape = torch.empty_like(ape)  # zeroed by the launch (flag 1)
                if deterministic:
                    _fast_deterministic(e, kv, score, ape, cu, cuc, grad_out, dkv, dscore,
                                        dape, tail, 1)
                else:
                    e[1](kv, score, ape, cu, cuc, grad_out, dkv, dscore, dape, *tail, 1)
                return dkv, dscore, dape
        except _NOT_FAST:  # an unusual argument (the compiled checks refuse before launching)
            pass  # the full path below raises the api's one-line error
    _require_cuda()
    check_support(kv, score, ape, cu, cuc, grad_out, ratio=ratio, coff=coff,
                  out_name="grad_out")
    device = _check_launchable({"kv": kv, "grad_out": grad_out}, stream)
    alloc = torch.zeros_like if grad_out.shape[0] == 0 else torch.empty_like
    with torch.cuda.device(device), torch.cuda.stream(_launch_stream(device, stream)):
        dkv = alloc(kv)
        dscore = alloc(score)
        dape = torch.empty_like(ape)  # zeroed by the launch, or by _run_backward when N == 0
    _run_backward(kv, score, ape, cu, cuc, grad_out, dkv, dscore, dape, ratio=ratio, coff=coff,
                  rows_per_cta=None, stream=stream, deterministic=deterministic,
                  zero_dape=True)
    return dkv, dscore, dape
