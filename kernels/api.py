"""Host API of the compressor kernels (docs/KERNELS.md section 5). Tensors (docs/CONTRACT.md
section 1): kv, score (T, coff*d) bf16; ape (ratio, coff*d) fp32; cu, cuc (B+1,) int32; out,
grad_out (N, d) bf16, N >= cuc[B]. Only forward(n_rows=None) and check=True (reads cu/cuc) sync."""

from __future__ import annotations

import torch
from csagate.kernels import fastpath
from csagate.kernels.dispatch import build, kernel_for
from csagate.kernels.launch import launch_stream, run
from csagate.kernels.registry import COFFS, RATIOS, KernelKey
from csagate.kernels.validate import ALIGN_BYTES, check_launchable, check_support, require_cuda

__all__ = ["ALIGN_BYTES", "COFFS", "RATIOS", "backward", "build", "check_support", "forward",
           "kernel_for", "run_backward", "run_forward"]


def _deterministic(flag: bool | None) -> bool:
    return torch.are_deterministic_algorithms_enabled() if flag is None else bool(flag)


def run_forward(kv, score, ape, cu, cuc, out, *, ratio: int, coff: int, stream=None,
                check: bool = False) -> KernelKey | None:
    """Write the forward into ``out`` (every row, padding too); returns the KernelKey launched,
    None when N == 0. Raises ValueError on bad input, RuntimeError with no usable GPU."""
    if stream is None and not check:
        hit = fastpath.launch("fwd", False, ratio, coff, None, (kv, score, ape, cu, cuc), (out,))
        if hit is not None:
            return hit[0]
    tensors = {"kv": kv, "score": score, "ape": ape, "cu_seqlens": cu, "cu_seqlens_comp": cuc,
               "out": out}
    return run("fwd", tensors, ratio=ratio, coff=coff, stream=stream, check=check)


def run_backward(kv, score, ape, cu, cuc, grad_out, dkv, dscore, dape, *, ratio: int,
                 coff: int, rows_per_cta: int | None = None, stream=None,
                 deterministic: bool | None = None, zero_dape: bool = False,
                 check: bool = False) -> KernelKey | None:
    """Write dkv, dscore (every slot) and add into dape: the caller zeroes it, or the launch with
    ``zero_dape``. ``deterministic`` (None: torch's flag, warn-only too): dAPE from per-CTA
    partials summed in a fixed order. Returns and raises as :func:`run_forward`."""
    deterministic = _deterministic(deterministic)
    if stream is None and rows_per_cta is None and not check:
        hit = fastpath.launch("bwd", deterministic, ratio, coff, None,
                              (kv, score, ape, cu, cuc, grad_out), (dkv, dscore, dape),
                              zero_dape)
        if hit is not None:
            return hit[0]
    tensors = {"kv": kv, "score": score, "ape": ape, "cu_seqlens": cu, "cu_seqlens_comp": cuc,
               "grad_out": grad_out, "dkv": dkv, "dscore": dscore, "dape": dape}
    return run("bwd", tensors, ratio=ratio, coff=coff, stream=stream, check=check,
               rows_per_cta=rows_per_cta, deterministic=deterministic, zero_dape=zero_dape)


def forward(kv, score, ape, cu, cuc, *, ratio: int, coff: int, n_rows: int | None = None,
            stream=None, check: bool = False) -> torch.Tensor:
    """The forward as a new (N, d) bf16 tensor; N = ``n_rows``, default cuc[-1] (RuntimeError
    under graph capture). Raises as :func:`run_forward`; bad input before any GPU check."""
    if stream is None and n_rows is not None and not check:
        hit = fastpath.launch("fwd", False, ratio, coff, n_rows, (kv, score, ape, cu, cuc))
        if hit is not None:
            return hit[1][0]
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
    with torch.cuda.device(device), torch.cuda.stream(launch_stream(device, stream)):
        out = torch.empty((n_rows, d), dtype=torch.bfloat16, device=device)
    run_forward(kv, score, ape, cu, cuc, out, ratio=ratio, coff=coff, stream=stream,
                check=check)
    return out


def backward(kv, score, ape, cu, cuc, grad_out, *, ratio: int, coff: int, stream=None,
             deterministic: bool | None = None, check: bool = False
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dkv, dscore, dape) for ``grad_out`` (padding rows ignored), new on the launch stream.
    ``deterministic`` as in :func:`run_backward`; raises as :func:`run_forward`."""
    deterministic = _deterministic(deterministic)
    if stream is None and not check:
        hit = fastpath.launch("bwd", deterministic, ratio, coff, None,
                              (kv, score, ape, cu, cuc, grad_out), None, True)
        if hit is not None:
            return hit[1]
    check_support(kv, score, ape, cu, cuc, grad_out, ratio=ratio, coff=coff,
                  out_name="grad_out")
    require_cuda()
    device = check_launchable({"kv": kv, "grad_out": grad_out}, stream)
    alloc = torch.zeros_like if grad_out.shape[0] == 0 else torch.empty_like
    with torch.cuda.device(device), torch.cuda.stream(launch_stream(device, stream)):
        dkv = alloc(kv)
        dscore = alloc(score)
        dape = torch.empty_like(ape)  # zeroed by the launch, or by launch.run when N == 0
    run_backward(kv, score, ape, cu, cuc, grad_out, dkv, dscore, dape, ratio=ratio, coff=coff,
                 stream=stream, deterministic=deterministic, zero_dape=True, check=check)
    return dkv, dscore, dape
