"""Judging dKV and dScore a token range at a time gives the verdict of judging them whole.

The references come in pieces (``reference.compressor.backward_pieces``) and the gate joins
the comparators' records of the pieces (``gates.join``, ``gates.piecewise``), locates failures
piece by piece (``gates.locate``) and checks the zeros a token range at a time. Here the chunks
are forced down to one row (and one token range to a few tokens) and the result compared with
one chunk over everything: the references' bits, each comparator's record, and whole cases
(every gate's status and numbers, the recorded numbers, the failure locations), honest and with
faults planted, on the small stand-in contracts of both rule sets.
"""

from __future__ import annotations

import pytest
import torch
from csagate.gates import comparators
from csagate.gates.join import join
from csagate.gates.limits import count_allowance
from csagate.gates.runner import run_case
from csagate.reference import compressor, make_grad_out, make_pack
from gate_backends import SMALL_CONTRACT, SMALL_R4_CONTRACT, FaultyImpl, RefImpl, driven

WHOLE = 1 << 40


def _chunked(monkeypatch, rows: int, elements: int) -> None:
    """One dAPE block of one row (the same blocks either way), ``rows`` rows a chunk, and
    ``elements`` elements a comparator's or a zeros check's step."""
    monkeypatch.setattr(compressor, "DAPE_BLOCK_ROWS", 1)
    monkeypatch.setattr(compressor, "CHUNK_ELEMENTS", rows)
    monkeypatch.setattr(comparators, "CHUNK", elements)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


PACKS = (  # ratio, coff, d, lens, pad rows, pad tokens
    (8, 1, 16, (23, 40, 9), 0, 0),
    (8, 2, 16, (7, 64, 0, 9, 8, 3, 35), 3, 5),
    (4, 2, 32, (100, 3, 57), 2, 3),
    (2, 2, 16, (67, 33, 0, 12), 4, 2),
    (4, 1, 16, (0,), 0, 0),
)


@pytest.mark.parametrize("ratio,coff,d,lens,pad_rows,pad_tokens", PACKS)
@pytest.mark.parametrize("precision", ["fp32", "fp64"])
def test_the_pieces_tile_the_tokens_and_hold_the_bits_of_the_whole(
        monkeypatch, ratio, coff, d, lens, pad_rows, pad_tokens, precision):
    pack = make_pack(lens, ratio=ratio, coff=coff, d=d, pad_rows=pad_rows,
                     pad_tokens=pad_tokens)
    go = make_grad_out(pack.n_rows, d)
    kw = {"ratio": ratio, "coff": coff, "precision": precision}
    monkeypatch.setattr(compressor, "CHUNK_ELEMENTS", WHOLE)
    whole = compressor.backward(*pack.inputs(), go, **kw)
    for rows in (1, 33 * coff * ratio * d):     # one row a chunk; 33 rows (across dAPE blocks)
        monkeypatch.setattr(compressor, "CHUNK_ELEMENTS", rows)
        pieces = list(compressor.backward_pieces(*pack.inputs(), go, **kw))
        assert pieces[0].start == 0 and pieces[-1].end == pack.n_tokens
        assert all(a.end == b.start for a, b in zip(pieces, pieces[1:]))
        assert all(p.out is None and p.dape is None for p in pieces[:-1])
        for name in ("dkv", "dscore"):
            got = torch.cat([getattr(p, name) for p in pieces])
            assert torch.equal(_bits(got), _bits(getattr(whole, name))), (rows, name)
        for name in ("out", "dape"):
            assert torch.equal(_bits(getattr(pieces[-1], name)), _bits(getattr(whole, name)))
        got = compressor.backward(*pack.inputs(), go, **kw)
        for name in ("out", "dkv", "dscore", "dape"):
            assert torch.equal(_bits(getattr(got, name)), _bits(getattr(whole, name)))


def test_a_never_consumed_mask_of_a_token_range_is_that_range_of_the_whole():
    pack = make_pack((7, 64, 0, 9, 8, 3, 35), ratio=8, coff=2, d=16, pad_tokens=5)
    kw = {"ratio": 8, "coff": 2, "d": 16, "n_tokens": pack.n_tokens}
    whole = compressor.never_consumed_mask(pack.cu, **kw)
    for start in range(pack.n_tokens + 1):
        for end in (start, start + 1, start + 9, pack.n_tokens):
            end = min(end, pack.n_tokens)
            assert torch.equal(compressor.never_consumed_mask(pack.cu, tokens=(start, end), **kw),
                               whole[start:end])


def _planted(shape=(40, 24), seed=3):
    """A reference, an implementation close to it with a few far, NaN, inf and -0.0 elements,
    and the fp64 oracle."""
    gen = torch.Generator().manual_seed(seed)
    oracle = torch.randn(shape, generator=gen, dtype=torch.float64)
    ref = oracle.to(torch.bfloat16)
    fused = ref.clone()
    fused.view(torch.int16)[torch.rand(shape, generator=gen) < 0.05] += 1
    fused[7, 3], fused[19, 0], fused[33, 20] = 0.5, float("nan"), float("inf")
    ref[29, 11] = float("nan")
    ref[2, 2], fused[2, 2] = 0.0, -0.0
    return fused, ref, oracle


def _blocks(t: torch.Tensor, size: int):
    return [(i, t[i:i + size]) for i in range(0, t.shape[0], size)]


def _joined(fn, tensors, size, **kw):
    """``fn`` on row blocks of ``size`` of every tensor, joined."""
    starts = list(range(0, tensors[0].shape[0], size))
    return join([fn(*(t[i:i + size] for t in tensors)) for i in starts], starts, **kw)


@pytest.mark.parametrize("size", [1, 3, 7, 40])
def test_joined_records_are_the_records_of_the_whole(size):
    fused, ref, oracle = _planted()
    finite = torch.isfinite(ref)
    mask = torch.zeros(ref.shape, dtype=torch.bool)
    mask[5:30:3] = True

    def allowance(n):
        return count_allowance(n, 1e-3)

    def tol(f, r, m=None):
        return comparators.tolerance(f, r, bound=0.1, mask=m,
                                     allowed=allowance(f.numel() if m is None else int(m.sum())))

    cases = [
        (tol, (fused, ref), {"allowance": allowance}),
        (tol, (fused, ref, finite), {"allowance": allowance}),
        (lambda f, r: comparators.tolerance(f, r, bound=0.1, allowed=None), (fused, ref), {}),
        (comparators.bitwise, (fused, ref), {}),
        (lambda f, r, m: comparators.bitwise(f, r, mask=m), (fused, ref, finite), {}),
        (comparators.oracle_parity, (fused, ref, oracle), {}),
        (lambda f, r, o, m: comparators.oracle_parity(f, r, o, mask=m),
         (fused, ref, oracle, finite), {}),
        (lambda f, r: comparators.nan_mask(f, r, require_full=False), (fused, ref), {}),
        (lambda f, r: comparators.nan_mask(f, r, require_full=True), (fused, ref), {}),
        (comparators.exact_zeros, (fused, mask), {}),
        (comparators.exact_zeros, (torch.zeros_like(fused), mask), {}),
    ]
    for fn, tensors, kw in cases:
        assert repr(_joined(fn, tensors, size, **kw)) == repr(fn(*tensors))


def _judged(impl, case, contract) -> str:
    r = run_case(driven(impl), case, contract)
    return repr((r.status, r.error, r.gates, r.recorded))


CASES = [(contract, case) for contract in (SMALL_CONTRACT, SMALL_R4_CONTRACT)
         for case in contract.all_cases]
FAULTS = ("count", "unwritten", "tail_tiny", "token_pad_row", "pad_leak", "dape",
          "large_error", "nan_mask", "nondeterministic", "pad_grad_out")


@pytest.mark.parametrize("contract,case", CASES, ids=[f"r{c.ratio}-{k.name}" for c, k in CASES])
def test_a_case_judged_in_pieces_gives_the_verdict_of_judging_it_whole(monkeypatch, contract,
                                                                       case):
    impls = [lambda: RefImpl()] + [
        lambda fault=fault: FaultyImpl(fault, case.name, n=40) for fault in FAULTS]
    for make in impls:
        _chunked(monkeypatch, WHOLE, WHOLE)
        whole = _judged(make(), case, contract)
        _chunked(monkeypatch, 1, 48)
        assert _judged(make(), case, contract) == whole
