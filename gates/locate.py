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

from collections.abc import Callable, Iterable, Mapping, Sequence
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


def _offending(g: GateResult, fused, eager, oracle, pack, start: int) -> torch.Tensor | None:
    """Which elements of rows [start, start + len) of ``g``'s tensor failed it."""
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
        tokens = (start, start + fused.shape[0])
        if g.tensor.endswith("[token pad]"):
            mask = torch.zeros(fused.shape, dtype=torch.bool, device=fused.device)
            mask[max(0, int(pack.cu[-1]) - start):] = True
        else:
            mask = never_consumed_mask(pack.cu, ratio=pack.ratio, coff=pack.coff, d=pack.d,
                                       n_tokens=pack.n_tokens, tokens=tokens)
        return mask & ~(fused == 0)
    return None


def _segments(name: str, rows: torch.Tensor, pack) -> torch.Tensor | None:
    """The segment of each row (-1: padding), or None for dAPE."""
    if name == "dape":
        return None
    bounds = (pack.cuc if name == "out" else pack.cu).long().to(rows.device)
    seg = torch.searchsorted(bounds[1:], rows, right=True)
    return torch.where(rows < bounds[-1], seg, torch.full_like(seg, -1))


class _Found:
    """The failing elements of one gate's tensor, gathered a block of rows at a time (in
    order): every number is a count, a first or last, or a largest, so the blocks' add up to
    the whole tensor's."""

    def __init__(self, g: GateResult, shape, pack):
        self.g, self.pack, self.name = g, pack, base_tensor(g.tensor)
        self.n_rows, self.width = shape
        self.block = max(1, -(-self.width // COLUMN_BLOCKS))
        self.n_bins = max(1, min(ROW_BINS, self.n_rows))
        self.n_blocks = -(-self.width // self.block)
        self.n_offending = self.numel = self.rows_hit = 0
        self.rows: list[int] = []          # the first and the last row hit
        self.segments: dict[int, int] = {}
        self.columns = torch.zeros(self.n_blocks, dtype=torch.long)
        self.first: dict[str, Any] | None = None
        self.count = torch.zeros(self.n_bins * self.n_blocks, dtype=torch.long)
        self.worst = torch.zeros(self.n_bins * self.n_blocks, dtype=torch.float64)
        self.located = True

    def add(self, start: int, fused, eager, oracle) -> None:
        """Rows [start, start + len) of the implementation's tensor and the references'."""
        bad = _offending(self.g, fused, eager, oracle, self.pack, start)
        if bad is None or fused.dim() != 2:
            self.located = False
            return
        self.numel += bad.numel()
        if not bool(bad.any()):
            return
        bad = bad.cpu()
        f, e, o = (t.double().cpu() for t in (fused, eager, oracle))
        err = f.abs() if self.g.gate == "zeros" else \
            (f - (o if self.g.gate == "G3" else e)).abs()
        hit_rows, hit_cols = bad.nonzero(as_tuple=True)
        row_list = torch.unique(hit_rows + start)
        self.n_offending += int(bad.sum())
        self.rows_hit += len(row_list)
        self.rows = [self.rows[0] if self.rows else int(row_list[0]), int(row_list[-1])]
        seg = _segments(self.name, hit_rows + start, self.pack)
        if seg is not None:
            ids, counts = torch.unique(seg, return_counts=True)
            for i, n in zip(ids.tolist(), counts.tolist()):
                self.segments[i] = self.segments.get(i, 0) + n
        self.columns += torch.bincount(hit_cols // self.block, minlength=self.n_blocks)
        if self.first is None:
            at = (int(hit_rows[0]), int(hit_cols[0]))
            self.first = {"index": [at[0] + start, at[1]],
                          "segment": None if seg is None else
                          ("pad" if int(seg[0]) < 0 else int(seg[0])),
                          "fused": float(f[at]), "eager": float(e[at]), "oracle": float(o[at])}
        rows = torch.arange(start, start + bad.shape[0])[:, None].expand_as(bad)
        cols = torch.arange(self.width)[None].expand_as(bad)
        cell = ((rows * self.n_bins) // max(self.n_rows, 1)) * self.n_blocks + cols // self.block
        cell, val = cell[bad], err[bad]
        self.count.scatter_add_(0, cell, torch.ones_like(cell))
        self.worst.scatter_reduce_(0, cell, val.nan_to_num(nan=float("inf")), reduce="amax")

    def result(self) -> dict[str, Any] | None:
        if not self.located or not self.n_offending:
            return None
        segments = None
        if self.name != "dape":
            ids = sorted(self.segments)
            counts = torch.tensor([self.segments[i] for i in ids], dtype=torch.long)
            order = torch.argsort(counts, descending=True)[:TOP_SEGMENTS]
            segments = [["pad" if ids[int(i)] < 0 else ids[int(i)], int(counts[i])] for i in order]
        pack, name = self.pack, self.name
        return {
            "tensor": self.g.tensor, "gate": self.g.gate, "n_offending": self.n_offending,
            "numel": self.numel, "row_axis": ROW_AXIS.get(name, "row"),
            "rows": {"first": self.rows[0], "last": self.rows[1], "n": self.rows_hit,
                     "of": self.n_rows},
            "segments": segments,
            "column_blocks": {"width": self.block, "counts": self.columns.tolist()},
            "first": self.first,
            "grid": {"row_edges": [(i * self.n_rows) // self.n_bins
                                   for i in range(self.n_bins + 1)],
                     "col_block": self.block,
                     "count": self.count.view(self.n_bins, self.n_blocks).tolist(),
                     "max_err": self.worst.view(self.n_bins, self.n_blocks).tolist()},
            "segment_bounds": None if name == "dape" else
            [int(x) for x in (pack.cuc if name == "out" else pack.cu).tolist()],
        }


def _locatable(g: GateResult, fused: Mapping[str, torch.Tensor]) -> bool:
    return g.status == FAIL and g.gate in ("G2", "G3", "zeros") and base_tensor(g.tensor) in fused


def locate_failures(gates: Sequence[GateResult], fused: Mapping[str, torch.Tensor],
                    whole: Mapping[str, tuple[torch.Tensor, torch.Tensor]], pack,
                    pieces: Callable[[], Iterable]) -> list[dict[str, Any]]:
    """One location per failed G2, G3 or zeros check (a tensor that fails two gates, say the
    zeros of its tails and G2 where windows read it, is located for each). ``whole``: the
    (fp32 reference, fp64 oracle) of ``out`` and ``dape``; dKV and dScore are gathered over
    ``pieces()`` ((fp32, fp64, ...) ``reference.compressor.Piece`` s in token order),
    evaluated again only when one of theirs failed."""
    found = [_Found(g, fused[base_tensor(g.tensor)].shape, pack) for g in gates
             if _locatable(g, fused)]
    pieced = [f for f in found if f.name not in whole]
    if pieced:
        for eager, oracle, *_ in pieces():
            for f in pieced:
                f.add(eager.start, fused[f.name][eager.start:eager.end],
                      getattr(eager, f.name), getattr(oracle, f.name))
    for f in found:
        if f.name in whole:
            f.add(0, fused[f.name], *whole[f.name])
    return [where for where in (f.result() for f in found) if where is not None]
