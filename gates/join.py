"""The record a comparator gives on a whole tensor, put together from its records on row blocks.

The gate judges dKV and dScore a token range at a time (the references come in pieces,
``reference.compressor.backward_pieces``): each comparator of ``csagate.gates.comparators``
runs on one block of rows, and :func:`join` makes the record of the whole tensor out of the
blocks' records, in order: counts add up, the largest error is the largest of the blocks', the
first offending element is that of the first block holding one (its row shifted by the block's
first row), and what depends on the whole (a count allowance, ``ok``, G3's bound) is decided
over the totals. The result is the record the comparator gives on the whole tensor, number for
number (``tests/test_piecewise.py`` checks it on blocks of every size).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from csagate.gates.comparators import (
    Bitwise,
    NanMask,
    Parity,
    Tolerance,
    Zeros,
    nan_mask_of,
    parity_of,
    tolerance_ok,
)

Allowance = Callable[[int], "int | None"]


def _shift(index, start: int):
    return None if index is None else (index[0] + start, *index[1:])


def _first(records: Sequence, starts: Sequence[int], has=lambda r: r.first_index is not None):
    """The first block's record that ``has`` an offending element, its index made whole."""
    for r, start in zip(records, starts):
        if has(r):
            return replace(r, first_index=_shift(r.first_index, start))
    return replace(records[0], first_index=None)


def _tolerance(records, starts, allowance: Allowance | None) -> Tolerance:
    numel = sum(r.numel for r in records)
    n_diff = sum(r.n_diff for r in records)
    max_abs = max(r.max_abs for r in records)
    bound = records[0].bound
    # the first element beyond the bound (a block holds one iff its max_abs is beyond), else
    # the first differing one
    beyond = any(r.max_abs > bound for r in records)
    first = _first(records, starts, (lambda r: r.max_abs > bound) if beyond else
                   (lambda r: r.first_index is not None))
    allowed = None if records[0].allowed is None else allowance(numel)
    return replace(first, numel=numel, n_diff=n_diff, max_abs=max_abs, allowed=allowed,
                   ok=tolerance_ok(max_abs, bound, n_diff, allowed))


def _bitwise(records, starts, allowance) -> Bitwise:
    n_diff = sum(r.n_diff for r in records)
    return replace(_first(records, starts), numel=sum(r.numel for r in records),
                   n_diff=n_diff, n_zero_sign=sum(r.n_zero_sign for r in records),
                   max_abs=max(r.max_abs for r in records), ok=n_diff == 0)


def _parity(records, starts, allowance) -> Parity:
    return parity_of(max(r.err_fused for r in records), max(r.err_eager for r in records),
                     sum(r.numel for r in records))


def _nan_mask(records, starts, allowance) -> NanMask:
    first = _first(records, starts)
    return nan_mask_of(sum(r.numel for r in records), sum(r.fused_nan for r in records),
                       sum(r.eager_nan for r in records), sum(r.n_mismatch for r in records),
                       require_full=first.require_full, first_index=first.first_index,
                       fused_value=first.fused_value, eager_value=first.eager_value)


def _zeros(records, starts, allowance) -> Zeros:
    n_nonzero = sum(r.n_nonzero for r in records)
    return replace(_first(records, starts), n_masked=sum(r.n_masked for r in records),
                   n_nonzero=n_nonzero, ok=n_nonzero == 0)


_JOIN = {Tolerance: _tolerance, Bitwise: _bitwise, Parity: _parity, NanMask: _nan_mask,
         Zeros: _zeros}


def join(records: Sequence, starts: Sequence[int], *, allowance: Allowance | None = None):
    """The whole tensor's record from ``records``, one per block of rows in order, block i
    starting at row ``starts[i]``; ``allowance`` (numel -> allowed count): the count rule of a
    ``Tolerance`` that has one (``contracts.Rule.allowance``)."""
    if not records or len(records) != len(starts):
        raise ValueError("join needs one record per block, at least one")
    kind = type(records[0])
    if kind not in _JOIN:
        raise TypeError(f"no join for {kind.__name__} records")
    if kind is Tolerance and records[0].allowed is not None and allowance is None:
        raise ValueError("a Tolerance with a count rule needs its allowance to be joined")
    return _JOIN[kind](records, starts, allowance)
