"""Eager reference of the CSA compressor (gated softmax KV pooling), forward and backward.

This mirrors the eager region the fused kernels replace (Megatron-LM ``Compressor._forward_thd``)
and is written to be audited in place. One function computes all three references; the
``precision`` switch picks the numerics:

* ``"fp32"``: the contract's comparator. kv and score are upcast to fp32, the softmax, the
  weighted sum and everything else run in fp32, and ``out`` is rounded to bf16 once.
  Backward by autograd with the bf16 kv/score and the fp32 ape as leaves, so dKV/dScore come
  back bf16 and dAPE fp32.
* ``"upstream"``: Megatron's eager numerics: the softmax weights are cast to bf16 before the
  multiply with the bf16 kv.
* ``"fp64"``: the oracle. kv, score and ape are upcast to fp64 (the leaves are the fp64
  copies, so the gradients stay fp64) and nothing is rounded.

Layout is THD (packed sequences). For output row ``b`` of segment ``s`` with block index
``i = b - cuc[s]``, the window starts at token ``tok0 = cu[s] + i*ratio``:

* coff=1: window position k in [0, ratio) reads token tok0+k, all d columns, APE row k.
* coff=2: the window is 2*ratio long. Positions [0, ratio) read the PREVIOUS block's tokens
  (tok0-ratio+k) in columns [0, d) with APE[k, :d]; positions [ratio, 2*ratio) read the own
  tokens in columns [d, 2d) with APE[k-ratio, d:]. A segment's first block (i == 0) has no
  previous block: that half is filled with kv 0 and score -inf (weight exactly 0).

Rows ``cuc[B] <= b < N`` are capacity padding rows (a static CUDA-graph capacity). The eager
gather computes them as a first block starting at token 0; the backward excludes them: their
windows are cut from the graph, so neither their grad_out nor a non-finite value only they
read (0 * inf = NaN) reaches a gradient (docs/CONTRACT.md section 7.1). Tokens beyond a
segment's last full block (tails) and tokens ``[cu[B], T)`` are never read.
``never_consumed_mask`` names every (token, column) slot no window reads: the gradients there
are exact zeros.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

PRECISIONS = ("fp32", "upstream", "fp64")


@dataclass(frozen=True)
class Grads:
    """Forward output and the three gradients of one reference evaluation."""

    out: torch.Tensor     # (N, d): bf16 (fp32, upstream) or fp64 (oracle)
    dkv: torch.Tensor     # (T, coff*d): bf16 or fp64
    dscore: torch.Tensor  # (T, coff*d): bf16 or fp64
    dape: torch.Tensor    # (ratio, coff*d): fp32 or fp64


def _row_geometry(cu: torch.Tensor, cuc: torch.Tensor, n_rows: int, ratio: int):
    """Per output row: first token of its window and whether it opens its segment.

    Padding rows (b >= cuc[B]) read tokens [0, ratio) and count as a first block, even when
    that crosses a segment boundary: that is what the eager gather does.
    """
    device = cu.device
    cu = cu.long()
    cuc = cuc.long()
    n_seq = cu.numel() - 1
    rows = torch.arange(n_rows, device=device)
    seg = torch.bucketize(rows, cuc[1:], right=True).clamp(max=n_seq - 1)
    valid = rows < cuc[-1]
    local = torch.where(valid, rows - cuc[seg], torch.zeros_like(rows))
    tok0 = torch.where(valid, cu[seg] + local * ratio, torch.zeros_like(rows))
    return tok0, local == 0, valid


def _region(kv, score, ape, cu, cuc, *, ratio: int, coff: int, n_rows: int, precision: str,
            cut_padding: bool = False):
    """The eager region: gather, add APE, overlap transform, softmax, weighted sum.

    ``cut_padding``: the capacity padding rows' windows keep their values but lose their path
    back to kv, score and ape (``where(valid, x, x.detach())``; where's backward selects, it
    does not multiply), so the backward excludes those rows. Every other value, shape and
    reduction is the same, so finite gradients are unchanged bitwise.
    """
    width = kv.shape[1]
    d = width // coff
    tok0, first_block, valid = _row_geometry(cu, cuc, n_rows, ratio)
    idx = tok0[:, None] + torch.arange(ratio, device=kv.device)  # (N, ratio) token ids

    if precision == "fp32":
        kv, score = kv.float(), score.float()
    elif precision == "fp64":
        kv, score, ape = kv.double(), score.double(), ape.double()

    kv_w = kv[idx]                   # (N, ratio, coff*d)
    s_w = score[idx] + ape[None]     # upstream: bf16 + fp32 promotes to fp32
    if cut_padding:
        keep = valid[:, None, None]
        kv_w = torch.where(keep, kv_w, kv_w.detach())
        s_w = torch.where(keep, s_w, s_w.detach())

    if coff == 2:
        # Own half: columns [d, 2d) of the own tokens. Previous half: columns [0, d) of the
        # previous row's tokens (roll by one row); a segment's first block gets kv 0, score -inf.
        prev_kv = torch.roll(kv_w[:, :, :d], shifts=1, dims=0)
        prev_s = torch.roll(s_w[:, :, :d], shifts=1, dims=0)
        hole = first_block[:, None, None]
        prev_kv = torch.where(hole, torch.zeros_like(prev_kv), prev_kv)
        prev_s = torch.where(hole, torch.full_like(prev_s, float("-inf")), prev_s)
        kv_w = torch.cat([prev_kv, kv_w[:, :, d:]], dim=1)   # (N, 2*ratio, d)
        s_w = torch.cat([prev_s, s_w[:, :, d:]], dim=1)

    if precision == "fp64":
        p = torch.softmax(s_w, dim=1)
        return (p * kv_w).sum(dim=1)
    p = torch.softmax(s_w, dim=1, dtype=torch.float32)
    if precision == "upstream":
        return (p.to(torch.bfloat16) * kv_w).sum(dim=1)
    return (p * kv_w).sum(dim=1).to(torch.bfloat16)


def _check(kv, score, ape, cu, cuc, ratio, coff, precision):
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if coff not in (1, 2):
        raise ValueError(f"coff must be 1 or 2, got {coff}")
    if kv.dim() != 2 or kv.shape[1] % coff or score.shape != kv.shape:
        raise ValueError("kv and score must be (T, coff*d) of the same shape")
    if tuple(ape.shape) != (ratio, kv.shape[1]):
        raise ValueError(f"ape must be (ratio, coff*d) = {(ratio, kv.shape[1])}")
    if cu.numel() != cuc.numel() or cu.numel() < 2:
        raise ValueError("cu_seqlens and cu_seqlens_comp must both have B + 1 >= 2 entries")


def forward(kv, score, ape, cu, cuc, *, ratio: int, coff: int, n_rows: int | None = None,
            precision: str = "fp32") -> torch.Tensor:
    """``out`` (N, d) of the eager region; N defaults to cuc[B] (no capacity padding)."""
    _check(kv, score, ape, cu, cuc, ratio, coff, precision)
    if n_rows is None:
        n_rows = int(cuc[-1])
    with torch.no_grad():
        return _region(kv, score, ape, cu, cuc, ratio=ratio, coff=coff, n_rows=n_rows,
                       precision=precision)


def backward(kv, score, ape, cu, cuc, grad_out, *, ratio: int, coff: int,
             precision: str = "fp32") -> Grads:
    """Forward and autograd backward; capacity padding rows are excluded from the backward.

    Their windows are cut from the graph (``_region(cut_padding=True)``) and their grad_out is
    zeroed, so no value of theirs, finite or not, reaches dKV, dScore or dAPE.
    """
    _check(kv, score, ape, cu, cuc, ratio, coff, precision)
    n_rows = grad_out.shape[0]
    if precision == "fp64":
        leaves = [kv.double(), score.double(), ape.double()]
    else:
        leaves = [kv, score, ape]
    leaves = [t.detach().clone().requires_grad_(True) for t in leaves]
    with torch.enable_grad():
        out = _region(*leaves, cu, cuc, ratio=ratio, coff=coff, n_rows=n_rows,
                      precision=precision, cut_padding=True)
        _, _, valid = _row_geometry(cu, cuc, n_rows, ratio)
        go = torch.where(valid[:, None], grad_out.to(out.dtype), torch.zeros((), dtype=out.dtype,
                                                                               device=out.device))
        if out.numel():
            out.backward(go)
    dkv, dscore, dape = (t.grad if t.grad is not None else torch.zeros_like(t) for t in leaves)
    return Grads(out.detach(), dkv, dscore, dape)


def never_consumed_mask(cu, *, ratio: int, coff: int, d: int, n_tokens: int) -> torch.Tensor:
    """(T, coff*d) bool: the slots no window reads, whose gradients are exact zeros.

    Per segment with nb = len // ratio full blocks:
    (a) tail tokens [nb*ratio, len), all columns;
    (b) coff=2: the last block's own tokens, columns [0, d) (no next block reads them);
    (c) nb == 0 (shorter than ratio, or empty): the whole segment;
    (d) token-capacity padding [cu[B], T): all columns.
    """
    bounds = [int(x) for x in cu.tolist()]
    mask = torch.zeros(n_tokens, coff * d, dtype=torch.bool)
    for start, end in zip(bounds[:-1], bounds[1:]):
        nb = (end - start) // ratio
        mask[start + nb * ratio:end] = True
        if coff == 2 and nb > 0:
            mask[start + (nb - 1) * ratio:start + nb * ratio, :d] = True
    mask[bounds[-1]:] = True
    return mask.to(cu.device)
