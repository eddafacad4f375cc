"""Known-answer self-tests of the gate's own checking machinery, run before every verdict.

Like the power-on self-tests of a cryptographic module: before ``csagate run``, ``fuzz``,
``compare`` or the pytest plugin judge anything, the gate runs its own checks on small
tensors whose answers are known, on the device it is about to judge on, with the torch and
numpy it will judge with. If any answer is wrong the gate refuses to give a verdict
(:class:`SelfTestFailed`: the CLI's exit 3, naming the self-test). Each check goes through
the code the verdict goes through: the comparators, the contract's rules, the count
allowance, the runner's gate records and case status, the zero-class masks, the locator, case
files, the shrinker, the driver between the gate and an implementation, the op check,
coverage and adapter loading. The sabotaged implementations below are the reference with one
fault each; the honest one must pass, each faulty one must fail at its gate.

:func:`ensure` runs them once per device and process (well under a second) and returns the
record every verdict carries (``self-test 40/40``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from time import perf_counter

import torch
from csagate.gates import comparators, limits
from csagate.gates.cases import Case
from csagate.gates.contracts import CONTRACTS, R128, fwd_fraction
from csagate.gates.errors import CannotEvaluate, one_line
from csagate.gates.plugin import Supports
from csagate.gates.verdict import (
    FAIL,
    INCONCLUSIVE,
    NA,
    NOTHING_JUDGED,
    PASS,
    CaseResult,
    CoverageResult,
    GateResult,
    Selection,
    Verdict,
    case_status,
)


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str = ""


@dataclass(frozen=True)
class SelfTests:
    """Every self-test's outcome on one device."""

    device: str
    checks: tuple[Check, ...]
    seconds: float

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def passed(self) -> int:
        return sum(c.ok for c in self.checks)

    @property
    def failed(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if not c.ok)

    @property
    def summary(self) -> str:
        return f"{self.passed}/{len(self.checks)}"

    def message(self) -> str:
        """One line naming the first failed self-test (what exit 3 prints)."""
        bad = self.failed
        if not bad:
            return f"self-test {self.summary} passed on {self.device}"
        more = f" (also failed: {'; '.join(c.name for c in bad[1:])})" if len(bad) > 1 else ""
        return (f"self-test failed on {self.device}: {bad[0].name}: {bad[0].detail}{more}; "
                "the gate's own checking machinery is wrong here, so it gives no verdict")

    def record(self) -> dict:
        """The JSON reports' ``selftest`` entry."""
        return {"passed": self.passed, "total": len(self.checks), "device": self.device,
                "seconds": self.seconds,
                "failed": [{"name": c.name, "detail": c.detail} for c in self.failed]}


class SelfTestFailed(CannotEvaluate):
    """A self-test gave a wrong answer: no verdict can be trusted (could not evaluate)."""

    def __init__(self, tests: SelfTests):
        super().__init__(tests.message())
        self.tests = tests


class Wrong(AssertionError):
    """A known answer that did not come out."""


def expect(condition, detail: str) -> None:
    if not condition:
        raise Wrong(detail)


CHECKS: list[tuple[str, Callable]] = []


def check(name: str):
    def register(fn):
        CHECKS.append((name, fn))
        return fn
    return register


# --- helpers -----------------------------------------------------------------------------------


def _grid(dev, dtype=torch.bfloat16, rows: int = 64, cols: int = 64) -> torch.Tensor:
    """Values in [0.5, 2) (every one a normal number, one bf16 step apart at most 2^-6)."""
    base = torch.arange(rows * cols, dtype=torch.float32, device=dev).remainder(97) / 64 + 0.5
    return base.view(rows, cols).to(dtype)


def _flip(t: torch.Tensor, index, steps: int = 1) -> torch.Tensor:
    """A copy with one element moved ``steps`` representable values (one ulp each)."""
    ints = {torch.bfloat16: torch.int16, torch.float32: torch.int32,
            torch.float64: torch.int64}[t.dtype]
    out = t.clone()
    out.view(ints)[index] += steps
    return out


def _flips(t: torch.Tensor, n: int, steps: int = 1) -> torch.Tensor:
    """A copy with its first ``n`` elements (flat order) moved ``steps`` ulps each."""
    ints = {torch.bfloat16: torch.int16, torch.float32: torch.int32}[t.dtype]
    out = t.clone()
    out.view(ints).view(-1)[:n] += steps
    return out


def _fp32_at_most(x: float, dev) -> torch.Tensor:
    """The largest fp32 value <= x."""
    v = torch.tensor(x, dtype=torch.float32, device=dev)
    if float(v) > x:
        v = torch.nextafter(v, torch.tensor(-math.inf, device=dev))
    return v


def _above(v: torch.Tensor) -> torch.Tensor:
    return torch.nextafter(v, torch.tensor(math.inf, device=v.device))


# --- comparators -------------------------------------------------------------------------------


@check("bitwise: equal tensors pass")
def _bitwise_equal(dev):
    a = _grid(dev)
    got = comparators.bitwise(a, a.clone())
    expect(got.ok and got.n_diff == 0 and got.numel == a.numel(), got.summary())


@check("bitwise: a one-ulp flip fails at its index")
def _bitwise_flip(dev):
    a = _grid(dev, torch.float32)
    got = comparators.bitwise(_flip(a, (5, 9)), a)
    expect(not got.ok and got.n_diff == 1 and got.first_index == (5, 9), got.summary())


@check("bitwise: -0 is not +0")
def _bitwise_zero_sign(dev):
    a = torch.zeros(8, 8, dtype=torch.bfloat16, device=dev)
    b = a.clone()
    b[2, 3] = -0.0
    got = comparators.bitwise(b, a)
    expect(not got.ok and got.n_zero_sign == 1 and got.first_index == (2, 3), got.summary())


@check("bitwise: NaN equals NaN and differs from a number")
def _bitwise_nan(dev):
    a = _grid(dev)
    a[1, 1] = math.nan
    got = comparators.bitwise(a.clone(), a)
    expect(got.ok, f"NaN at one place in both: {got.summary()}")
    b = a.clone()
    b[4, 4] = math.nan
    got = comparators.bitwise(b, a)
    expect(not got.ok and got.first_index == (4, 4), f"NaN against a number: {got.summary()}")


@check("G1 replay: identical runs pass; a flip in run 3 fails there")
def _replay(dev):
    a = _grid(dev)
    got = comparators.bitwise_replay([a, a.clone(), a.clone()])
    expect(got.ok, got.summary())
    got = comparators.bitwise_replay([a, a.clone(), _flip(a, (7, 2))])
    expect(not got.ok and got.first_run == 3 and got.first_index == (7, 2)
           and got.n_diff == (0, 1), got.summary())


@check("G1 replay: NaN fails unless the case allows it")
def _replay_nan(dev):
    a = _grid(dev)
    a[0, 3] = math.nan
    runs = [a, a.clone(), a.clone()]
    expect(not comparators.bitwise_replay(runs).ok, "NaN in every run passed")
    expect(comparators.bitwise_replay(runs, allow_nan=True).ok, "allowed NaN failed")


@check("tolerance: at the bound passes, one ulp beyond fails")
def _tolerance_bound(dev):
    bound = limits.MAX_ABS
    ref = torch.zeros(16, 16, dtype=torch.float32, device=dev)
    at = ref.clone()
    at[3, 4] = _fp32_at_most(bound, dev)
    got = comparators.tolerance(at, ref, bound=bound, allowed=None)
    expect(got.ok, f"at the bound: {got.summary()}")
    beyond = ref.clone()
    beyond[3, 4] = _above(_fp32_at_most(bound, dev))
    got = comparators.tolerance(beyond, ref, bound=bound, allowed=None)
    expect(not got.ok and got.first_index == (3, 4), f"beyond the bound: {got.summary()}")


@check("tolerance: NaN is beyond every bound")
def _tolerance_nan(dev):
    ref = _grid(dev, torch.float32)
    bad = ref.clone()
    bad[2, 2] = math.nan
    got = comparators.tolerance(bad, ref, bound=1e30, allowed=None)
    expect(not got.ok and got.max_abs == math.inf and got.first_index == (2, 2), got.summary())


@check("tolerance: k = the allowance differing passes, k + 1 fails")
def _tolerance_count(dev):
    ref = _grid(dev)
    k = limits.count_allowance(ref.numel(), limits.COUNT_FRACTION)
    expect(0 < k < ref.numel() - 1, f"allowance {k} of {ref.numel()} is not informative")
    got = comparators.tolerance(_flips(ref, k), ref, bound=limits.MAX_ABS, allowed=k)
    expect(got.ok and got.n_diff == k, f"k = {k}: {got.summary()}")
    got = comparators.tolerance(_flips(ref, k + 1), ref, bound=limits.MAX_ABS, allowed=k)
    expect(not got.ok and got.n_diff == k + 1, f"k + 1 = {k + 1}: {got.summary()}")


@check("bf16 steps: one step passes, two steps fail")
def _steps_one_two(dev):
    ref = _grid(dev)
    got = comparators.bf16_steps(_flip(ref, (1, 1)), ref, noise_atol=1e-6)
    expect(got.ok and got.max_steps == 1, f"one step: {got.summary()}")
    got = comparators.bf16_steps(_flip(ref, (1, 1), 2), ref, noise_atol=1e-6)
    expect(not got.ok and got.n_beyond == 1 and got.first_index == (1, 1),
           f"two steps: {got.summary()}")


@check("bf16 steps: k = the allowance one step off passes, k + 1 fails")
def _steps_count(dev):
    ref = _grid(dev)
    fraction = fwd_fraction(8)
    k = limits.count_allowance(ref.numel(), fraction)
    expect(0 < k < ref.numel() - 1, f"allowance {k} of {ref.numel()} is not informative")
    got = comparators.bf16_steps(_flips(ref, k), ref, fraction=fraction)
    expect(got.ok and got.n_diff == k, f"k = {k}: {got.summary()}")
    got = comparators.bf16_steps(_flips(ref, k + 1), ref, fraction=fraction)
    expect(not got.ok and got.n_diff == k + 1, f"k + 1 = {k + 1}: {got.summary()}")


@check("G3 parity: at the bound passes, beyond fails, a non-finite reference error fails")
def _parity(dev):
    oracle = torch.zeros(4, 4, dtype=torch.float64, device=dev)
    eager = oracle.clone()
    eager[0, 0] = 2.0 ** -8
    bound = 2.0 ** -8 * (1 + limits.PARITY_RTOL) + limits.PARITY_ATOL
    fused = oracle.clone()
    fused[1, 1] = bound
    got = comparators.oracle_parity(fused, eager, oracle)
    expect(got.ok and got.err_fused == bound, f"at the bound: {got.summary()}")
    fused[1, 1] = bound * (1 + 2.0 ** -40)
    expect(not comparators.oracle_parity(fused, eager, oracle).ok, "beyond the bound passed")
    eager[0, 0] = math.inf
    expect(not comparators.oracle_parity(oracle, eager, oracle).ok,
           "an infinite reference error passed")


@check("NaN mask: equal masks pass, a moved NaN fails, a partial mask fails when full is due")
def _nan_mask(dev):
    a = _grid(dev)
    a[0, 0] = a[3, 1] = math.nan
    got = comparators.nan_mask(a.clone(), a, require_full=False)
    expect(got.ok and got.fused_nan == 2, got.summary())
    b = a.clone()
    b[3, 1], b[3, 2] = 1.0, math.nan
    got = comparators.nan_mask(b, a, require_full=False)
    expect(not got.ok and got.n_mismatch == 2 and got.first_index == (3, 1), got.summary())
    expect(not comparators.nan_mask(a.clone(), a, require_full=True).ok,
           "a partial eager mask passed where a full one is required")
    full = torch.full_like(a, math.nan)
    expect(comparators.nan_mask(full.clone(), full, require_full=True).ok,
           "equal full masks failed")


@check("zeros: +0 and -0 pass; 2^-100 and NaN in a masked slot fail")
def _exact_zeros(dev):
    t = _grid(dev)
    mask = torch.zeros(t.shape, dtype=torch.bool, device=dev)
    mask[5:7] = True
    t[5] = 0.0
    t[6] = -0.0
    got = comparators.exact_zeros(t, mask)
    expect(got.ok and got.n_masked == 2 * t.shape[1], got.summary())
    for value in (2.0 ** -100, math.nan):
        bad = t.clone()
        bad[6, 9] = value
        got = comparators.exact_zeros(bad, mask)
        expect(not got.ok and got.first_index == (6, 9), f"{value!r}: {got.summary()}")


# --- the count allowance against the exact binomial tail ---------------------------------------


def binomial_tail(n: int, rate: float, k: int) -> float:
    """P(X >= k) for X ~ Binomial(n, rate), summed term by term in log space (lgamma): the
    exact tail, not the Chernoff bound the allowance is computed from."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    log_p, log_q = math.log(rate), math.log1p(-rate)
    total, first = 0.0, None
    for i in range(k, n + 1):
        term = (math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
                + i * log_p + (n - i) * log_q)
        if first is None:
            first = term
        total += math.exp(term - first)
        if term - first < -60:          # the rest add less than e^-60 of the first term
            break
    return math.exp(first) * total


# (numel, rate) pairs the verdicts meet: the ratio=128 rate from a tiny tensor to a large one,
# and the small ratios' forward rates of their windows (2 to 256 positions).
ALLOWANCE_SIZES = ((128, limits.COUNT_FRACTION), (4096, limits.COUNT_FRACTION),
                   (1 << 20, limits.COUNT_FRACTION), (1 << 24, limits.COUNT_FRACTION),
                   (4096, fwd_fraction(8)), (1 << 18, fwd_fraction(64)),
                   (1 << 22, fwd_fraction(256)))


@check("count allowance: sound and tight against the exact binomial tail")
def _allowance(dev):
    alpha = limits.FALSE_ALARM
    for n, rate in ALLOWANCE_SIZES:
        k = limits.count_allowance(n, rate)
        expect(0 <= k < n, f"n={n} rate={rate:g}: allowance {k} is not below the size")
        over = binomial_tail(n, rate, k + 1)
        expect(over <= alpha * (1 + 1e-6),
               f"n={n} rate={rate:g}: P(X >= {k + 1}) = {over:.3g} > {alpha:g} (unsound)")
        # Chernoff's bound is tight up to sqrt(8 k) (Ash 1990: P(X >= k) >= e^(-n KL) /
        # sqrt(8 k (1 - k/n))), and the allowance is the last k whose bound exceeds alpha.
        at = binomial_tail(n, rate, k)
        floor = alpha / (2 * math.sqrt(8 * max(k, 1)))
        expect(at >= floor, f"n={n} rate={rate:g}: P(X >= {k}) = {at:.3g} < {floor:.3g} "
               "(the allowance is looser than the bound it comes from)")


# --- the contract's rules ------------------------------------------------------------------------


def _rules_of(ratio: int):
    def rules(dev):
        for name, rule in CONTRACTS[ratio].g2:
            for scale in (1.0, 64.0):
                _rule_known_answers(dev, f"ratio={ratio} {name}", name, rule, 2 * ratio, scale)
    return rules


for _ratio in CONTRACTS:
    check(f"rules of ratio={_ratio}: each per-element bound, and the count allowance at k and "
          "k + 1")(_rules_of(_ratio))


def _rule_known_answers(dev, label, name, rule, window, scale):
    where = f"{label} (scale {scale:g})"
    dtype = torch.float32 if name == "dape" else torch.bfloat16
    ref = (_grid(dev, torch.float32) * scale).to(dtype)
    same = rule.apply(ref.clone(), ref, window=window, scale=scale)
    expect(same.ok, f"{where}: equal tensors fail: {same.summary()}")
    if rule.check == "bitwise":
        got = rule.apply(_flip(ref, (0, 1)), ref, window=window, scale=scale)
        expect(not got.ok, f"{where}: a one-ulp flip passed a bitwise rule")
        return
    if rule.check == "bf16_steps":
        k = limits.count_allowance(ref.numel(), fwd_fraction(window))
        one = rule.apply(_flips(ref, k), ref, window=window, scale=scale)
        expect(one.ok, f"{where}: {k} elements one step off failed: {one.summary()}")
        more = rule.apply(_flips(ref, k + 1), ref, window=window, scale=scale)
        expect(not more.ok, f"{where}: {k + 1} elements one step off passed")
        two = rule.apply(_flip(ref, (2, 2), 2), ref, window=window, scale=scale)
        expect(not two.ok, f"{where}: an element two steps off passed")
        return
    bound = rule.bound * scale ** rule.scale_power
    zero = torch.zeros(ref.shape, dtype=torch.float32, device=dev)
    at = zero.clone()
    at[0, 0] = _fp32_at_most(bound, dev)
    got = rule.apply(at, zero, window=window, scale=scale)
    expect(got.ok, f"{where}: an element at the bound {bound:g} failed: {got.summary()}")
    at[0, 0] = _above(_fp32_at_most(bound, dev))
    got = rule.apply(at, zero, window=window, scale=scale)
    expect(not got.ok, f"{where}: an element beyond the bound {bound:g} passed")
    if rule.fraction is None:
        return
    k = limits.count_allowance(ref.numel(), rule.fraction)
    fine = rule.apply(_flips(ref, k), ref, window=window, scale=scale)
    expect(fine.ok, f"{where}: {k} differing within the bound failed: {fine.summary()}")
    over = rule.apply(_flips(ref, k + 1), ref, window=window, scale=scale)
    expect(not over.ok, f"{where}: {k + 1} differing passed (allowance {k})")


# --- records: gates, cases, verdicts -------------------------------------------------------------


@check("records: a check is inconclusive on empty input only")
def _inconclusive(dev):
    from csagate.gates.runner import _gate, _zeros

    empty = torch.zeros(0, 4, dtype=torch.bfloat16, device=dev)
    got = _gate("G2", "out", comparators.tolerance(empty, empty, bound=1.0, allowed=0))
    expect(got.status == INCONCLUSIVE, f"an empty tensor gave {got.status}")
    full = _grid(dev)
    got = _gate("G2", "out", comparators.tolerance(full, full.clone(), bound=1.0, allowed=0))
    expect(got.status == PASS, f"a judged, passing tensor gave {got.status}")
    got = _gate("G1", "out", comparators.bitwise_replay([full, full.clone()]))
    expect(got.status == PASS, f"a judged replay gave {got.status}")
    got = _gate("G3", "out", comparators.oracle_parity(empty, empty, empty))
    expect(got.status == INCONCLUSIVE, f"G3 of empty tensors gave {got.status}")
    mask = torch.zeros(full.shape, dtype=torch.bool, device=dev)
    got = _zeros("dkv", [comparators.exact_zeros(full, mask)])
    expect(got.status == INCONCLUSIVE, f"an empty zeros mask gave {got.status}")
    mask[0, 0] = True
    full[0, 0] = 0.0
    got = _zeros("dkv", [comparators.exact_zeros(full, mask)])
    expect(got.status == PASS, f"a judged zeros slot gave {got.status}")


@check("records: a case judged nothing is not a pass; a verdict that judged nothing is not green")
def _judged_nothing(dev):
    inc = GateResult("G2", "out", INCONCLUSIVE, {})
    na = GateResult("G2", "dkv", NA, {})
    ok = GateResult("G1", "out", PASS, {"numel": 4})
    expect(case_status([inc, na]) == INCONCLUSIVE, "every check inconclusive counted as a pass")
    expect(case_status([inc, ok]) == PASS, "a judged check did not make the case pass")
    expect(case_status([ok, GateResult("G2", "out", FAIL, {})]) == FAIL, "a failure passed")
    case = Case("selftest", 1, 4, (8,), "union", "", ratio=4)
    drift = CaseResult(case, NA, error="not run")
    cov = CoverageResult(NA, {}, {})

    def verdict(*statuses):
        return Verdict(drift, tuple(CaseResult(case, s) for s in statuses), cov, full=True)

    for statuses, state in (((NA, NA), NOTHING_JUDGED), ((), NOTHING_JUDGED),
                            ((INCONCLUSIVE,), NOTHING_JUDGED), ((PASS, INCONCLUSIVE),
                                                                INCONCLUSIVE),
                            ((PASS, NA), PASS), ((PASS, FAIL), FAIL)):
        got = verdict(*statuses)
        expect(got.state == state and got.ok == (state == PASS),
               f"cases {statuses}: verdict {got.state}, expected {state}")


# --- geometry: zero classes, the locator, the second derivation ----------------------------------

# Ratio 4, coff 2, d 1: segments of 9 (two blocks and a tail token), 0, 3 (shorter than the
# ratio) and 12 (exact), then 2 token-capacity rows; tokens 0-8, 9-11, 12-23, 24-25.
HAND_PACK = ((9, 0, 3, 12), 2)
# The never-consumed slots (token, column) by class (CONTRACT section 2.4), written out:
# (a) tail token 8; (b) the last block's own tokens in columns [0, d): 4-7 and 20-23;
# (c) the short segment 9-11, both columns; (d) token padding 24-25, both columns.
HAND_ZEROS = {(8, 0), (8, 1), (4, 0), (5, 0), (6, 0), (7, 0), (20, 0), (21, 0), (22, 0),
              (23, 0), (9, 0), (9, 1), (10, 0), (10, 1), (11, 0), (11, 1), (24, 0), (24, 1),
              (25, 0), (25, 1)}


@check("zero classes: the never-consumed mask of a hand-built pack")
def _zero_classes(dev):
    from csagate.reference import never_consumed_mask
    from csagate.reference.inputs import offsets

    lens, pad_tokens = HAND_PACK
    cu, _ = offsets(lens, 4)
    mask = never_consumed_mask(cu.to(dev), ratio=4, coff=2, d=1,
                               n_tokens=sum(lens) + pad_tokens)
    got = {tuple(int(i) for i in ix) for ix in mask.nonzero().tolist()}
    expect(got == HAND_ZEROS, f"mask slots differ: missing {sorted(HAND_ZEROS - got)}, extra "
           f"{sorted(got - HAND_ZEROS)}")


ORACLE_PACKS = ((4, 2, 8, (13, 0, 8, 3, 21), 2, 3), (8, 1, 5, (30, 7, 16), 1, 2),
                (2, 2, 3, (1, 5, 0, 4), 3, 1))


@check("oracle: the fp64 oracle agrees with its scalar derivation")
def _oracle(dev):
    from csagate.reference.scalar import check_oracle

    for pack in ORACLE_PACKS:
        found = check_oracle(*pack, device=dev)
        expect(found.ok, found.summary())


# --- implementations through the driver: honest, and one fault each ------------------------------

SEAM_CASE = Case("selftest/r4/c2d4/9+0+3+12+pad2r3t", 2, 4, (9, 0, 3, 12), "padding",
                 "self-test pack: tails, an empty and a short segment, padding", ratio=4,
                 pad_rows=2, pad_tokens=3)


class RefImplementation:
    """The fp32 reference as an implementation with every hook of the gate's own kernels (the
    buffer hooks, the op), and ``fault`` planted into its outputs."""

    name = "selftest"
    supports = Supports()
    deterministic = True

    def __init__(self, fault: str = "", bitwise: tuple[str, ...] = ()):
        self.fault = fault
        self.bitwise = bitwise
        self.forwards = 0
        self.direct: list = []

    def forward_into(self, kv, score, ape, cu, cuc, out, *, ratio, coff):
        from csagate.reference import forward

        self.forwards += 1
        out.copy_(forward(kv, score, ape, cu, cuc, ratio=ratio, coff=coff, n_rows=out.shape[0]))
        if self.fault == "replay" and self.forwards == 3:
            out.copy_(_flip(out, (0, 0)))
        if self.fault == "out_ulp":
            out.copy_(_flip(out, (1, 2)))
        if self.fault == "out_far":
            out[2, 1] += 1.0
        if not self.direct:
            self.direct = [out]
        return None

    def forward(self, kv, score, ape, cu, cuc, n_rows, *, ratio, coff):
        out = torch.empty(n_rows, kv.shape[1] // coff, dtype=torch.bfloat16, device=kv.device)
        self.forward_into(kv, score, ape, cu, cuc, out, ratio=ratio, coff=coff)
        return out

    def backward_into(self, kv, score, ape, cu, cuc, grad_out, dkv, dscore, dape, *, ratio,
                      coff, deterministic=False):
        from csagate.reference import backward, never_consumed_mask

        got = backward(kv, score, ape, cu, cuc, grad_out, ratio=ratio, coff=coff)
        dk, ds = got.dkv, got.dscore
        if self.fault == "swap":
            dk, ds = ds, dk
        if self.fault in ("unwritten", "tiny"):
            mask = never_consumed_mask(cu, ratio=ratio, coff=coff, d=grad_out.shape[1],
                                       n_tokens=kv.shape[0])
            if self.fault == "unwritten":    # the buffer's prefill stays in those slots
                dk = torch.where(mask, dkv, dk)
            else:                            # the first such slot left at 2^-100
                dk = dk.clone()
                dk[tuple(mask.nonzero()[0].tolist())] = 2.0 ** -100
        dkv.copy_(dk)
        dscore.copy_(ds)
        dape += got.dape
        if len(self.direct) == 1:
            self.direct += [dkv, dscore, dape]
        return None

    def through_op(self, kv, score, ape, cu, cuc, grad_out, *, n_rows, ratio, coff):
        if self.fault == "op_alias":
            return self.direct[0], tuple(self.direct[1:])
        out = self.forward(kv, score, ape, cu, cuc, n_rows, ratio=ratio, coff=coff)
        grads = (torch.zeros_like(kv), torch.zeros_like(score), torch.zeros_like(ape))
        self.backward_into(kv, score, ape, cu, cuc, grad_out, *grads, ratio=ratio, coff=coff)
        if self.fault == "op_swap":
            grads = (grads[1], grads[0], grads[2])
        return out, grads


class ForwardOnly:
    """The reference's forward alone: an inference implementation."""

    name = "selftest-forward"
    supports = Supports()
    deterministic = False

    def forward(self, kv, score, ape, cu, cuc, n_rows, *, ratio, coff):
        from csagate.reference import forward

        return forward(kv, score, ape, cu, cuc, ratio=ratio, coff=coff, n_rows=n_rows)


def _judge(impl, dev, contract, case: Case = SEAM_CASE) -> CaseResult:
    """One case through the driver and the runner, as every verdict judges one."""
    from csagate.gates.driver import Driver
    from csagate.gates.runner import run_case

    return run_case(Driver(impl, dev), case, contract)


def _failed_at(result: CaseResult, gate: str, tensor: str) -> bool:
    return result.status == FAIL and any(g.gate == gate and g.tensor == tensor
                                         for g in result.failures)


def _why(result: CaseResult) -> str:
    return (f"{result.status}: " + "; ".join(result.reasons[:2])) if result.reasons else \
        result.status


@check("seam: the reference through the driver passes every gate of both families")
def _honest(dev):
    for contract in (CONTRACTS[4], R128):
        got = _judge(RefImplementation(), dev, contract)
        expect(got.status == PASS, f"ratio={contract.ratio} rules: {_why(got)}")
        expect(any(g.gate == "op" for g in got.gates) == contract.via_op,
               "the op check did not run where the contract asks for it")


# One fault planted in the reference at a time, and the checks it must fail at: (self-test
# name, fault, the ratio of the contract that judges it, the failed (gate, tensor) pairs).
FAULTS = (
    ("seam: swapped dKV and dScore fail G2", "swap", 4, (("G2", "dkv"), ("G2", "dscore"))),
    ("seam: a run-to-run difference fails G1", "replay", 4, (("G1", "out"),)),
    ("seam: a never-consumed slot left unwritten fails zeros and G1", "unwritten", 4,
     (("zeros", "dkv"), ("G1", "dkv"))),
    ("seam: a never-consumed slot left at 2^-100 fails zeros", "tiny", 4, (("zeros", "dkv"),)),
    ("op check: an op that swaps dKV and dScore fails", "op_swap", 128,
     (("op", "dkv"), ("op", "dscore"))),
    ("op check: an op that hands back the direct path's buffers fails", "op_alias", 128,
     (("op", "out"),)),
)


def _fault_fails(fault: str, ratio: int, failures):
    def run(dev):
        got = _judge(RefImplementation(fault), dev, CONTRACTS[ratio])
        expect(all(_failed_at(got, gate, tensor) for gate, tensor in failures), _why(got))
    return run


for _name, _fault, _ratio, _failures in FAULTS:
    check(_name)(_fault_fails(_fault, _ratio, _failures))


@check("seam: a claimed bitwise output is held to its claim")
def _claim(dev):
    from csagate.gates.plugin import applies_of

    impl = RefImplementation("out_ulp", bitwise=("out",))
    expect(applies_of(impl).bitwise == ("out",), "the driver dropped the bitwise claim")
    got = _judge(impl, dev, CONTRACTS[4])
    expect(_failed_at(got, "G2", "out[claimed bitwise]"), _why(got))
    expect(not _failed_at(got, "G2", "out"), "one bf16 step failed the contract's own rule")


@check("seam: a forward-only implementation's backward is n/a, never a pass")
def _forward_only(dev):
    got = _judge(ForwardOnly(), dev, CONTRACTS[4])
    back = [g for g in got.gates if g.tensor.split("[")[0] in ("dkv", "dscore", "dape")]
    expect(got.status == PASS and back and all(g.status == NA for g in back),
           f"backward checks {sorted({g.status for g in back})}: {_why(got)}")


@check("locator: a planted element is found at its row, column and segment")
def _locator(dev):
    got = _judge(RefImplementation("out_far"), dev, CONTRACTS[4])
    where = {w["tensor"]: w for w in got.recorded.get("where", [])}
    first = where.get("out", {}).get("first", {})
    # out row 2 is block 0 of segment 3 (rows: segment 0 has 2, segments 1 and 2 none)
    expect(first.get("index") == [2, 1] and first.get("segment") == 3,
           f"located at {first.get('index')} in segment {first.get('segment')}, planted at "
           "[2, 1] in segment 3")


# --- coverage, case files, the shrinker, loading an adapter --------------------------------------


@check("coverage: an entry no case reaches fails; a stray kernel of a table config fails")
def _coverage(dev):
    from csagate.gates.coverage import table_coverage

    a, b = Selection("fwd", 1, 16, "a"), Selection("fwd", 1, 16, "b")
    stray, beyond = Selection("fwd", 1, 16, "stray"), Selection("fwd", 1, 24, "odd")
    entries = {("fwd", "small", (1, 16)): a, ("fwd", "large", (1, 16)): b}
    expect(table_coverage("fwd", entries, [a, b, beyond]).ok,
           "every entry reached (and a kernel beyond the configs) failed")
    got = table_coverage("fwd", entries, [a])
    expect(not got.ok and got.missing == (b.name,), f"entry b unreached: {got.summary()}")
    got = table_coverage("fwd", entries, [a, b, stray])
    expect(not got.ok and got.unexpected == (stray.name,), f"stray kernel: {got.summary()}")


FILE_CASE = Case("selftest/r8/c2d33/5+0+9+pad3r4t", coff=2, d=33, lens=(5, 0, 9), kind="fuzz",
                 why="every field away from its default", ratio=8, input_seed=11,
                 grad_seed=12, pad_seed=13, scale=8.0, pad_rows=3, pad_tokens=4,
                 inputs="peaked", deterministic=True)


@check("case file: written and read back equal, field by field")
def _case_file(dev):
    import dataclasses

    from csagate.gates import casefile

    doc = casefile.document(FILE_CASE, failing=("G2 out",), implementation="selftest")
    back = casefile.parse(json.loads(json.dumps(doc)))
    for f in dataclasses.fields(Case):
        mine, theirs = getattr(FILE_CASE, f.name), getattr(back.case, f.name)
        expect(mine == theirs and type(mine) is type(theirs),
               f"field {f.name}: wrote {mine!r}, read {theirs!r}")
    expect(back.contract_ratio == 8 and back.failing == ("G2 out",), "the file's record differs")


@check("case file: a field outside its documented range is refused")
def _case_file_bounds(dev):
    from csagate.gates import casefile

    for field_name, value in (("lens", [10 ** 12]), ("pad_rows", 10 ** 12), ("d", 10 ** 9),
                              ("scale", 1e308), ("input_seed", 2 ** 70)):
        doc = casefile.document(FILE_CASE)
        doc["case"][field_name] = value
        try:
            casefile.parse(doc)
        except casefile.CaseFileError:
            continue
        raise Wrong(f"case.{field_name} = {value!r} was accepted")


@check("shrinker: a candidate that passes is never taken; one that fails is")
def _shrinker(dev):
    from csagate.gates import fuzz

    env = fuzz.envelope(Supports(ratios=(4,), coffs=(1,), head_dims=(3, 5)), ratios=(4,))
    case = fuzz.named(Case("", 1, 5, (9, 4), "fuzz", "self-test", ratio=4), "selftest")
    failing = CaseResult(case, FAIL, (GateResult("G2", "out", FAIL, {}),))

    def passes(c):
        return CaseResult(c, PASS, (GateResult("G2", "out", PASS, {}),))

    got = fuzz.shrink(case, failing, passes, env, max_calls=50)
    expect(fuzz.params(got.case) == fuzz.params(case) and got.steps == 0,
           f"a passing candidate was taken: {got.case.name}")

    def fails_at_d3(c):
        return replace(failing, case=c) if c.d == 3 else passes(c)

    got = fuzz.shrink(case, failing, fails_at_d3, env, max_calls=50)
    expect(got.case.d == 3 and got.steps >= 1, f"the failing candidate d=3 was not taken: "
           f"{got.case.name}")


class _ExitsOnConstruction:
    name = "selftest-exits"

    def __init__(self):
        raise SystemExit(0)


@check("loading: an adapter that exits while loading is refused, not obeyed")
def _loading(dev):
    from csagate.gates.implementation import _instantiate
    from csagate.gates.plugin import ImplError

    try:
        _instantiate(_ExitsOnConstruction, "self-test adapter")
    except ImplError:
        return
    raise Wrong("its sys.exit(0) was not turned into a usage error")


# --- running them ------------------------------------------------------------------------------


def run(device) -> SelfTests:
    """Every self-test on ``device``; a check that raises is a failed check."""
    dev = torch.device(device)
    start = perf_counter()
    found = []
    for name, fn in CHECKS:
        try:
            fn(dev)
            found.append(Check(name, True))
        except Wrong as exc:
            found.append(Check(name, False, str(exc)))
        except KeyboardInterrupt:
            raise
        except BaseException as exc:   # a check that cannot run (or exits) is a failed one
            found.append(Check(name, False, f"raised {one_line(exc)}"))
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return SelfTests(str(dev), tuple(found), perf_counter() - start)


_DONE: dict[str, SelfTests] = {}


def ensure(device) -> SelfTests:
    """The self-tests of ``device``, run once per process; :class:`SelfTestFailed` when any
    answer is wrong (then on every call: a broken machinery stays refused)."""
    key = str(torch.device(device))
    if key not in _DONE:
        _DONE[key] = run(device)
    tests = _DONE[key]
    if not tests.ok:
        raise SelfTestFailed(tests)
    return tests
