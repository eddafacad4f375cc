"""The gate checks one by one, at their boundaries (docs/CONTRACT.md section 4.2)."""

from __future__ import annotations

import math

import pytest
import torch
from csagate.gates import checks
from csagate.reference import backward, make_grad_out, make_pack, never_consumed_mask

BF16 = torch.bfloat16


def step(t: torch.Tensor, index, steps: int = 1) -> torch.Tensor:
    """A copy of ``t`` with one element moved ``steps`` representable values from zero."""
    out = t.clone()
    ints = {torch.bfloat16: torch.int16, torch.float32: torch.int32}[t.dtype]
    out.view(ints)[index] += steps
    return out


# --- G2 tolerance ----------------------------------------------------------------------------


@pytest.mark.parametrize("numel, allowed", [(1, 1), (999, 1), (1999, 1), (2000, 2),
                                            (4096, 4), (8192 * 128, 1048)])
def test_count_allowance(numel, allowed):
    assert checks.count_allowance(numel) == allowed


def test_tolerance_count_boundary():
    ref = torch.linspace(0.5, 1.5, 4000).to(BF16).reshape(40, 100)
    allowed = checks.count_allowance(ref.numel())
    assert allowed == 4
    at = ref.clone()
    for i in range(allowed):
        at = step(at, (i, 3))
    ok = checks.tolerance(at, ref, bound=checks.MAX_ABS, allowed=allowed)
    assert ok.ok and ok.n_diff == allowed and ok.max_abs <= 2 ** -7
    over = step(at, (allowed, 3))
    bad = checks.tolerance(over, ref, bound=checks.MAX_ABS, allowed=allowed)
    assert not bad.ok and bad.n_diff == allowed + 1
    assert bad.first_index == (0, 3)
    assert bad.fused_value == float(over[0, 3]) and bad.ref_value == float(ref[0, 3])
    assert "5 differing > 4 allowed" in bad.summary()


def test_tolerance_max_abs_boundary_and_first_offender():
    ref = torch.zeros(10, 10)
    fused = ref.clone()
    fused[2, 3] = 1e-3
    fused[7, 1] = 2.0 ** -5
    assert checks.tolerance(fused, ref, bound=2.0 ** -5, allowed=2).ok   # <= is inclusive
    bad = checks.tolerance(fused, ref, bound=1.6e-2, allowed=2)
    assert not bad.ok and bad.n_diff == 2
    assert bad.first_index == (7, 1)          # the first element beyond the bound
    assert bad.fused_value == 2.0 ** -5 and bad.ref_value == 0.0
    assert "max_abs 3.125e-02 > 1.600e-02" in bad.summary()


def test_tolerance_nan_never_passes_and_no_count_mode():
    ref = torch.zeros(4, 4)
    fused = ref.clone()
    fused[1, 2] = math.nan
    bad = checks.tolerance(fused, ref, bound=1.0, allowed=10)
    assert not bad.ok and bad.max_abs == math.inf and bad.first_index == (1, 2)
    many = ref + 1e-4
    assert checks.tolerance(many, ref, bound=1e-3, allowed=None).ok  # dAPE: max_abs only
    assert not checks.tolerance(ref + 2e-3, ref, bound=1e-3, allowed=None).ok


def test_tolerance_as_bitwise_equal():
    a = torch.randn(8, 8).to(BF16)
    assert checks.tolerance(a, a.clone(), bound=0.0, allowed=0).ok
    bad = checks.tolerance(step(a, (4, 4)), a, bound=0.0, allowed=0)
    assert not bad.ok and bad.n_diff == 1 and bad.first_index == (4, 4)
    assert checks.tolerance(-torch.zeros(3), torch.zeros(3), bound=0.0, allowed=0).ok


# --- G3 oracle parity --------------------------------------------------------------------------


def test_oracle_parity_bound():
    oracle = torch.zeros(5, dtype=torch.float64)
    eager = torch.tensor([0.0, 1e-3, 0.0, 0.0, 0.0])
    bound = 1e-3 * (1 + 1e-6) + 1e-4
    at = torch.tensor([0.0, 0.0, 0.0, 1e-3 + 1e-4, 0.0])
    p = checks.oracle_parity(at, eager, oracle)
    assert p.ok and p.bound == pytest.approx(bound)
    assert p.err_eager == pytest.approx(1e-3)
    over = torch.tensor([0.0, 0.0, 0.0, 1.2e-3, 0.0])
    q = checks.oracle_parity(over, eager, oracle)
    assert not q.ok and q.err_fused == pytest.approx(1.2e-3)
    assert "err_fused 1.200e-03 > bound" in q.summary()


def test_oracle_parity_non_finite_fails():
    oracle = torch.zeros(3, dtype=torch.float64)
    nan = torch.tensor([0.0, math.nan, 0.0])
    assert not checks.oracle_parity(nan, torch.zeros(3), oracle).ok
    assert not checks.oracle_parity(torch.zeros(3), nan, oracle).ok  # no bound from NaN eager


# --- overflow: NaN masks ---------------------------------------------------------------------


def test_nan_mask_equal_and_full():
    full = torch.full((3, 4), math.nan)
    m = checks.nan_mask(full.clone(), full)
    assert m.ok and m.eager_full and m.n_mismatch == 0 and m.fused_nan == 12
    wrong = full.clone()
    wrong[2, 1] = 1.0
    bad = checks.nan_mask(wrong, full)
    assert not bad.ok and bad.n_mismatch == 1 and bad.first_index == (2, 1)
    assert bad.fused_value == 1.0


def test_nan_mask_requires_a_full_eager_mask():
    partial = torch.full((2, 2), math.nan)
    partial[0, 0] = 0.0
    equal_but_partial = checks.nan_mask(partial.clone(), partial)
    assert equal_but_partial.n_mismatch == 0 and not equal_but_partial.eager_full
    assert not equal_but_partial.ok
    assert "eager mask not full (3/4 NaN)" in equal_but_partial.summary()
    assert checks.nan_mask(partial.clone(), partial, require_full=False).ok


# --- G1 bitwise replay -------------------------------------------------------------------------


def test_replay_identical_runs():
    a = torch.randn(6, 6).to(BF16)
    r = checks.bitwise_replay([a, a.clone(), a.clone()])
    assert r.ok and r.n_diff == (0, 0) and r.first_run is None and r.nan_count == 0


def test_replay_reports_first_run_index_and_bits():
    a = torch.randn(6, 6).to(BF16)
    b = step(a, (2, 5))
    r = checks.bitwise_replay([a, a.clone(), b])
    assert not r.ok and r.n_diff == (0, 1) and r.first_run == 3 and r.first_index == (2, 5)
    raw = int(a.view(torch.int16)[2, 5]) & 0xFFFF
    assert r.bits == (raw, raw, (raw + 1) & 0xFFFF)


def test_replay_compares_nan_bit_patterns():
    qnan = torch.full((4,), math.nan, dtype=torch.float32)
    assert checks.bitwise_replay([qnan, qnan.clone()], allow_nan=True).ok
    other = qnan.clone()
    other.view(torch.int32)[1] |= 1          # another NaN payload: still NaN, other bits
    assert bool(torch.isnan(other).all())
    r = checks.bitwise_replay([qnan, other], allow_nan=True)
    assert not r.ok and r.first_index == (1,)


def test_replay_forbids_nan_unless_allowed_and_sees_signed_zero():
    a = torch.zeros(4)
    nan = a.clone()
    nan[0] = math.nan
    assert not checks.bitwise_replay([nan, nan.clone()]).ok
    assert checks.bitwise_replay([nan, nan.clone()], allow_nan=True).ok
    assert not checks.bitwise_replay([a, -a]).ok   # +0.0 and -0.0 differ in bits
    neg = torch.tensor([-1.5], dtype=BF16)
    assert checks.bit_view(neg).dtype == torch.int16


def test_replay_delta():
    a = torch.tensor([1.0, math.nan, math.inf])
    b = torch.tensor([1.0 + 2.0 ** -20, math.nan, math.inf])
    assert checks.replay_delta([a, b]) == 2.0 ** -20
    c = torch.tensor([1.0, 0.0, math.inf])
    assert checks.replay_delta([a, c]) == math.inf


# --- exact zeros ------------------------------------------------------------------------------


def test_exact_zeros():
    mask = torch.zeros(4, 3, dtype=torch.bool)
    mask[2:] = True
    t = torch.ones(4, 3)
    t[2:] = 0.0
    t[3, 0] = -0.0
    z = checks.exact_zeros(t, mask)
    assert z.ok and z.n_masked == 6 and z.n_nonzero == 0
    t[3, 2] = 2.0 ** -100
    bad = checks.exact_zeros(t, mask)
    assert not bad.ok and bad.n_nonzero == 1 and bad.first_index == (3, 2)
    t[3, 2] = math.nan
    assert not checks.exact_zeros(t, mask).ok   # an unwritten NaN-prefilled slot


def test_bitwise_equal():
    a = torch.randn(3, 3).to(BF16)
    assert checks.bitwise_equal(a, a.clone())
    assert not checks.bitwise_equal(a, step(a, (0, 0)))
    nan = torch.full((2,), math.nan)
    assert checks.bitwise_equal(nan, nan.clone())
    assert not checks.bitwise_equal(torch.zeros(2), -torch.zeros(2))
    assert not checks.bitwise_equal(a, a.float())


# --- the reference the checks compare against ----------------------------------------------------


@pytest.mark.parametrize("coff", [1, 2])
def test_eager_grads_are_exact_zeros_on_the_never_consumed_mask(coff):
    pack = make_pack((23, 40, 0, 9, 8), ratio=8, coff=coff, d=16, pad_rows=2, pad_tokens=5)
    go = make_grad_out(pack.n_rows, 16, seed=11)
    res = backward(*pack.inputs(), go, ratio=8, coff=coff)
    mask = never_consumed_mask(pack.cu, ratio=8, coff=coff, d=16, n_tokens=pack.n_tokens)
    assert checks.exact_zeros(res.dkv, mask).ok
    assert checks.exact_zeros(res.dscore, mask).ok
    assert int(mask.sum()) > 0
