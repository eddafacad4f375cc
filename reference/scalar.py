"""A second derivation of the fp64 oracle: one output row and column at a time, in Python
floats (IEEE binary64), from docs/CONTRACT.md section 2 alone.

The fp64 oracle (``compressor.backward(..., precision="fp64")``) is the fp32 reference with a
dtype switch, so a mistake in its gather, its slot geometry or an edge rule would be shared by
both and invisible to G3. This module shares none of that code. It walks the segments named
by ``cu``/``cuc``, names the token, column half and APE row of every window position from the
contract's table (section 2.1), and computes the softmax, the weighted sum and the gradients
of each (row, column) with scalar arithmetic (section 2.2), the capacity padding rows and the
slots no window reads as section 2.3 says. :func:`agreement` compares it with the oracle; the
drift check and the self-tests (``csagate.gates.selftest``) run it on small packs.

Finite inputs only: the oracle's NaN and infinity rules are the reference's own (its strict
serial max), which this derivation does not restate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# The oracle and this derivation round differently (fp64 sums in other orders, exp from two
# libraries): they agree within a few fp64 ulps of the largest term. A fault in either (a
# wrong slot, APE row or edge rule) moves some value by the size of a term.
AGREE_RTOL = 1e-12


def _rows_of(cu: list[int], cuc: list[int], n_rows: int, ratio: int):
    """(row, block index in its segment, first token of its block, real row or padding) per
    output row, in row order; a capacity padding row (b >= cuc[B]) is a first block at token
    0 (section 2.3)."""
    for s in range(len(cu) - 1):
        for i in range(cuc[s + 1] - cuc[s]):
            yield cuc[s] + i, i, cu[s] + i * ratio, True
    for b in range(cuc[-1], n_rows):
        yield b, 0, 0, False


def _positions(block: int, tok0: int, ratio: int, coff: int, d: int):
    """The valid window positions of a row: (token, column offset, APE row) each, in window
    order (section 2.1's table; the previous half of a first block is not valid)."""
    found = []
    if coff == 2 and block > 0:
        found += [(tok0 - ratio + k, 0, k) for k in range(ratio)]
    offset = d if coff == 2 else 0
    found += [(tok0 + k, offset, k) for k in range(ratio)]
    return found


@dataclass(frozen=True)
class Derived:
    out: list[list[float]]      # (N, d)
    dkv: list[list[float]]      # (T, coff*d)
    dscore: list[list[float]]   # (T, coff*d)
    dape: list[list[float]]     # (ratio, coff*d)


def derive(kv, score, ape, cu, cuc, grad_out, *, ratio: int, coff: int) -> Derived:
    """Forward and backward of the op in fp64 scalars; tensors in, nested lists out."""
    kv = kv.double().cpu().tolist()
    score = score.double().cpu().tolist()
    ape = ape.double().cpu().tolist()
    go = grad_out.double().cpu().tolist()
    cu, cuc = [int(x) for x in cu.tolist()], [int(x) for x in cuc.tolist()]
    n_rows, d = len(go), len(ape[0]) // coff
    width = coff * d
    out = [[0.0] * d for _ in range(n_rows)]
    dkv = [[0.0] * width for _ in range(len(kv))]
    dscore = [[0.0] * width for _ in range(len(kv))]
    dape = [[0.0] * width for _ in range(ratio)]
    for b, block, tok0, real in _rows_of(cu, cuc, n_rows, ratio):
        places = _positions(block, tok0, ratio, coff, d)
        for j in range(d):
            cols = [off + j for _, off, _ in places]
            s = [score[t][c] + ape[a][c] for (t, _, a), c in zip(places, cols)]
            u = [kv[t][c] for (t, _, _), c in zip(places, cols)]
            top = max(s)
            e = [math.exp(x - top) for x in s]
            den = math.fsum(e)
            p = [x / den for x in e]
            out[b][j] = math.fsum(pk * uk for pk, uk in zip(p, u))
            if not real:        # padding rows take no part in any gradient
                continue
            g = go[b][j]
            dot = math.fsum(g * uk * pk for pk, uk in zip(p, u))
            for (t, _, a), c, pk, uk in zip(places, cols, p, u):
                ds = pk * (g * uk - dot)
                dkv[t][c] = g * pk
                dscore[t][c] = ds
                dape[a][c] += ds
    return Derived(out, dkv, dscore, dape)


@dataclass(frozen=True)
class Agreement:
    """The largest |oracle - derived| per output, against ``AGREE_RTOL`` of its scale."""

    pack: str
    diffs: dict[str, float]
    scales: dict[str, float]
    ok: bool

    def summary(self) -> str:
        worst = max(self.diffs, key=lambda n: self.diffs[n] / self.scales[n])
        state = "agree" if self.ok else "DISAGREE"
        return (f"{self.pack}: the fp64 oracle and its scalar derivation {state}, worst "
                f"{worst} |diff| {self.diffs[worst]:.3e} (scale {self.scales[worst]:.3e}, "
                f"rtol {AGREE_RTOL:g})")


def agreement(oracle, derived: Derived, pack: str = "") -> Agreement:
    """``oracle``: the reference's fp64 ``Grads``. Each output within ``AGREE_RTOL`` times the
    largest magnitude of that output (at least 1)."""
    diffs, scales = {}, {}
    for name in ("out", "dkv", "dscore", "dape"):
        mine = getattr(derived, name)
        theirs = getattr(oracle, name).double().cpu().tolist()
        if len(mine) != len(theirs) or any(len(a) != len(b) for a, b in zip(mine, theirs)):
            diffs[name], scales[name] = math.inf, 1.0
            continue
        scale = max([1.0] + [abs(x) for row in mine for x in row])
        diff = max([0.0] + [abs(x - y) if not (math.isnan(x) and math.isnan(y)) else 0.0
                            for a, b in zip(mine, theirs) for x, y in zip(a, b)])
        diffs[name], scales[name] = (math.inf if math.isnan(diff) else diff), scale
    ok = all(diffs[n] <= AGREE_RTOL * scales[n] for n in diffs)
    return Agreement(pack, diffs, scales, ok)


def check_oracle(ratio: int, coff: int, d: int, lens, pad_rows: int = 0, pad_tokens: int = 0,
                 *, device="cpu", seed: int = 101) -> Agreement:
    """The fp64 oracle on ``device`` against this derivation, on one seeded pack."""
    from csagate.reference.compressor import backward
    from csagate.reference.inputs import make_grad_out, make_pack

    pack = make_pack(lens, ratio=ratio, coff=coff, d=d, seed=seed, pad_rows=pad_rows,
                     pad_tokens=pad_tokens, device=device)
    go = make_grad_out(pack.n_rows, d, seed=seed + 1, device=device)
    oracle = backward(*pack.inputs(), go, ratio=ratio, coff=coff, precision="fp64")
    name = (f"r{ratio} c{coff}d{d} {'+'.join(map(str, lens))}"
            + (f"+pad{pad_rows}r{pad_tokens}t" if pad_rows or pad_tokens else ""))
    return agreement(oracle, derive(*pack.inputs(), go, ratio=ratio, coff=coff), name)
