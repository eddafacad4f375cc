"""Host API of the CSA compressor kernels: dispatch, allocation, launch.

Tensors follow docs/CONTRACT.md section 1 (kv, score (T, coff*d) bf16; ape (ratio, coff*d)
fp32; cu, cuc (B+1,) int32; out / grad_out (N, d) bf16, N >= cuc[B]). :func:`forward` /
:func:`backward` allocate their outputs, :func:`run_forward` / :func:`run_backward` write into
caller buffers; :func:`build` compiles what a configuration can select (before a CUDA-graph
capture). No call synchronizes except ``check=True`` and :func:`forward` without ``n_rows``.
Design: docs/KERNELS.md section 5.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
from csagate.kernels import registry
from csagate.kernels._dsl import sm_count
from csagate.kernels.cache import CACHE, BuildRecord
from csagate.kernels.registry import COFFS, RATIOS, KernelKey, ReduceKey, keys_for, make_key
from csagate.kernels.schedule import ARCHES
from csagate.kernels.validate import (
    ALIGN_BYTES,
    INT32_LIMIT,
    check_grad_buffers,
    check_launchable,
    check_ratio_coff,
    check_rows_per_cta,
    check_support,
    check_values,
    device_arch,
    require_cuda,
)

__all__ = ["ALIGN_BYTES", "COFFS", "RATIOS", "backward", "build", "check_support", "forward",
           "kernel_for", "run_backward", "run_forward"]

# Test hook: a value (NaN) the deterministic path fills its partials with before the launch.
PARTIALS_FILL: float | None = None


def _deterministic(flag: bool | None) -> bool:
    """The backward's mode: ``deterministic``, or None: torch's flag (warn-only included)."""
    return torch.are_deterministic_algorithms_enabled() if flag is None else bool(flag)


# --- dispatch -------------------------------------------------------------------------


def kernel_for(direction: str, ratio: int, coff: int, d: int, n_rows: int, arch: str
               ) -> KernelKey | None:
    """The kernel a call would launch (no compile); None for N == 0 (nothing launches)."""
    family = registry.family(ratio, direction)
    check_ratio_coff(ratio, coff)
    if n_rows < 0:
        raise ValueError(f"n_rows must be >= 0, got {n_rows}")
    if n_rows == 0:
        return None
    return make_key(direction, ratio, coff, d, family.select(coff, d, n_rows, arch), arch)


def _build_arch(arch: str | None) -> tuple[str, int | None]:
    """(the arch to build for, the current device to load onto, or None)."""
    if arch is not None and arch not in ARCHES:
        raise ValueError(f"arch must be one of {ARCHES}, got {arch!r}")
    load_on = None
    if torch.cuda.is_available():
        current = torch.cuda.current_device()
        if arch is None:
            arch = device_arch(current)
            load_on = current
        else:
            try:
                load_on = current if device_arch(current) == arch else None
            except RuntimeError:  # a GPU we do not build for: cross-compiling is still fine
                load_on = None
    if arch is None:
        raise RuntimeError("no CUDA device to take the arch from: pass arch= one of "
                           f"{', '.join(ARCHES)}")
    return arch, load_on


def build(ratio: int, *, arch: str | None = None, coff: int | None = None,
          d: int | None = None, n_rows: int | None = None, progress=None
          ) -> list[BuildRecord]:
    """Compile every kernel the configuration can select (or the bucket of ``n_rows``); for the
    current device they are also loaded."""
    if coff is not None:
        check_ratio_coff(ratio, coff)
    arch, load_on = _build_arch(arch)
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
    """One tiny launch of ``key`` on ``device``, so its module is loaded before a capture."""
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


# --- the launch fast path: a signature launched before, with no explicit stream, rows_per_cta
# or check, skips the Python validation (the compiled TVM-FFI function checks the tensors) ---

_FAST: dict = {}
_FAST_MAX = 4096  # signatures remembered (N varies little in training)
# What sends a call to the full path: a refused argument, another rank, not a tensor.
_NOT_FAST = (ValueError, TypeError, AttributeError)


class _Entry:
    """A remembered launch: the tvm_ffi.Function, the arguments after the tensors (behind the
    segment search's depth where ``seg_bits``), a template view for empty_like, the
    deterministic dAPE reduction."""

    __slots__ = ("key", "call", "tail", "seg_bits", "max_tokens", "template", "reduce")

    def __init__(self, key, call, tail, seg_bits, max_tokens, template, reduce):
        self.key, self.call, self.tail, self.seg_bits = key, call, tail, seg_bits
        self.max_tokens, self.template, self.reduce = max_tokens, template, reduce


def _fast(kind: str, ratio: int, coff: int, n_rows, inputs: tuple, outputs=None, zero=None):
    """Launch a remembered signature without Python validation: ``(key, outputs)``, or None
    (the call takes the full path)."""
    try:
        kv, cu = inputs[0], inputs[3]
        t, w = kv.shape
        if n_rows is None:
            n_rows = (outputs[0] if zero is None else inputs[5]).shape[0]
        e = _FAST.get((kind, ratio, coff, w, kv.get_device(), n_rows))
        if e is None or not ratio <= t <= e.max_tokens or cu.shape[0] < 2:
            return None
        if outputs is None:  # the backward's dape is zeroed by the launch (zero == 1)
            outputs = ((torch.empty_like(e.template),) if zero is None else
                       (torch.empty_like(kv), torch.empty_like(inputs[1]),
                        torch.empty_like(inputs[2])))
        # the segment search's depth (device.segment_bits(B)) first where the family takes it
        tail = ((cu.shape[0] - 1).bit_length(), *e.tail) if e.seg_bits else e.tail
        if e.reduce is None:
            e.call(*inputs, *outputs, *tail, *(() if zero is None else (zero,)))
        else:  # partials, the kernel, the reduction (reduce.launch_reduce's call, inlined)
            partials = torch.empty_like(e.template)
            if PARTIALS_FILL is not None:
                partials.fill_(PARTIALS_FILL)
            e.call(*inputs, outputs[0], outputs[1], partials[0], *tail, 0)
            e.reduce(partials.view(-1), outputs[2].view(-1), zero)
    except _NOT_FAST:  # an unusual argument (the compiled checks refuse before launching)
        return None  # the full path raises the api's one-line error
    return e.key, outputs


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


def _remember(key: KernelKey, kv, n_rows: int, fn, rows_per_cta, partials=None,
              reduce_fn=None) -> None:
    """Add the fast-path entry of a launch that took the full path."""
    if len(_FAST) >= _FAST_MAX:
        return
    width = kv.shape[1]
    tail = (int(rows_per_cta),) if rows_per_cta is not None else ()
    tmpl = red = None
    if key.direction == "fwd":
        tmpl = torch.empty((1, 1), dtype=torch.bfloat16, device=kv.device).expand(n_rows, key.d)
    elif partials is not None:
        tmpl = partials.new_empty((1, 1, 1)).expand(partials.shape)
        red = _raw_call(reduce_fn)
    kind = "bwd_det" if key.deterministic else key.direction
    _FAST[(kind, key.ratio, key.coff, width, kv.get_device(), n_rows)] = _Entry(
        key, _raw_call(fn), tail, key.family.takes_segment_bits, (INT32_LIMIT - 1) // width,
        tmpl, red)


# --- the full path ---------------------------------------------------------------------------

_LAUNCH_NAMES = {"cu_seqlens": "cu", "cu_seqlens_comp": "cuc"}  # message name -> launch arg


def _launch_stream(device: torch.device, stream):
    return stream if stream is not None else torch.cuda.current_stream(device)


def _keep_alive(stream, device: torch.device, tensors) -> None:
    """On a stream other than the current one, tell the allocator the tensors are in use there."""
    if stream != torch.cuda.current_stream(device):
        for t in tensors:
            t.record_stream(stream)


def _bwd_ctas(key: KernelKey, n_rows: int, rows_per_cta: int | None, device_index: int
              ) -> tuple[int, int | None]:
    """(gx, rows_per_cta) of a backward launch: the CTAs along the rows and, for a family that
    takes it, the rows per CTA (``schedule.rows_per_cta`` unless given); else None."""
    if not key.family.takes_rows_per_cta:
        return -(-n_rows // key.schedule.rows_per_cta), None
    if rows_per_cta is None:
        rows_per_cta = key.family.rows_per_cta(n_rows, key.d, key.coff, key.schedule,
                                               sm_count(device_index))
    most = key.family.max_rows_per_cta
    cap = most(key.schedule) if most is not None else None
    if cap is not None and int(rows_per_cta) > cap:
        raise ValueError(f"rows_per_cta={int(rows_per_cta)} exceeds the {cap} rows per CTA "
                         f"the ratio={key.ratio} {key.config} backward takes")
    return -(-n_rows // int(rows_per_cta)), int(rows_per_cta)


def _prepare(direction: str, tensors: dict, stream, *, ratio: int, coff: int, check: bool,
             rows_per_cta=None) -> torch.device:
    """The full path's validation of a launch into caller buffers: the device to launch on."""
    rows_name = "out" if direction == "fwd" else "grad_out"
    t = tensors
    check_support(t["kv"], t["score"], t["ape"], t["cu_seqlens"], t["cu_seqlens_comp"],
                  t[rows_name], ratio=ratio, coff=coff, out_name=rows_name)
    if direction == "bwd":
        check_grad_buffers(t["kv"], t["ape"], t["dkv"], t["dscore"], t["dape"])
        check_rows_per_cta(ratio, rows_per_cta)
    require_cuda()
    device = check_launchable(tensors, stream)
    if check:
        check_values(t["cu_seqlens"], t["cu_seqlens_comp"], ratio=ratio,
                     n_tokens=t["kv"].shape[0], n_rows=t[rows_name].shape[0],
                     out_name=rows_name)
    return device


def _launch(key: KernelKey, device, stream, tensors: dict, rows_per_cta=None,
            zero_dape: bool = False) -> None:
    """Load ``key`` onto ``device`` and launch it on ``stream`` (or the current one),
    remembering a default launch for the fast path."""
    remember = stream is None and rows_per_cta is None
    args = {_LAUNCH_NAMES.get(name, name): t for name, t in tensors.items()}
    n_rows = args["out" if key.direction == "fwd" else "grad_out"].shape[0]
    partials = red = None
    with torch.cuda.device(device):
        stream = _launch_stream(device, stream)
        if key.direction == "bwd":
            gx, rows_per_cta = _bwd_ctas(key, n_rows, rows_per_cta, device.index)
            if rows_per_cta is not None:
                args["rows_per_cta"] = rows_per_cta
            if not key.deterministic:
                args["zero_dape"] = zero_dape
        with torch.cuda.stream(stream):  # the capture check looks at the launch stream
            fn = CACHE.executor(key, device.index)
            if key.deterministic:
                red = CACHE.executor(ReduceKey(key.arch), device.index)
                dape = args["dape"]
                partials = torch.empty((gx, *dape.shape), dtype=torch.float32, device=device)
                if PARTIALS_FILL is not None:
                    partials.fill_(PARTIALS_FILL)
                # partials[0]: dape's shape at the buffer's base (slice bx by pointer offset)
                args["dape"] = partials[0]
        _keep_alive(stream, device, tensors.values())
        with torch.cuda.stream(stream):  # the compiled functions launch on the current one
            key.family.launch(fn, key, **args)
            if red is not None:
                from csagate.kernels.reduce import launch_reduce

                launch_reduce(red, partials=partials, dape=dape, zero_dape=zero_dape)
    if remember:
        _remember(key, args["kv"], n_rows, fn, rows_per_cta, partials, red)


def _run(direction: str, tensors: dict, *, ratio: int, coff: int, stream, check: bool,
         rows_per_cta=None, deterministic: bool = False, zero_dape: bool = False
         ) -> KernelKey | None:
    """The full path of a launch into caller buffers: validate, dispatch, launch."""
    device = _prepare(direction, tensors, stream, ratio=ratio, coff=coff, check=check,
                      rows_per_cta=rows_per_cta)
    n_rows, d = tensors["out" if direction == "fwd" else "grad_out"].shape
    if n_rows == 0:
        if zero_dape:  # nothing launches, dape is still the (zero) gradient
            with torch.cuda.device(device), torch.cuda.stream(_launch_stream(device, stream)):
                tensors["dape"].zero_()
        return None
    key = kernel_for(direction, ratio, coff, d, n_rows, device_arch(device.index))
    if deterministic:
        key = dataclasses.replace(key, deterministic=True)
    _launch(key, device, stream, tensors, rows_per_cta, zero_dape)
    return key


# --- the public launches -----------------------------------------------------------------------


def run_forward(kv, score, ape, cu, cuc, out, *, ratio: int, coff: int, stream=None,
                check: bool = False) -> KernelKey | None:
    """out = the compressor forward of the inputs, every row of ``out`` (padding included).
    ``check``: read and check the cu/cuc values first (a device sync)."""
    if stream is None and not check:
        hit = _fast("fwd", ratio, coff, None, (kv, score, ape, cu, cuc), (out,))
        if hit is not None:
            return hit[0]
    tensors = {"kv": kv, "score": score, "ape": ape, "cu_seqlens": cu, "cu_seqlens_comp": cuc,
               "out": out}
    return _run("fwd", tensors, ratio=ratio, coff=coff, stream=stream, check=check)


def run_backward(kv, score, ape, cu, cuc, grad_out, dkv, dscore, dape, *, ratio: int,
                 coff: int, rows_per_cta: int | None = None, stream=None,
                 deterministic: bool | None = None, accumulate: bool = True,
                 check: bool = False) -> KernelKey | None:
    """Write dkv and dscore (every slot) and accumulate into dape (the caller zeroes it), or
    with ``accumulate=False`` write dape. ``deterministic`` (None: torch's flag): dAPE from
    per-CTA partials summed in a fixed order. ``check``: check the cu/cuc values first (a sync)."""
    deterministic = _deterministic(deterministic)
    zero = 0 if accumulate else 1
    if stream is None and rows_per_cta is None and not check:
        hit = _fast("bwd_det" if deterministic else "bwd", ratio, coff, None,
                    (kv, score, ape, cu, cuc, grad_out), (dkv, dscore, dape), zero)
        if hit is not None:
            return hit[0]
    tensors = {"kv": kv, "score": score, "ape": ape, "cu_seqlens": cu, "cu_seqlens_comp": cuc,
               "grad_out": grad_out, "dkv": dkv, "dscore": dscore, "dape": dape}
    return _run("bwd", tensors, ratio=ratio, coff=coff, stream=stream, check=check,
                rows_per_cta=rows_per_cta, deterministic=deterministic, zero_dape=bool(zero))


def forward(kv, score, ape, cu, cuc, *, ratio: int, coff: int, n_rows: int | None = None,
            stream=None, check: bool = False) -> torch.Tensor:
    """The compressor output (N, d) bf16, N = ``n_rows``; the default ``cuc[-1]`` is a device
    sync a CUDA graph cannot capture. ``check`` as in :func:`run_forward`."""
    if stream is None and n_rows is not None and not check:
        hit = _fast("fwd", ratio, coff, n_rows, (kv, score, ape, cu, cuc))
        if hit is not None:
            return hit[1][0]
    # the arguments first (the op's ValueErrors, CPU tensors included), then the machine
    check_support(kv, score, ape, cu, cuc, ratio=ratio, coff=coff, n_rows=n_rows)
    require_cuda()
    device = check_launchable({"kv": kv, "score": score, "ape": ape, "cu_seqlens": cu,
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
    run_forward(kv, score, ape, cu, cuc, out, ratio=ratio, coff=coff, stream=stream,
                check=check)
    return out


def backward(kv, score, ape, cu, cuc, grad_out, *, ratio: int, coff: int, stream=None,
             deterministic: bool | None = None, check: bool = False
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dkv, dscore, dape) for ``grad_out`` (padding rows ignored), allocated uninitialized on
    the launch stream. ``deterministic`` and ``check`` as in :func:`run_backward`."""
    deterministic = _deterministic(deterministic)
    if stream is None and not check:
        hit = _fast("bwd_det" if deterministic else "bwd", ratio, coff, None,
                    (kv, score, ape, cu, cuc, grad_out), None, 1)
        if hit is not None:
            return hit[1]
    check_support(kv, score, ape, cu, cuc, grad_out, ratio=ratio, coff=coff,
                  out_name="grad_out")
    require_cuda()
    device = check_launchable({"kv": kv, "grad_out": grad_out}, stream)
    alloc = torch.zeros_like if grad_out.shape[0] == 0 else torch.empty_like
    with torch.cuda.device(device), torch.cuda.stream(_launch_stream(device, stream)):
        dkv = alloc(kv)
        dscore = alloc(score)
        dape = torch.empty_like(ape)  # zeroed by the launch, or by _run when N == 0
    run_backward(kv, score, ape, cu, cuc, grad_out, dkv, dscore, dape, ratio=ratio, coff=coff,
                 stream=stream, deterministic=deterministic, accumulate=False, check=check)
    return dkv, dscore, dape
