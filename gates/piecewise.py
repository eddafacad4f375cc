"""The checks of one case against the references, dKV and dScore a token range at a time.

Whole, the fp32 reference's and the fp64 oracle's gradients of the largest packs take gigabytes
(16 bytes a kv slot in fp64). The gate never holds them: :func:`reference_pieces` evaluates
both references (and, for the isolation check, the clean pack's fp32 reference) in lockstep, a
row chunk at a time (``reference.compressor.backward_pieces``), and :func:`judge` runs every
:class:`Check` on each token range of dKV and dScore as it comes, against the same rows of the
implementation's run 1, then joins the records (``csagate.gates.join``): the records of the
whole tensors, number for number. ``out`` and dAPE (a row per output row, a row per window
position) come whole with the last piece and are judged whole.

A :class:`Pending` is one gate (or one group of recorded numbers) waiting for the records of
its checks: ``finish`` makes the result out of them once they are joined.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import torch
from csagate.gates.join import join
from csagate.reference.compressor import Piece, backward_pieces

PIECED = ("dkv", "dscore")   # the tensors judged a token range at a time


@dataclass(frozen=True)
class Slice:
    """One tensor, or a token range of it: the implementation's run 1 (None if it has none),
    the fp32 reference, the fp64 oracle and (isolation only) the clean pack's fp32 reference."""

    fused: torch.Tensor | None
    eager: torch.Tensor
    oracle: torch.Tensor
    clean: torch.Tensor | None = None


@dataclass(frozen=True)
class Check:
    """A comparator on tensor ``name``: ``fn(Slice)`` -> its record. On dKV/dScore the blocks'
    records are put together by ``reduce`` (plain values: ``all``, ``max``, ``sum``) or else
    by ``join.join`` (with ``allowance``, a count rule's, for a ``Tolerance``)."""

    name: str
    fn: Callable[[Slice], Any]
    reduce: Callable[[Iterable], Any] | None = None
    allowance: Callable[[int], int | None] | None = None


@dataclass(frozen=True)
class Pending:
    """A result waiting for its checks: ``finish(*records)``, in the order of ``checks``."""

    checks: tuple[Check, ...]
    finish: Callable[..., Any]


def done(result: Any) -> Pending:
    """A result that needs no reference."""
    return Pending((), lambda: result)


Pieces = Iterator[tuple[Piece, Piece, Piece | None]]


def reference_pieces(ins, go, *, ratio: int, coff: int, clean_ins=None) -> Pieces:
    """(fp32 piece, fp64 piece, clean fp32 piece or None) for each token range, in order."""
    eager = backward_pieces(*ins, go, ratio=ratio, coff=coff, precision="fp32")
    oracle = backward_pieces(*ins, go, ratio=ratio, coff=coff, precision="fp64")
    clean = repeat(None) if clean_ins is None else \
        backward_pieces(*clean_ins, go, ratio=ratio, coff=coff, precision="fp32")
    return zip(eager, oracle, clean)


def _slice(first: Mapping[str, torch.Tensor], name: str, eager: Piece, oracle: Piece,
           clean: Piece | None, rows: slice = slice(None)) -> Slice:
    fused = first[name][rows] if name in first else None
    return Slice(fused, getattr(eager, name), getattr(oracle, name),
                 None if clean is None else getattr(clean, name))


def judge(pending: Sequence[Pending], first: Mapping[str, torch.Tensor],
          pieces: Pieces) -> tuple[list, tuple[Piece, Piece, Piece | None]]:
    """Every pending result finished, in order, after one pass over ``pieces``; and the last
    pieces (whose ``out`` and ``dape`` are the references' whole)."""
    checks = [c for p in pending for c in p.checks]
    blocks: list[list] = [[] for _ in checks]
    starts: list[int] = []
    last = None
    for last in pieces:
        eager = last[0]
        rows = slice(eager.start, eager.end)
        starts.append(eager.start)
        for check, found in zip(checks, blocks):
            if check.name in PIECED:
                found.append(check.fn(_slice(first, check.name, *last, rows)))
    records = []
    for check, found in zip(checks, blocks):
        if check.name not in PIECED:
            records.append(check.fn(_slice(first, check.name, *last)))
        elif check.reduce is not None:
            records.append(check.reduce(found))
        else:
            records.append(join(found, starts, allowance=check.allowance))
    results, i = [], 0
    for p in pending:
        results.append(p.finish(*records[i:i + len(p.checks)]))
        i += len(p.checks)
    return results, last
