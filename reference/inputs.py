"""Reproducible inputs in the distribution the contract's tolerances are calibrated on.

Everything is drawn on a CPU generator in fp32, then cast, then moved to the device, so a
case is bit-for-bit the same on every machine:
kv ~ N(0, 1) -> bf16, score ~ N(0, 1.5^2) -> bf16, ape ~ N(0, 0.25^2) fp32,
grad_out ~ N(0, 1) -> bf16. ``scale`` multiplies kv after the bf16 cast (an exact exponent
shift for powers of two).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

INPUT_SEED = 1234
GRAD_SEED = 7
PAD_GRAD_SEED = 11
PAD_TOKEN_SEED = 13


@dataclass(frozen=True)
class Pack:
    """One THD pack: inputs plus the geometry they were made from."""

    kv: torch.Tensor      # (T, coff*d) bf16
    score: torch.Tensor   # (T, coff*d) bf16
    ape: torch.Tensor     # (ratio, coff*d) fp32
    cu: torch.Tensor      # (B+1,) int32 token offsets
    cuc: torch.Tensor     # (B+1,) int32 row offsets
    n_rows: int           # N = cuc[B] + capacity padding rows
    ratio: int
    coff: int
    d: int
    lens: tuple[int, ...]

    def inputs(self):
        return self.kv, self.score, self.ape, self.cu, self.cuc

    @property
    def n_tokens(self) -> int:
        return self.kv.shape[0]

    @property
    def n_valid_rows(self) -> int:
        return sum(n // self.ratio for n in self.lens)


def offsets(lens, ratio: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cu_seqlens and cu_seqlens_comp (int32, with the leading 0)."""
    cu = torch.tensor([0, *lens], dtype=torch.int64).cumsum(0).to(torch.int32)
    cuc = torch.tensor([0, *(n // ratio for n in lens)], dtype=torch.int64).cumsum(0)
    return cu, cuc.to(torch.int32)


def _normal(gen: torch.Generator, shape, std: float) -> torch.Tensor:
    return torch.randn(*shape, generator=gen, dtype=torch.float32) * std


def make_pack(lens, *, ratio: int, coff: int, d: int, seed: int = INPUT_SEED,
              pad_rows: int = 0, pad_tokens: int = 0, scale: float = 1.0,
              pad_seed: int = PAD_TOKEN_SEED, device="cpu") -> Pack:
    """A pack of segments ``lens`` with ``pad_rows`` capacity rows and ``pad_tokens`` rows."""
    lens = tuple(int(n) for n in lens)
    if any(n < 0 for n in lens) or not lens:
        raise ValueError(f"segment lengths must be >= 0 and at least one: {lens}")
    width = coff * d
    n_true = sum(lens)
    gen = torch.Generator().manual_seed(seed)
    kv = _normal(gen, (n_true, width), 1.0).to(torch.bfloat16)
    score = _normal(gen, (n_true, width), 1.5).to(torch.bfloat16)
    ape = _normal(gen, (ratio, width), 0.25)
    if pad_tokens:
        pgen = torch.Generator().manual_seed(pad_seed)
        kv = torch.cat([kv, _normal(pgen, (pad_tokens, width), 1.0).to(torch.bfloat16)])
        score = torch.cat([score, _normal(pgen, (pad_tokens, width), 1.5).to(torch.bfloat16)])
    if scale != 1.0:
        kv = kv * scale
    cu, cuc = offsets(lens, ratio)
    n_rows = int(cuc[-1]) + pad_rows
    return Pack(kv.to(device), score.to(device), ape.to(device), cu.to(device), cuc.to(device),
                n_rows, ratio, coff, d, lens)


def make_grad_out(n_rows: int, d: int, *, seed: int = GRAD_SEED, scale: float = 1.0,
                  device="cpu") -> torch.Tensor:
    """grad_out (N, d) bf16, padding rows included (the references ignore them)."""
    gen = torch.Generator().manual_seed(seed)
    go = _normal(gen, (n_rows, d), 1.0).to(torch.bfloat16)
    if scale != 1.0:
        go = go * scale
    return go.to(device)


def overflow_pack(lens=(128,), *, ratio: int = 128, coff: int = 1, d: int = 128,
                  device="cpu") -> tuple[Pack, torch.Tensor]:
    """kv = 1, score = bf16 max, ape = fp32 max, grad_out = 1.

    fp32 ``score + ape`` overflows to +Inf, so every fp32 output is NaN (inf - inf in the
    softmax); in fp64 the window is uniform and the oracle's out is exactly 1.0.
    """
    lens = tuple(int(n) for n in lens)
    width = coff * d
    n_true = sum(lens)
    kv = torch.ones(n_true, width, dtype=torch.bfloat16)
    score = torch.full((n_true, width), torch.finfo(torch.bfloat16).max, dtype=torch.bfloat16)
    ape = torch.full((ratio, width), torch.finfo(torch.float32).max, dtype=torch.float32)
    cu, cuc = offsets(lens, ratio)
    pack = Pack(kv.to(device), score.to(device), ape.to(device), cu.to(device), cuc.to(device),
                int(cuc[-1]), ratio, coff, d, lens)
    go = torch.ones(pack.n_rows, d, dtype=torch.bfloat16, device=device)
    return pack, go
