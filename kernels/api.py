"""The compressor kernels' host API (docs/KERNELS.md 5): each call is one kernels/launch.call."""

from __future__ import annotations

import torch
from csagate.kernels.dispatch import build, kernel_for
from csagate.kernels.launch import call
from csagate.kernels.registry import COFFS, RATIOS, KernelKey
from csagate.kernels.validate import ALIGN_BYTES, check_support

__all__ = ["ALIGN_BYTES", "COFFS", "RATIOS", "backward", "build", "check_support", "forward",
           "kernel_for", "run_backward", "run_forward"]


def _deterministic(flag: bool | None) -> bool:
    return torch.are_deterministic_algorithms_enabled() if flag is None else bool(flag)


def run_forward(kv, score, ape, cu, cuc, out, *, ratio: int, coff: int, stream=None,
                check: bool = False) -> KernelKey | None:
    """Write ``out``; the KernelKey launched (None: N == 0). ValueError, RuntimeError (no GPU)."""
    return call("fwd", (kv, score, ape, cu, cuc), (out,), ratio=ratio, coff=coff, stream=stream,
                check=check)[0]


def run_backward(kv, score, ape, cu, cuc, grad_out, dkv, dscore, dape, *, ratio: int,
                 coff: int, rows_per_cta: int | None = None, stream=None,
                 deterministic: bool | None = None, zero_dape: bool = False,
                 check: bool = False) -> KernelKey | None:
    """Write dkv, dscore, add into dape (``zero_dape``: zero it first); None: torch's flag."""
    deterministic = _deterministic(deterministic)
    return call("bwd", (kv, score, ape, cu, cuc, grad_out), (dkv, dscore, dape), ratio=ratio,
                coff=coff, stream=stream, check=check, rows_per_cta=rows_per_cta,
                deterministic=deterministic, zero_dape=zero_dape)[0]


def forward(kv, score, ape, cu, cuc, *, ratio: int, coff: int, n_rows: int | None = None,
            stream=None, check: bool = False) -> torch.Tensor:
    """A new (N, d) bf16 forward; N = ``n_rows``, else cuc[-1] (not under graph capture)."""
    return call("fwd", (kv, score, ape, cu, cuc), None, ratio=ratio, coff=coff, n_rows=n_rows,
                stream=stream, check=check)[1][0]


def backward(kv, score, ape, cu, cuc, grad_out, *, ratio: int, coff: int, stream=None,
             deterministic: bool | None = None, check: bool = False
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """New (dkv, dscore, dape) for ``grad_out``; arguments as :func:`run_backward`."""
    return call("bwd", (kv, score, ape, cu, cuc, grad_out), None, ratio=ratio, coff=coff,
                stream=stream, check=check, deterministic=_deterministic(deterministic),
                zero_dape=True)[1]
