"""Host API of the compressor kernels (docs/KERNELS.md section 5): each call probes the fast path
once, else takes the full path once (kernels/launch.py). Tensors: docs/CONTRACT.md section 1.
Only forward(n_rows=None) and check=True (reads cu/cuc) sync."""

from __future__ import annotations

import torch
from csagate.kernels.dispatch import build, kernel_for
from csagate.kernels.launch import fast, full
from csagate.kernels.registry import COFFS, RATIOS, KernelKey
from csagate.kernels.validate import ALIGN_BYTES, check_support

__all__ = ["ALIGN_BYTES", "COFFS", "RATIOS", "backward", "build", "check_support", "forward",
           "kernel_for", "run_backward", "run_forward"]


def _deterministic(flag: bool | None) -> bool:
    return torch.are_deterministic_algorithms_enabled() if flag is None else bool(flag)


def run_forward(kv, score, ape, cu, cuc, out, *, ratio: int, coff: int, stream=None,
                check: bool = False) -> KernelKey | None:
    """Write the forward into ``out`` (every row, padding too); returns the KernelKey launched,
    None when N == 0. Raises ValueError on bad input, RuntimeError with no usable GPU."""
    inputs = (kv, score, ape, cu, cuc)
    hit = None if stream is not None or check else fast("fwd", False, ratio, coff, None,
                                                        inputs, (out,))
    if hit is None:
        hit = full("fwd", inputs, (out,), ratio=ratio, coff=coff, stream=stream, check=check)
    return hit[0]


def run_backward(kv, score, ape, cu, cuc, grad_out, dkv, dscore, dape, *, ratio: int,
                 coff: int, rows_per_cta: int | None = None, stream=None,
                 deterministic: bool | None = None, zero_dape: bool = False,
                 check: bool = False) -> KernelKey | None:
    """Write dkv, dscore and add into dape (zeroed first with ``zero_dape``); ``deterministic``
    (None: torch's flag): dAPE from per-CTA partials in a fixed order. As :func:`run_forward`."""
    deterministic = _deterministic(deterministic)
    inputs, outputs = (kv, score, ape, cu, cuc, grad_out), (dkv, dscore, dape)
    hit = None
    if stream is None and rows_per_cta is None and not check:
        hit = fast("bwd", deterministic, ratio, coff, None, inputs, outputs, zero_dape)
    if hit is None:
        hit = full("bwd", inputs, outputs, ratio=ratio, coff=coff, stream=stream, check=check,
                   rows_per_cta=rows_per_cta, deterministic=deterministic, zero_dape=zero_dape)
    return hit[0]


def forward(kv, score, ape, cu, cuc, *, ratio: int, coff: int, n_rows: int | None = None,
            stream=None, check: bool = False) -> torch.Tensor:
    """A new (N, d) bf16 forward; N = ``n_rows``, else cuc[-1] (not under graph capture)."""
    inputs = (kv, score, ape, cu, cuc)
    hit = None
    if stream is None and n_rows is not None and not check:
        hit = fast("fwd", False, ratio, coff, n_rows, inputs)
    if hit is None:
        hit = full("fwd", inputs, None, ratio=ratio, coff=coff, n_rows=n_rows, stream=stream,
                   check=check)
    return hit[1][0]


def backward(kv, score, ape, cu, cuc, grad_out, *, ratio: int, coff: int, stream=None,
             deterministic: bool | None = None, check: bool = False
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """New (dkv, dscore, dape) for ``grad_out``; arguments as :func:`run_backward`."""
    deterministic = _deterministic(deterministic)
    inputs = (kv, score, ape, cu, cuc, grad_out)
    hit = None
    if stream is None and not check:
        hit = fast("bwd", deterministic, ratio, coff, None, inputs, None, True)
    if hit is None:
        hit = full("bwd", inputs, None, ratio=ratio, coff=coff, stream=stream, check=check,
                   deterministic=deterministic, zero_dape=True)
    return hit[1]
