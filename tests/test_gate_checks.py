"""The gate checks one by one, at their boundaries (docs/CONTRACT.md section 4.2)."""

from __future__ import annotations

import math

import pytest
import torch
from csagate.gates import comparators, coverage, limits
from csagate.reference import backward, make_grad_out, make_pack, never_consumed_mask

BF16 = torch.bfloat16


def step(t: torch.Tensor, index, steps: int = 1) -> torch.Tensor:
    """A copy of ``t`` with one element moved ``steps`` representable values from zero."""
    out = t.clone()
    ints = {torch.bfloat16: torch.int16, torch.float32: torch.int32}[t.dtype]
    out.view(ints)[index] += steps
    return out


# --- G2 tolerance ----------------------------------------------------------------------------


def _binomial_tail(n: int, rate: float, k: int) -> float:
    """P(X > k) for X ~ Binomial(n, rate), summed exactly in log space (the test's own)."""
    import math

    def log_pmf(j):
        return (math.lgamma(n + 1) - math.lgamma(j + 1) - math.lgamma(n - j + 1)
                + j * math.log(rate) + (n - j) * math.log1p(-rate))

    terms = [log_pmf(j) for j in range(k + 1, min(n, k + 2000) + 1)]
    return sum(math.exp(t) for t in terms)


@pytest.mark.parametrize("numel", [1, 2, 3, 4, 16, 128, 999, 4096, 65536, 8192 * 128])
@pytest.mark.parametrize("rate", [limits.COUNT_FRACTION, limits.R4_FWD_FRACTION, 8e-4])
def test_count_allowance_is_sound_at_every_size(numel, rate):
    """A correct kernel (independent flips at the calibrated rate) exceeds the allowance with
    probability at most FALSE_ALARM, at every size; the allowance is not needlessly loose
    (one less would exceed that rate, unless it is 0)."""
    allowed = limits.count_allowance(numel, rate)
    assert 0 <= allowed <= numel
    if allowed < numel:
        assert _binomial_tail(numel, rate, allowed) <= limits.FALSE_ALARM
    assert allowed >= rate * numel
    if numel >= 4096:   # large tensors: close to the calibrated share
        assert allowed <= rate * numel + 8 * (rate * numel) ** 0.5 + 25


def test_count_rule_informative_only_where_it_can_fail():
    assert not limits.count_informative(2, limits.count_allowance(2))
    assert limits.count_informative(128, limits.count_allowance(128))
    assert not limits.count_informative(128, None)
    # The small tensor: 2 of 128 out elements one step off at ratio 128 pass.
    assert limits.count_allowance(128) >= 2


def test_tolerance_count_boundary():
    ref = torch.linspace(0.5, 1.5, 4000).to(BF16).reshape(40, 100)
    allowed = limits.count_allowance(ref.numel())
    assert 4 <= allowed < 40
    at = ref.clone()
    for i in range(allowed):
        at = step(at, (i % 40, 3 + i // 40))
    ok = comparators.tolerance(at, ref, bound=limits.MAX_ABS, allowed=allowed)
    assert ok.ok and ok.n_diff == allowed and ok.max_abs <= 2 ** -7
    over = step(at, (allowed % 40, 3 + allowed // 40))
    bad = comparators.tolerance(over, ref, bound=limits.MAX_ABS, allowed=allowed)
    assert not bad.ok and bad.n_diff == allowed + 1
    assert bad.first_index == (0, 3)
    assert bad.fused_value == float(over[0, 3]) and bad.ref_value == float(ref[0, 3])
    assert f"{allowed + 1} differing > {allowed} allowed" in bad.summary()


def test_tolerance_max_abs_boundary_and_first_offender():
    ref = torch.zeros(10, 10)
    fused = ref.clone()
    fused[2, 3] = 1e-3
    fused[7, 1] = 2.0 ** -5
    assert comparators.tolerance(fused, ref, bound=2.0 ** -5, allowed=2).ok   # <= is inclusive
    bad = comparators.tolerance(fused, ref, bound=1.6e-2, allowed=2)
    assert not bad.ok and bad.n_diff == 2
    assert bad.first_index == (7, 1)          # the first element beyond the bound
    assert bad.fused_value == 2.0 ** -5 and bad.ref_value == 0.0
    assert "max_abs 3.125e-02 > 1.600e-02" in bad.summary()


def test_tolerance_nan_never_passes_and_no_count_mode():
    ref = torch.zeros(4, 4)
    fused = ref.clone()
    fused[1, 2] = math.nan
    bad = comparators.tolerance(fused, ref, bound=1.0, allowed=10)
    assert not bad.ok and bad.max_abs == math.inf and bad.first_index == (1, 2)
    many = ref + 1e-4
    assert comparators.tolerance(many, ref, bound=1e-3, allowed=None).ok  # dAPE: max_abs only
    assert not comparators.tolerance(ref + 2e-3, ref, bound=1e-3, allowed=None).ok


def test_tolerance_as_bitwise_equal():
    a = torch.randn(8, 8).to(BF16)
    assert comparators.tolerance(a, a.clone(), bound=0.0, allowed=0).ok
    bad = comparators.tolerance(step(a, (4, 4)), a, bound=0.0, allowed=0)
    assert not bad.ok and bad.n_diff == 1 and bad.first_index == (4, 4)
    assert comparators.tolerance(-torch.zeros(3), torch.zeros(3), bound=0.0, allowed=0).ok


# --- G3 oracle parity --------------------------------------------------------------------------


def test_oracle_parity_bound():
    oracle = torch.zeros(5, dtype=torch.float64)
    eager = torch.tensor([0.0, 1e-3, 0.0, 0.0, 0.0])
    bound = 1e-3 * (1 + 1e-6) + 1e-4
    at = torch.tensor([0.0, 0.0, 0.0, 1e-3 + 1e-4, 0.0])
    p = comparators.oracle_parity(at, eager, oracle)
    assert p.ok and p.bound == pytest.approx(bound)
    assert p.err_eager == pytest.approx(1e-3)
    over = torch.tensor([0.0, 0.0, 0.0, 1.2e-3, 0.0])
    q = comparators.oracle_parity(over, eager, oracle)
    assert not q.ok and q.err_fused == pytest.approx(1.2e-3)
    assert "err_fused 1.200e-03 > bound" in q.summary()


def test_oracle_parity_non_finite_fails():
    oracle = torch.zeros(3, dtype=torch.float64)
    nan = torch.tensor([0.0, math.nan, 0.0])
    assert not comparators.oracle_parity(nan, torch.zeros(3), oracle).ok
    assert not comparators.oracle_parity(torch.zeros(3), nan, oracle).ok  # no bound from NaN eager


# --- overflow: NaN masks ---------------------------------------------------------------------


def test_nan_mask_equal_and_full():
    full = torch.full((3, 4), math.nan)
    m = comparators.nan_mask(full.clone(), full)
    assert m.ok and m.eager_full and m.n_mismatch == 0 and m.fused_nan == 12
    wrong = full.clone()
    wrong[2, 1] = 1.0
    bad = comparators.nan_mask(wrong, full)
    assert not bad.ok and bad.n_mismatch == 1 and bad.first_index == (2, 1)
    assert bad.fused_value == 1.0


def test_nan_mask_requires_a_full_eager_mask():
    partial = torch.full((2, 2), math.nan)
    partial[0, 0] = 0.0
    equal_but_partial = comparators.nan_mask(partial.clone(), partial)
    assert equal_but_partial.n_mismatch == 0 and not equal_but_partial.eager_full
    assert not equal_but_partial.ok
    assert "eager mask not full (3/4 NaN)" in equal_but_partial.summary()
    assert comparators.nan_mask(partial.clone(), partial, require_full=False).ok


# --- G1 bitwise replay -------------------------------------------------------------------------


def test_replay_identical_runs():
    a = torch.randn(6, 6).to(BF16)
    r = comparators.bitwise_replay([a, a.clone(), a.clone()])
    assert r.ok and r.n_diff == (0, 0) and r.first_run is None and r.nan_count == 0


def test_replay_reports_first_run_index_and_bits():
    a = torch.randn(6, 6).to(BF16)
    b = step(a, (2, 5))
    r = comparators.bitwise_replay([a, a.clone(), b])
    assert not r.ok and r.n_diff == (0, 1) and r.first_run == 3 and r.first_index == (2, 5)
    raw = int(a.view(torch.int16)[2, 5]) & 0xFFFF
    assert r.bits == (raw, raw, (raw + 1) & 0xFFFF)


def test_replay_compares_nan_bit_patterns():
    qnan = torch.full((4,), math.nan, dtype=torch.float32)
    assert comparators.bitwise_replay([qnan, qnan.clone()], allow_nan=True).ok
    other = qnan.clone()
    other.view(torch.int32)[1] |= 1          # another NaN payload: still NaN, other bits
    assert bool(torch.isnan(other).all())
    r = comparators.bitwise_replay([qnan, other], allow_nan=True)
    assert not r.ok and r.first_index == (1,)


def test_replay_forbids_nan_unless_allowed_and_sees_signed_zero():
    a = torch.zeros(4)
    nan = a.clone()
    nan[0] = math.nan
    assert not comparators.bitwise_replay([nan, nan.clone()]).ok
    assert comparators.bitwise_replay([nan, nan.clone()], allow_nan=True).ok
    assert not comparators.bitwise_replay([a, -a]).ok   # +0.0 and -0.0 differ in bits
    neg = torch.tensor([-1.5], dtype=BF16)
    assert comparators.bit_view(neg).dtype == torch.int16


def test_replay_delta():
    a = torch.tensor([1.0, math.nan, math.inf])
    b = torch.tensor([1.0 + 2.0 ** -20, math.nan, math.inf])
    assert comparators.replay_delta([a, b]) == 2.0 ** -20
    c = torch.tensor([1.0, 0.0, math.inf])
    assert comparators.replay_delta([a, c]) == math.inf


# --- exact zeros ------------------------------------------------------------------------------


def test_exact_zeros():
    mask = torch.zeros(4, 3, dtype=torch.bool)
    mask[2:] = True
    t = torch.ones(4, 3)
    t[2:] = 0.0
    t[3, 0] = -0.0
    z = comparators.exact_zeros(t, mask)
    assert z.ok and z.n_masked == 6 and z.n_nonzero == 0
    t[3, 2] = 2.0 ** -100
    bad = comparators.exact_zeros(t, mask)
    assert not bad.ok and bad.n_nonzero == 1 and bad.first_index == (3, 2)
    t[3, 2] = math.nan
    assert not comparators.exact_zeros(t, mask).ok   # an unwritten NaN-prefilled slot


def test_bitwise_equal():
    a = torch.randn(3, 3).to(BF16)
    assert comparators.bitwise_equal(a, a.clone())
    assert not comparators.bitwise_equal(a, step(a, (0, 0)))
    nan = torch.full((2,), math.nan)
    assert comparators.bitwise_equal(nan, nan.clone())
    assert not comparators.bitwise_equal(torch.zeros(2), -torch.zeros(2))
    assert not comparators.bitwise_equal(a, a.float())


# --- the reference the checks compare against ----------------------------------------------------


@pytest.mark.parametrize("coff", [1, 2])
def test_eager_grads_are_exact_zeros_on_the_never_consumed_mask(coff):
    pack = make_pack((23, 40, 0, 9, 8), ratio=8, coff=coff, d=16, pad_rows=2, pad_tokens=5)
    go = make_grad_out(pack.n_rows, 16, seed=11)
    res = backward(*pack.inputs(), go, ratio=8, coff=coff)
    mask = never_consumed_mask(pack.cu, ratio=8, coff=coff, d=16, n_tokens=pack.n_tokens)
    assert comparators.exact_zeros(res.dkv, mask).ok
    assert comparators.exact_zeros(res.dscore, mask).ok
    assert int(mask.sum()) > 0


# --- masks: G2/G3 on the finite positions of a partial-overflow case ---------------------------


def test_tolerance_and_parity_with_a_mask():
    ref = torch.linspace(-1, 1, 100).reshape(10, 10)
    fused = ref.clone()
    fused[3, 3] = float("nan")
    ref_nan = ref.clone()
    ref_nan[3, 3] = float("nan")
    mask = torch.isfinite(ref_nan)
    t = comparators.tolerance(fused, ref_nan, bound=1e-3, allowed=0, mask=mask)
    assert t.ok and t.numel == 99 and t.n_diff == 0
    fused[7, 2] += 0.5
    bad = comparators.tolerance(fused, ref_nan, bound=1e-3, allowed=0, mask=mask)
    assert not bad.ok and bad.first_index == (7, 2) and bad.n_diff == 1   # full-tensor index
    oracle = ref.double()
    ok = comparators.oracle_parity(ref, ref_nan, oracle, mask=mask)
    assert ok.ok and ok.err_fused == 0.0
    assert not comparators.oracle_parity(fused, ref_nan, oracle, mask=mask).ok
    assert not comparators.oracle_parity(ref, ref_nan, oracle).ok      # unmasked: NaN error


# --- ratio=4 forward: bf16 steps -----------------------------------------------------------------


def test_bf16_ordinal_is_monotone_across_zero():
    vals = torch.tensor([-2.0, -1.0, -2.0 ** -133, -0.0, 0.0, 2.0 ** -133, 1.0], dtype=BF16)
    o = comparators.bf16_ordinal(vals)
    assert o.tolist() == sorted(o.tolist())
    assert o[3] == o[4] == 0 and o[5] - o[4] == 1 and o[4] - o[2] == 1


def test_bf16_steps_count_steps_and_noise():
    ref = torch.linspace(0.5, 1.5, 20000).to(BF16)
    allowed = limits.count_allowance(ref.numel(), limits.R4_FWD_FRACTION)
    one = ref
    for i in range(allowed):
        one = step(one, 10 * (i + 1))
    ok = comparators.bf16_steps(one, ref)
    assert ok.ok and ok.n_diff == allowed and ok.max_steps == 1 and ok.n_beyond == 0
    more = step(one, 10 * (allowed + 1))
    bad = comparators.bf16_steps(more, ref)
    assert not bad.ok and bad.n_diff == allowed + 1
    assert f"{allowed + 1} differing > {allowed} allowed" in bad.summary()
    two = step(ref, 5, 2)
    far = comparators.bf16_steps(two, ref)
    assert not far.ok and far.n_beyond == 1 and far.first_index == (5,)
    # near zero a few tiny steps are summation-order noise, within noise_atol
    tiny = torch.zeros(100, dtype=BF16)
    tiny[7] = 3e-6
    strict = comparators.bf16_steps(tiny, torch.zeros(100, dtype=BF16))
    assert not strict.ok and strict.max_steps > 1
    loose = comparators.bf16_steps(tiny, torch.zeros(100, dtype=BF16), noise_atol=8e-6)
    assert loose.ok and loose.n_within_noise == 1 and "within 8e-06" in loose.summary()
    nan = tiny.clone()
    nan[9] = float("nan")
    assert comparators.bf16_steps(nan, tiny, noise_atol=1.0).n_beyond == 1


# --- coverage over table entries, pinned bucket edges -------------------------------------------


def test_table_coverage_counts_distinct_kernels_of_entries():
    entries = {("small", 1): "k1", ("default", 1): "k2", ("large", 1): "k2", ("default", 2): "k3"}
    cov = coverage.table_coverage("fwd", entries, ["k1", "k2", "k3"])
    assert cov.ok and (cov.n_entries, cov.n_expected, cov.n_covered) == (4, 3, 3)
    miss = coverage.table_coverage("fwd", entries, ["k2", "k9"])
    assert not miss.ok and miss.missing == ("k1", "k3") and miss.unexpected == ("k9",)
    assert "no case selects k1, k3" in miss.summary()


EDGES = (limits.BucketEdge("fwd", "small", 128, upper=True),
         limits.BucketEdge("fwd", "large", 1024, upper=False))
ENTRIES = {("fwd", "small", (1, 128)): "S", ("fwd", "default", (1, 128)): "D",
           ("fwd", "large", (1, 128)): "L", ("fwd", "default", (1, 512)): "D5",
           ("fwd", "large", (1, 512)): "D5"}


def _dispatch(small_max=128, large_min=1024, large_op=">="):
    out = {}
    for direction, config, n, _ in coverage.edge_probes(EDGES, coverage.entry_configs(ENTRIES)):
        large = n >= large_min if large_op == ">=" else n > large_min
        if n <= small_max and ("fwd", "small", config) in ENTRIES:
            bucket = "small"
        elif large and ("fwd", "large", config) in ENTRIES:
            bucket = "large"
        else:
            bucket = "default"
        out[(direction, config, n)] = ENTRIES[(direction, bucket, config)]
    return out


def test_bucket_edges_pass_and_count_blind_pairs():
    e = coverage.bucket_edges(EDGES, ENTRIES, _dispatch())
    assert e.ok and e.n_probes == 2 * 2 * 3 and e.n_mismatch == 0
    assert [p.n_rows for p in e.probes[:3]] == [127, 128, 129]
    # c1d512 has no small entry, and its default and large entries are one kernel
    assert e.n_blind == 2
    assert "12/12 probes at fwd small <= 128, fwd large >= 1024" in e.summary()


@pytest.mark.parametrize("moved", [{"large_op": ">"}, {"large_min": 1023}, {"small_max": 127}])
def test_bucket_edges_fail_on_a_moved_edge(moved):
    e = coverage.bucket_edges(EDGES, ENTRIES, _dispatch(**moved))
    assert not e.ok and e.n_mismatch == 1
    p = e.first
    assert p.config == "c1d128" and not p.ok
    assert p.n_rows in (1023, 1024, 128) and p.selected != p.expected
    assert f"at N={p.n_rows} ({p.edge})" in e.summary()


def test_bucket_edges_fail_when_the_declared_bucket_has_no_default():
    entries = {k: v for k, v in ENTRIES.items() if k != ("fwd", "default", (1, 128))}
    e = coverage.bucket_edges(EDGES, entries, _dispatch())
    assert not e.ok and e.first.expected is None and e.first.n_rows == 129


def test_bitwise_compares_bit_patterns():
    """-0.0 is not +0.0; every NaN equals every NaN; the first difference shows its bits."""
    ref = torch.tensor([0.0, 1.0, float("nan"), -2.0], dtype=BF16)
    same = ref.clone()
    same[2] = -float("nan")
    assert comparators.bitwise(same, ref).ok
    neg = ref.clone()
    neg[0] = -0.0
    assert bool((neg == ref)[[0, 1, 3]].all())   # equal by value ...
    r = comparators.bitwise(neg, ref)
    assert not r.ok and r.n_diff == 1 and r.n_zero_sign == 1 and r.first_index == (0,)
    assert (r.fused_bits, r.ref_bits) == ("0x8000", "0x0000")
    assert "+0.0 vs -0.0" in r.summary()
    masked = comparators.bitwise(neg, ref, mask=torch.tensor([False, True, True, True]))
    assert masked.ok and masked.numel == 3
    with pytest.raises(ValueError, match="dtype"):
        comparators.bitwise(ref.float(), ref)


def test_bitwise_rule_fails_a_signed_zero():
    from csagate.gates.contracts import Rule

    ref = torch.zeros(64, dtype=BF16)
    fused = ref.clone()
    fused[5] = -0.0
    assert not Rule("bitwise").apply(fused, ref, window=8).ok
    assert Rule("tolerance", 0.0, None).apply(fused, ref, window=8).ok   # by value: equal


def test_small_forward_rate_follows_the_case_window():
    """coff=1 and coff=2 windows of one ratio get their own calibrated rate (fwd_fraction)."""
    from csagate.gates.contracts import Rule, fwd_fraction

    ref = torch.linspace(0.5, 1.5, 60000).to(BF16)
    rule = Rule("bf16_steps")
    wide = rule.apply(ref, ref, window=64)      # ratio 32, coff 2
    narrow = rule.apply(ref, ref, window=32)    # ratio 32, coff 1
    assert wide.allowed == limits.count_allowance(60000, fwd_fraction(64))
    assert narrow.allowed == limits.count_allowance(60000, fwd_fraction(32))
    assert narrow.allowed < wide.allowed
