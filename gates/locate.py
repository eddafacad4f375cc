"""Where a failing gate's errors sit: segments, rows, column blocks, the first offending element.

:func:`locate_failures` reads the failed G2, G3 and zeros results of one case and, per failed
check, the positions that failed: G2, the elements differing from the fp32 eager reference
(for a NaN mask rule, where the NaN masks differ); G3, the elements farther from the fp64
oracle than the gate's bound; zeros, the never-consumed slots that are not exactly zero. It
records how many there are, which segments and rows hold them (output rows for ``out``, tokens
for dKV/dScore, window positions for dAPE), how they spread over column blocks, the first one
with its fused, eager and oracle values, and a small grid of the largest error per (row bin,
column block) (what ``csagate run --report`` draws). Plain numbers only: nothing here prints.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from csagate.gates.verdict import FAIL, GateResult
from csagate.reference import never_consumed_mask

COLUMN_BLOCKS = 16     # a tensor's columns are cut into at most this many blocks
ROW_BINS = 64          # and its rows into at most this many bins, for the grid
TOP_SEGMENTS = 8       # the segments reported, most offending first
ROW_AXIS = {"out": "output row", "dkv": "token", "dscore": "token", "dape": "window position"}


def base_tensor(tensor: str) -> str:
    """``dkv[token pad]`` -> ``dkv``."""
    return tensor.split("[", 1)[0]


def _offending(g: GateResult, fused, eager, oracle, pack) -> torch.Tensor | None:
    name = base_tensor(g.tensor)
    f, e = fused.double(), eager.double()
    if g.gate == "G2" and ("NaN mask" in g.tensor or "n_mismatch" in g.numbers):
        return torch.isnan(f) != torch.isnan(e)
    if g.gate == "G2":
        return ~((f == e) | (torch.isnan(f) & torch.isnan(e)))
    if g.gate == "G3":
        err = (f - oracle.double()).abs()
        return ~(err <= float(g.numbers.get("bound", 0.0)))       # NaN counts
    if g.gate == "zeros" and name in ("dkv", "dscore"):
        mask = never_consumed_mask(pack.cu, ratio=pack.ratio, coff=pack.coff, d=pack.d,
                                   n_tokens=pack.n_tokens)
        if g.tensor.endswith("[token pad]"):
            mask = torch.zeros_like(mask)
            mask[int(pack.cu[-1]):] = True
        return mask & ~(fused == 0)
    return None


def _segments(name: str, rows: torch.Tensor, pack) -> torch.Tensor | None:
    """The segment of each row (-1: padding), or None for dAPE."""
    if name == "dape":
        return None
    bounds = (pack.cuc if name == "out" else pack.cu).long().to(rows.device)
    seg = torch.searchsorted(bounds[1:], rows, right=True)
    return torch.where(rows < bounds[-1], seg, torch.full_like(seg, -1))


def _value(t: torch.Tensor, index: tuple[int, int]) -> float:
    return float(t[index])


def _grid(bad: torch.Tensor, err: torch.Tensor, block: int) -> dict[str, Any]:
    n_rows, width = bad.shape
    n_bins = max(1, min(ROW_BINS, n_rows))
    n_blocks = -(-width // block)
    rows = torch.arange(n_rows, device=bad.device)[:, None].expand_as(bad)
    cols = torch.arange(width, device=bad.device)[None].expand_as(bad)
    cell = ((rows * n_bins) // max(n_rows, 1)) * n_blocks + cols // block
    cell, val = cell[bad], err[bad]
    count = torch.zeros(n_bins * n_blocks, dtype=torch.long, device=bad.device)
    count.scatter_add_(0, cell, torch.ones_like(cell))
    worst = torch.zeros(n_bins * n_blocks, dtype=torch.float64, device=bad.device)
    worst.scatter_reduce_(0, cell, val.nan_to_num(nan=float("inf")), reduce="amax")
    edges = [(i * n_rows) // n_bins for i in range(n_bins + 1)]
    return {"row_edges": edges, "col_block": block,
            "count": count.view(n_bins, n_blocks).tolist(),
            "max_err": worst.view(n_bins, n_blocks).tolist()}


def locate(g: GateResult, fused: torch.Tensor, eager: torch.Tensor, oracle: torch.Tensor,
           pack) -> dict[str, Any] | None:
    """Where ``g``'s failing elements sit (None if its positions cannot be named)."""
    name = base_tensor(g.tensor)
    bad = _offending(g, fused, eager, oracle, pack)
    if bad is None or fused.dim() != 2 or not bool(bad.any()):
        return None
    bad = bad.cpu()
    f, e, o = (t.double().cpu() for t in (fused, eager, oracle))
    err = (f - (o if g.gate == "G3" else e)).abs()
    if g.gate == "zeros":
        err = f.abs()
    width = bad.shape[1]
    block = max(1, -(-width // COLUMN_BLOCKS))
    hit_rows, hit_cols = bad.nonzero(as_tuple=True)
    row_list = torch.unique(hit_rows)
    seg = _segments(name, hit_rows, pack)
    segments = None
    if seg is not None:
        ids, counts = torch.unique(seg, return_counts=True)
        order = torch.argsort(counts, descending=True)[:TOP_SEGMENTS]
        segments = [["pad" if int(ids[i]) < 0 else int(ids[i]), int(counts[i])]
                    for i in order]
    blocks = torch.bincount(hit_cols // block, minlength=-(-width // block)).tolist()
    first = (int(hit_rows[0]), int(hit_cols[0]))
    return {
        "tensor": g.tensor, "gate": g.gate, "n_offending": int(bad.sum()),
        "numel": bad.numel(), "row_axis": ROW_AXIS.get(name, "row"),
        "rows": {"first": int(row_list[0]), "last": int(row_list[-1]), "n": len(row_list),
                 "of": bad.shape[0]},
        "segments": segments,
        "column_blocks": {"width": block, "counts": blocks},
        "first": {"index": list(first),
                  "segment": None if seg is None else
                  ("pad" if int(seg[0]) < 0 else int(seg[0])),
                  "fused": _value(f, first), "eager": _value(e, first),
                  "oracle": _value(o, first)},
        "grid": _grid(bad, err, block),
        "segment_bounds": None if name == "dape" else
        [int(x) for x in (pack.cuc if name == "out" else pack.cu).tolist()],
    }


def locate_failures(gates: Sequence[GateResult], fused: Mapping[str, torch.Tensor],
                    eager: Mapping[str, torch.Tensor], oracle: Mapping[str, torch.Tensor],
                    pack) -> list[dict[str, Any]]:
    """One location per failed G2, G3 or zeros check (a tensor that fails two gates, say the
    zeros of its tails and G2 where windows read it, is located for each)."""
    found = []
    for g in gates:
        name = base_tensor(g.tensor)
        if g.status != FAIL or g.gate not in ("G2", "G3", "zeros") or name not in fused:
            continue
        where = locate(g, fused[name], eager[name], oracle[name], pack)
        if where is not None:
            found.append(where)
    return found
