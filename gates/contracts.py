"""The contract families as data: which cases, which tolerance per tensor, which coverage.

The gate runner (``csagate.gates.runner.run_gate``) takes one :class:`Contract` and has no
``if ratio == 4`` of its own: everything that differs between the families is here.

* ``R128`` (docs/CONTRACT.md sections 4-5): the 21 upstream cases and the three hardening
  cases; G2 by a per-element bound and a count allowance at the calibrated rate; coverage over
  every entry of the device's dispatch tables, and the bucket edges pinned to the values
  declared below.
* ``R4`` (section 8): the production ratio=4 kernels; dKV and dScore bitwise equal to the fp32
  reference; the forward within one bf16 step at the calibrated rate of its window; coverage
  over the ratio=4 schedules of the four configs. ratio=4 has no buckets.
* ``CONTRACTS[r]`` for the registry's other small ratios: the same kernel family, under
  the ratio=4 contract (``small_contract``): their own cases (``cases.small_cases``), the same
  rules, the forward's rate and noise floor those of each case's window.

G3 (fp64-oracle parity) always compares with the fp32 reference.

This module and ``csagate.gates.cases`` import no torch (the checks load when a rule is
applied), so ``csagate cases`` and a rejected ``--case`` stay fast.
"""

from __future__ import annotations

from dataclasses import dataclass

from csagate.gates import limits
from csagate.gates.cases import (
    CASES,
    DETERMINISTIC,
    DRIFT,
    HARDENING,
    R4_CASES,
    R4_DETERMINISTIC,
    SMALL_CASES,
    SMALL_DETERMINISTIC,
    Case,
)
from csagate.gates.limits import BucketEdge
from csagate.kernels.registry import SMALL_RATIOS as SMALL_RATIOS_ALL
from csagate.kernels.small_schedule import config_problems

# The version of the contract a verdict was judged by (docs/CONTRACT.md's header; what each
# version changed: CHANGELOG.md): 3 = the reference's own order, bit-pattern equality, count
# allowances sound at every size, G3 of every family against the fp32 reference.
CONTRACT_VERSION = "3"

# The declared bucket edges of the ratio=128 dispatcher (docs/CONTRACT.md section 5.4), stated
# here and not read from csagate.kernels.schedule: the gate pins the dispatcher to them.
R128_EDGES = (
    BucketEdge("fwd", "small", 128, upper=True),    # forward small: N <= 128 rows
    BucketEdge("fwd", "large", 1024, upper=False),  # forward large: N >= 1024 rows
    BucketEdge("bwd", "small", 192, upper=True),    # backward small: N <= 192 rows
)

R4_CONFIGS = ((1, 128), (2, 128), (1, 512), (2, 512))

# The small-ratio forward against the reference: the contract allows an implementation that
# sums in another order one bf16 step (the gate's own kernels are bitwise, which the report
# records). Two fp32 orders of a w-term sum differ by a few fp32 ulps of the largest product
# (<= (w - 1) * 2^-24 * 6 for |kv| <= 6), and two bf16 roundings can add that again; where
# the sum cancels far below its terms, that is several (tiny) bf16 steps: the noise floor,
# never below the ratio=4 floor. The gate reports every element that passed only through it
# (``Steps.n_within_noise``).
R4_FWD_NOISE_ATOL = 8e-6
KV_BOUND = 6.0


def fwd_noise_atol(window: int) -> float:
    return max(R4_FWD_NOISE_ATOL, 2 * (window - 1) * 2.0**-24 * KV_BOUND)


def fwd_fraction(window: int) -> float:
    """The calibrated rate of forward elements one bf16 step off the reference for a window
    of ``window`` = coff * ratio positions: 1e-4 up to 8 products, then in proportion to the
    window (two fp32 orders of a w-term sum differ by O(w) ulps; H200, 2026-12-01: 1.3e-4 of
    the elements at w = 64 for an order other than the reference's)."""
    return limits.R4_FWD_FRACTION * max(1.0, window / 8)


@dataclass(frozen=True)
class Rule:
    """How G2 judges one tensor against the fp32 reference (docs/CONTRACT.md section 4).

    * ``bitwise``: equal bit patterns (``comparators.bitwise``: -0.0 is not +0.0, NaN == NaN).
    * ``tolerance``: every element within ``bound * scale**scale_power`` and, where
      ``fraction`` is set, the differing count within ``limits.count_allowance`` at that
      calibrated rate.
    * ``bf16_steps``: every element within one bf16 step (or the window's fp32 noise floor),
      the count within the allowance at the window's calibrated rate (``fwd_fraction``).
    """

    check: str
    bound: float = 0.0
    fraction: float | None = None
    scale_power: int = 1

    def apply(self, fused, ref, *, window: int, scale: float = 1.0, mask=None):
        from csagate.gates import comparators  # torch: only when a gate judges tensors

        if self.check == "bitwise":
            return comparators.bitwise(fused, ref, mask=mask)
        if self.check == "bf16_steps":
            return comparators.bf16_steps(fused, ref, fraction=fwd_fraction(window),
                                          noise_atol=fwd_noise_atol(window) * scale,
                                          mask=mask)
        if self.check == "tolerance":
            numel = fused.numel() if mask is None else comparators.count(mask)
            return comparators.tolerance(fused, ref, bound=self.bound * scale ** self.scale_power,
                                         allowed=self.allowance(numel), mask=mask)
        raise ValueError(f"unknown G2 rule {self.check!r}")

    def allowance(self, numel: int) -> int | None:
        """How many of ``numel`` judged elements may differ (None: the count is not gated)."""
        return None if self.fraction is None else limits.count_allowance(numel, self.fraction)


@dataclass(frozen=True)
class Contract:
    """One contract family: its cases, its per-tensor rules, its coverage source."""

    ratio: int
    drift: Case
    cases: tuple[Case, ...]              # the upstream/named cases, in order
    hardening: tuple[Case, ...]          # run after them, required for a pass
    g2: tuple[tuple[str, Rule], ...]     # (tensor, rule) for out, dkv, dscore, dape
    coverage_configs: tuple[tuple[int, int], ...] | None  # None: every config of the tables
    edges: tuple[BucketEdge, ...]        # declared bucket edges (none: no buckets)
    via_op: bool = False                 # also run each case through the torch op (gate "op")
    # run last, with deterministic=True: G1 covers dAPE bitwise too (CONTRACT.md 2.5)
    deterministic_cases: tuple[Case, ...] = ()

    @property
    def all_cases(self) -> tuple[Case, ...]:
        return self.cases + self.hardening + self.deterministic_cases

    def rule(self, tensor: str) -> Rule:
        return dict(self.g2)[tensor]

    @property
    def title(self) -> str:
        return f"ratio={self.ratio}"


R128 = Contract(
    ratio=128, drift=DRIFT, cases=CASES, hardening=HARDENING,
    g2=(("out", Rule("tolerance", limits.MAX_ABS, limits.COUNT_FRACTION, 1)),
        ("dkv", Rule("tolerance", limits.MAX_ABS, limits.COUNT_FRACTION, 1)),
        ("dscore", Rule("tolerance", limits.MAX_ABS, limits.COUNT_FRACTION, 2)),
        ("dape", Rule("tolerance", limits.DAPE_MAX_ABS, None, 2))),
    coverage_configs=None, edges=R128_EDGES, via_op=True,
    deterministic_cases=DETERMINISTIC)

def small_contract(ratio: int, cases: tuple[Case, ...], deterministic_cases: tuple[Case, ...]
                   ) -> Contract:
    """The ratio=4 contract at a small ratio: dKV/dScore bitwise, the forward within one bf16
    step at the calibrated rate of its own window (``fwd_fraction(coff * ratio)``), dAPE
    within 1e-3, G3 against the fp32 reference."""
    return Contract(
        ratio=ratio, drift=DRIFT, cases=cases, hardening=(),
        g2=(("out", Rule("bf16_steps")),
            ("dkv", Rule("bitwise")),
            ("dscore", Rule("bitwise")),
            ("dape", Rule("tolerance", limits.DAPE_MAX_ABS, None, 2))),
        coverage_configs=tuple(c for c in R4_CONFIGS if not config_problems(ratio, *c)),
        edges=(),
        deterministic_cases=deterministic_cases)


R4 = small_contract(4, R4_CASES, R4_DETERMINISTIC)

# In run order (``csagate run --ratio all``): 128, then the small ratios ascending (the
# registry's list; 4 with its own cases).
CONTRACTS: dict[int, Contract] = {128: R128} | {
    r: R4 if r == 4 else small_contract(r, SMALL_CASES[r], SMALL_DETERMINISTIC[r])
    for r in sorted(SMALL_RATIOS_ALL)}
