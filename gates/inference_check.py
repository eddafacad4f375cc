"""Do decode and prefill give the same rows? (:func:`decode_agreement`)

Prefill is the fp32 reference's forward over the whole pack (docs/CONTRACT.md section 3.1);
decode is :class:`~csagate.gates.inference_impls.Decode`, one token at a time through its
running state. The claim, by formulation:

* ``Decode(order="serial")`` (the ``decode`` built-in) and an fp32 state: **bitwise**. The
  state holds exactly the values the reference's gather builds (``fp32(kv)`` and
  ``fp32(score) + ape``, the same one fp32 add), and a row is emitted with the reference's
  expression in its order (strict serial max, ``exp``, serial sum, IEEE division, serial
  weighted sum). Both run on the same device, so the one device dependence of section 3.1
  (``exp``) is shared. Any differing row is a state bug: a dropped overlap half, a state
  not reset at a segment start, a token in the wrong slot.
* ``Decode(order="torch")`` (torch's softmax and sum over the window, DeepSeek's emission):
  another summation order, so **within the forward contract** of the ratio (the small ratios:
  one bf16 step at the window's calibrated rate; ratio 128: G2's tolerance), not bitwise.
* ``bf16-state``: the state itself is rounded; this check reports how far it is, and the
  forward contract may fail (a finding, not a bug of the check).

Plain records; nothing here prints.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from csagate.gates.contracts import CONTRACTS, small_contract
from csagate.gates.inference_impls import Decode
from csagate.reference import forward as ref_forward


@dataclass(frozen=True)
class RowDiff:
    """One output row where decode and prefill differ."""

    row: int
    segment: int            # -1: a capacity padding row
    block: int              # the block index within its segment (0 for padding rows)
    n_cols: int             # columns whose bits differ
    max_abs: float          # max |decode - prefill| over the row (NaN in one only: inf)
    max_steps: int          # the most bf16 steps a column is off


@dataclass(frozen=True)
class Agreement:
    rows: int               # rows compared (capacity padding rows included)
    bitwise: bool           # every row bit for bit (bit patterns, NaN == NaN)
    n_rows_differ: int
    max_abs: float
    max_steps: int
    within_contract: bool   # the ratio's forward rule (G2 of out) holds
    contract: str           # that rule's one-line summary
    differing: tuple[RowDiff, ...]   # the first ``limit`` differing rows, in row order


def _row_place(cu: torch.Tensor, cuc: torch.Tensor, row: int) -> tuple[int, int]:
    rows = [int(x) for x in cuc.tolist()]
    if row >= rows[-1]:
        return -1, 0
    seg = max(s for s in range(len(rows) - 1) if rows[s] <= row and rows[s + 1] > row)
    return seg, row - rows[seg]


def _bits(t: torch.Tensor) -> torch.Tensor:
    """int16 bit patterns with every NaN one pattern."""
    bits = t.contiguous().view(torch.int16)
    return torch.where(torch.isnan(t), torch.full_like(bits, 0x7FC0), bits)


def decode_agreement(kv, score, ape, cu, cuc, n_rows: int, *, ratio: int, coff: int,
                     decode=None, limit: int = 20) -> Agreement:
    """``decode`` (default ``Decode()``) against the prefill reference on one pack: which rows
    differ, by how much, and whether the ratio's forward contract holds."""
    from csagate.gates.comparators import bf16_ordinal

    decode = Decode() if decode is None else decode
    with torch.no_grad():
        got = decode.forward(kv, score, ape, cu, cuc, n_rows, ratio=ratio, coff=coff)
        ref = ref_forward(kv, score, ape, cu, cuc, ratio=ratio, coff=coff, n_rows=n_rows)
    differs = _bits(got) != _bits(ref)
    nan_one = torch.isnan(got.float()) ^ torch.isnan(ref.float())
    diff = torch.where(differs, (got.float() - ref.float()).abs(),
                       torch.zeros((), device=got.device))
    diff = torch.where(nan_one, torch.full((), float("inf"), device=got.device), diff)
    steps = (bf16_ordinal(got) - bf16_ordinal(ref)).abs()
    steps = torch.where(differs, steps, torch.zeros_like(steps))
    bad_rows = differs.any(dim=1).nonzero().flatten().tolist()
    found = []
    for row in bad_rows[:limit]:
        seg, block = _row_place(cu, cuc, row)
        found.append(RowDiff(row, seg, block, int(differs[row].sum()),
                             float(diff[row].max()), int(steps[row].max())))
    rule_of = CONTRACTS.get(ratio) or small_contract(ratio, (), ())
    check = rule_of.rule("out").apply(got, ref, window=coff * ratio)
    return Agreement(rows=n_rows, bitwise=not bad_rows, n_rows_differ=len(bad_rows),
                     max_abs=float(diff.max()) if diff.numel() else 0.0,
                     max_steps=int(steps.max()) if steps.numel() else 0,
                     within_contract=bool(check.ok), contract=check.summary(),
                     differing=tuple(found))
