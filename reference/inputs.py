"""Reproducible inputs in the distribution the contract's tolerances are calibrated on.

Everything is drawn on a CPU generator in fp32, then cast, then moved to the device, so a
case is bit-for-bit the same on every machine:
kv ~ N(0, 1) -> bf16, score ~ N(0, 1.5^2) -> bf16, ape ~ N(0, 0.25^2) fp32,
grad_out ~ N(0, 1) -> bf16. ``scale`` multiplies kv after the bf16 cast (an exact exponent
shift for powers of two). ``peaked`` multiplies a pack's scores by PEAKED_SCORE_SCALE the same
way: peaked windows, where some e_k = exp(s_k - max) fall below 2^-64, to subnormals and to 0.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from csagate.reference.seeds import GRAD_SEED, INPUT_SEED, PAD_TOKEN_SEED


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


PEAKED_SCORE_SCALE = 16.0  # score std 24: subnormal and zero e_k at every small ratio


def peaked(pack: Pack) -> Pack:
    """``pack`` with its scores times PEAKED_SCORE_SCALE (exact: a power of two, far below
    bf16's range)."""
    return replace(pack, score=pack.score * PEAKED_SCORE_SCALE)


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


# --- non-finite placements of the hardening cases (docs/CONTRACT.md section 5.3) ------------------

Slot = tuple[str, int, int, float]   # (tensor "kv"/"score", token, column, value)


def _starts(lens) -> list[int]:
    starts, t = [], 0
    for n in lens:
        starts.append(t)
        t += n
    return starts


def partial_overflow_slots(lens, *, ratio: int, coff: int, d: int) -> tuple[Slot, ...]:
    """Where the partial-overflow cases put +inf scores and one NaN kv value.

    ``late = ratio - 1 - ratio // 8`` is a window position outside chunk 0 however the kernel
    splits the window (ratio 128: 111, chunk 3 of 4 / 6 of 8 / 13 of 16 of a half), so a merge
    that drops a NaN chunk partial shows. Segments 0, 1, 2 of ``lens`` (>= 2, 2, 1 blocks):

    * W1, segment 0, block 1: +inf score at the own half's ``late`` position, column 3.
    * W2, segment 1, block ``nb // 2``, column d-1: coff=2, +inf in BOTH halves of the window
      (the previous block's token at ``late``, columns [0, d); the own token at ``late``);
      coff=1, +inf at ``late`` and at ``ratio // 2`` of the one window.
    * W3, segment 2, last block: NaN kv at the own half's ``late`` position, column d // 2.

    Each value is read by exactly one (row, column) window: out is NaN at three elements,
    dKV/dScore on those windows' slots, dAPE on their columns; everything else is finite.
    """
    lens = tuple(int(n) for n in lens)
    nbs = [n // ratio for n in lens]
    if len(lens) < 3 or nbs[0] < 2 or nbs[1] < 2 or nbs[2] < 1:
        raise ValueError(f"partial overflow needs segments 0, 1, 2 with >= 2, 2, 1 blocks: {lens}")
    s0, s1, s2 = _starts(lens)[:3]
    late, own, inf = ratio - 1 - ratio // 8, d * (coff - 1), float("inf")
    i = nbs[1] // 2
    slots: list[Slot] = [("score", s0 + ratio + late, own + min(3, d - 1), inf)]
    if coff == 2:
        slots += [("score", s1 + (i - 1) * ratio + late, d - 1, inf),
                  ("score", s1 + i * ratio + late, own + d - 1, inf)]
    else:
        slots += [("score", s1 + i * ratio + late, d - 1, inf),
                  ("score", s1 + i * ratio + ratio // 2, d - 1, inf)]
    slots.append(("kv", s2 + (nbs[2] - 1) * ratio + late, own + d // 2, float("nan")))
    return tuple(slots)


def pad_nonfinite_slots(lens, *, ratio: int, coff: int, d: int) -> tuple[Slot, ...]:
    """Non-finite values only the capacity padding rows read: segment 0 is shorter than ratio,
    so its tokens belong to no block, and padding rows (first blocks at token 0) read them in
    the own-half columns. +inf score, NaN kv, -inf kv, NaN score, spread over the segment."""
    n0 = int(lens[0])
    if not 4 <= n0 < ratio:
        raise ValueError(f"segment 0 must hold 4..ratio-1 tokens, got {n0}")
    own = d * (coff - 1)
    toks = (0, n0 // 3, 2 * n0 // 3, n0 - 1)
    values = (("score", float("inf")), ("kv", float("nan")), ("kv", float("-inf")),
              ("score", float("nan")))
    return tuple((name, t, own + k % d, v) for k, (t, (name, v)) in enumerate(zip(toks, values)))


def with_values(pack: Pack, slots) -> Pack:
    """A copy of ``pack`` with ``slots`` written into kv/score (bf16 holds inf and NaN)."""
    kv, score = pack.kv.clone(), pack.score.clone()
    for name, token, column, value in slots:
        (kv if name == "kv" else score)[token, column] = value
    return Pack(kv, score, pack.ape, pack.cu, pack.cuc, pack.n_rows, pack.ratio, pack.coff,
                pack.d, pack.lens)
