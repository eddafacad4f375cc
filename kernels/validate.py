"""What the kernels accept: the envelope checks of the host API (docs/KERNELS.md section 5.2):
:func:`check_support` (shapes, dtypes, strides, devices; never values), :func:`check_values`
(the cu/cuc offsets, a device sync) and the launch-time rules.
"""

from __future__ import annotations

import functools

import torch
from csagate.kernels import registry
from csagate.kernels.registry import COFFS
from csagate.kernels.schedule import ARCHES
from csagate.kernels.small_schedule import MAX_GRID_Y, SMALL_FWD_THREADS_WIDE

MAX_HEAD_DIM = SMALL_FWD_THREADS_WIDE * MAX_GRID_Y  # the forward's gridDim.y bound at vec=1
INT32_LIMIT = 2**31
# Base-pointer alignment the launchers promise the compiler (vector accesses need 16 B).
ALIGN_BYTES = {torch.bfloat16: 16, torch.float32: 16, torch.int32: 4}

_DTYPES = {"kv": torch.bfloat16, "score": torch.bfloat16, "ape": torch.float32,
           "cu_seqlens": torch.int32, "cu_seqlens_comp": torch.int32}


def check_support(kv, score, ape, cu, cuc, out_or_grad_out=None, *, ratio: int, coff: int,
                  out_name: str = "out", devices: bool = True, n_rows=None) -> None:
    """Raise ValueError, naming the argument, unless the inputs are in the kernels' envelope
    (cu/cuc values are not read: :func:`check_values`). ``n_rows``: the row count when no
    output tensor is given (the forward's ``n_rows``), held to the same rules."""
    check_ratio_coff(ratio, coff)
    named = {"kv": kv, "score": score, "ape": ape, "cu_seqlens": cu, "cu_seqlens_comp": cuc}
    if out_or_grad_out is not None:
        named[out_name] = out_or_grad_out
    _check_types(named, out_name)
    d = _check_shapes(kv, score, ape, cu, cuc, ratio=ratio, coff=coff)
    if out_or_grad_out is not None:
        if out_or_grad_out.dim() != 2 or out_or_grad_out.shape[1] != d:
            raise ValueError(f"{out_name} must be (N, head_dim) = (N, {d}), got shape "
                             f"{tuple(out_or_grad_out.shape)}")
        n_rows = out_or_grad_out.shape[0]
    elif n_rows is not None and guard_or_false(n_rows < 0):
        raise ValueError(f"n_rows must be >= 0, got {n_rows}")
    _check_sizes(kv.shape[0], d, n_rows, ratio=ratio, coff=coff, out_name=out_name)
    for name, t in named.items():
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous (row-major), got strides {t.stride()}")
    if devices:  # off for fake tensors (no data pointers): shapes and dtypes only
        check_devices(named)


def _check_types(named: dict, out_name: str) -> None:
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    for name, dtype in {**_DTYPES, out_name: torch.bfloat16}.items():
        if name in named and named[name].dtype != dtype:
            raise ValueError(f"{name} must be {dtype}, got {named[name].dtype}")


def _check_shapes(kv, score, ape, cu, cuc, *, ratio: int, coff: int) -> int:
    """The head dim ``d`` of well-formed inputs."""
    if kv.dim() != 2:
        raise ValueError(f"kv must be 2-D (T, coff*head_dim), got shape {tuple(kv.shape)}")
    width = kv.shape[1]
    if width < coff or width % coff:
        raise ValueError(f"kv width {width} must be coff*head_dim = {coff}*head_dim with "
                         "head_dim >= 1")
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
    return width // coff


def _check_sizes(n_tokens, d: int, n_rows, *, ratio: int, coff: int, out_name: str) -> None:
    width = coff * d
    if d > MAX_HEAD_DIM:
        raise ValueError(f"head_dim {d} exceeds {SMALL_FWD_THREADS_WIDE}*{MAX_GRID_Y} = "
                         f"{MAX_HEAD_DIM} (forward gridDim.y)")
    for what, size in (("T*coff*head_dim (kv/score)", n_tokens * width),
                       ("ratio*coff*head_dim (ape)", ratio * width),
                       (f"N*head_dim ({out_name})", (0 if n_rows is None else n_rows) * d)):
        # under torch.compile N may be unbacked: an undecidable rule is left to the run time
        if guard_or_false(size >= INT32_LIMIT):
            raise ValueError(f"{what} = {size} does not fit int32 flat offsets (< 2^31)")
    registry.FAMILIES[ratio, "fwd"].check_shape(coff, d)  # the ratio: check_ratio_coff
    if n_rows is not None and guard_or_false(n_rows != 0) and guard_or_false(n_tokens < ratio):
        raise ValueError(f"N={n_rows} > 0 requires at least ratio={ratio} tokens in kv, "
                         f"got T={n_tokens}")


def guard_or_false(cond) -> bool:
    """``cond`` for plain bools; torch's ``guard_or_false`` for symbolic ones (imported only
    then: it pulls in sympy)."""
    if isinstance(cond, bool):
        return cond
    from torch.fx.experimental.symbolic_shapes import guard_or_false as guard

    return guard(cond)


def check_ratio_coff(ratio: int, coff: int) -> None:
    registry.check_ratio(ratio)
    if coff not in COFFS:
        raise ValueError(f"ratio={ratio} supports coff in {tuple(sorted(COFFS))}, got "
                         f"coff={coff}")


def check_values(cu, cuc, *, ratio: int, n_tokens: int, n_rows: int | None = None,
                 out_name: str = "out") -> None:
    """Raise ValueError, naming the rule, unless ``cu``/``cuc`` describe a pack of ``n_tokens``
    tokens into at most ``n_rows`` rows (docs/CONTRACT.md section 1); a device sync."""
    c = cu.detach().to("cpu", torch.int64)
    q = cuc.detach().to("cpu", torch.int64)
    if int(c[0]) != 0:
        raise ValueError(f"cu_seqlens[0] must be 0, got {int(c[0])}")
    lens = c.diff()
    bad = _first(lens < 0)
    if bad is not None:
        raise ValueError(f"cu_seqlens must be non-decreasing: cu_seqlens[{bad + 1}] = "
                         f"{int(c[bad + 1])} < cu_seqlens[{bad}] = {int(c[bad])}")
    if int(c[-1]) > n_tokens:
        raise ValueError(f"cu_seqlens[-1] = {int(c[-1])} exceeds T = {n_tokens} (kv rows)")
    if int(q[0]) != 0:
        raise ValueError(f"cu_seqlens_comp[0] must be 0, got {int(q[0])}")
    rows = q.diff()
    bad = _first(rows != lens // ratio)
    if bad is not None:
        raise ValueError(f"cu_seqlens_comp[{bad + 1}] - cu_seqlens_comp[{bad}] = "
                         f"{int(rows[bad])} must be (cu_seqlens[{bad + 1}] - cu_seqlens[{bad}])"
                         f" // ratio = {int(lens[bad]) // ratio} (one row per full block)")
    if n_rows is not None and int(q[-1]) > n_rows:
        raise ValueError(f"cu_seqlens_comp[-1] = {int(q[-1])} exceeds N = {n_rows} "
                         f"({out_name} rows)")


def _first(mask: torch.Tensor) -> int | None:
    hits = mask.nonzero()
    return int(hits[0, 0]) if hits.numel() else None


def check_devices(named: dict) -> None:
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


def check_grad_buffers(kv, ape, dkv, dscore, dape) -> None:
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
    check_devices({"kv": kv, **named})


def check_rows_per_cta(ratio: int, rows_per_cta) -> None:
    if rows_per_cta is None:
        return
    if not registry.FAMILIES[ratio, "bwd"].takes_rows_per_cta:  # after check_support
        raise ValueError(f"rows_per_cta is not a launch parameter at ratio={ratio} (its rows "
                         "per CTA are compile-time)")
    if int(rows_per_cta) < 1:
        raise ValueError(f"rows_per_cta must be >= 1, got {rows_per_cta}")


def check_launch(direction: str, inputs: tuple, outputs: tuple | None, *, ratio: int, coff: int,
                 n_rows=None, stream=None, check: bool = False, rows_per_cta=None
                 ) -> tuple[torch.device, str, int]:
    """Every rule of one launch, in the order the api's errors name them: the envelope
    (:func:`check_support`; the caller's buffers, ``rows_per_cta``), then a usable GPU, then
    the device, stream and arch, then (``check``) the cu/cuc values. ``outputs``: the caller's
    buffers ((out,) or (dkv, dscore, dape)), None when the launch allocates them. Returns (the
    device, its arch, N); N = ``n_rows``, or the rows given, or cuc[-1] (a sync)."""
    kv, score, ape, cu, cuc = inputs[:5]
    fwd = direction == "fwd"
    rows_name = "out" if fwd else "grad_out"
    rows = outputs[0] if fwd and outputs is not None else (None if fwd else inputs[5])
    check_support(kv, score, ape, cu, cuc, rows, ratio=ratio, coff=coff, out_name=rows_name,
                  n_rows=n_rows)
    named = {"kv": kv, "score": score, "ape": ape, "cu_seqlens": cu, "cu_seqlens_comp": cuc}
    if rows is not None:
        named[rows_name] = rows
    if not fwd and outputs is not None:
        check_grad_buffers(kv, ape, *outputs)
        named.update(dkv=outputs[0], dscore=outputs[1], dape=outputs[2])
    if not fwd:
        check_rows_per_cta(ratio, rows_per_cta)
    require_cuda()
    device = check_launchable(named, stream)
    if rows is not None:
        n_rows = rows.shape[0]
    elif n_rows is None:
        with torch.cuda.device(device):
            if torch.cuda.is_current_stream_capturing():
                raise RuntimeError("forward(n_rows=None) reads cuc[-1] (a sync) under CUDA "
                                   "graph capture: pass n_rows")
        n_rows = int(cuc[-1].item())
    if check:
        check_values(cu, cuc, ratio=ratio, n_tokens=kv.shape[0], n_rows=n_rows,
                     out_name=rows_name)
    return device, device_arch(device.index), n_rows


def require_cuda() -> None:
    if not torch.cuda.is_available():
        raise RuntimeError("CUDA is not available: the CSA compressor kernels need a CUDA GPU")


def check_launchable(tensors: dict, stream) -> torch.device:
    """The device to launch on (the inputs passed check_support); no meta tensors."""
    for name, t in tensors.items():
        if t.device.type == "meta":
            raise ValueError(f"{name} is a meta tensor: it can be checked, not launched")
    device = tensors["kv"].device
    if stream is not None and stream.device != device:
        raise ValueError(f"stream is on {stream.device} but the tensors are on {device}")
    device_arch(device.index)
    return device


@functools.cache
def device_arch(index: int) -> str:
    """The build target of CUDA device ``index``; RuntimeError for a GPU we do not build for."""
    from csagate.kernels._dsl import device_arch as arch_of

    arch = arch_of(index)
    if arch not in ARCHES:
        cc = torch.cuda.get_device_capability(index)
        raise RuntimeError(f"cuda:{index} has compute capability {cc[0]}.{cc[1]} ({arch}); the "
                           f"kernels build for {', '.join(ARCHES)} (H100 and H200, B200, B300)")
    return arch
