"""The contract's numbers and declared bucket edges as plain data (docs/CONTRACT.md sections
4.2 and 5.4). ``csagate.gates.comparators`` judges with them; ``csagate.gates.contracts`` states the
rules with them. Importing this imports no torch, so listing or naming cases stays fast.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

COUNT_FRACTION = 0.001   # G2 (ratio=128): calibrated rate of elements off eager (upstream's)
MAX_ABS = 1.6e-2         # G2: out, dKV, dScore: no element further than this
DAPE_MAX_ABS = 1e-3      # G2: dAPE (fp32 atomics)
PARITY_RTOL = 1e-6       # G3
PARITY_ATOL = 1e-4       # G3
R4_FWD_FRACTION = 1e-4   # small ratios' forward: calibrated rate of elements one bf16 step off
# The false-alarm rate of one count check (docs/CONTRACT.md section 4.3): a correct kernel
# whose elements are off independently at no more than the calibrated rate exceeds the
# allowance with probability at most this, at every tensor size.
FALSE_ALARM = 1e-9


def _kl(q: float, r: float) -> float:
    """Kullback-Leibler divergence of Bernoulli(q) from Bernoulli(r), 0 < r < 1."""
    out = 0.0
    if q > 0:
        out += q * math.log(q / r)
    if q < 1:
        out += (1 - q) * math.log((1 - q) / (1 - r))
    return out


@functools.lru_cache(maxsize=4096)
def count_allowance(numel: int, rate: float = COUNT_FRACTION,
                    alpha: float = FALSE_ALARM) -> int:
    """How many of ``numel`` elements may differ: the largest count a correct kernel reaches
    with probability above ``alpha``, by the Chernoff bound
    ``P(X >= k) <= exp(-numel * KL(k/numel || rate))`` for ``X ~ Binomial(numel, rate)``.

    Sound at every size: 6 of 128 elements at rate 1e-3 (where a share of 0.1% allowed 1),
    about ``rate * numel + sqrt(2 * rate * numel * ln(1/alpha))`` on large tensors. When it
    is ``numel`` the count can conclude nothing (``count_informative``).
    """
    if numel <= 0:
        return 0
    if rate <= 0:
        return 0
    limit = math.log(1 / alpha)
    lo, hi = max(0, math.ceil(rate * numel)), numel + 1    # the first k with a small tail
    while lo < hi:
        mid = (lo + hi) // 2
        if mid > rate * numel and numel * _kl(mid / numel, rate) > limit + 1e-9:
            hi = mid
        else:
            lo = mid + 1
    return min(numel, lo - 1)


def count_informative(numel: int, allowed: int | None) -> bool:
    """Whether a count rule can fail anything at this size (False: every element may differ)."""
    return allowed is not None and allowed < numel


@dataclass(frozen=True)
class BucketEdge:
    """A declared bucket boundary: ``bucket`` holds N <= edge (``upper``) or N >= edge."""

    direction: str
    bucket: str
    edge: int
    upper: bool

    def holds(self, n_rows: int) -> bool:
        return n_rows <= self.edge if self.upper else n_rows >= self.edge

    @property
    def label(self) -> str:
        return f"{self.direction} {self.bucket} {'<=' if self.upper else '>='} {self.edge}"
