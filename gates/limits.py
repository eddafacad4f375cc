"""The contract's numbers and declared bucket edges as plain data (docs/CONTRACT.md sections
4.2 and 7.3). ``csagate.gates.comparators`` judges with them; ``csagate.gates.contracts`` states the
rules with them. Importing this imports no torch, so listing or naming cases stays fast.
"""

from __future__ import annotations

from dataclasses import dataclass

COUNT_FRACTION = 0.001   # G2: at most 0.1% of the elements may differ (at least 1)
MAX_ABS = 1.6e-2         # G2: out, dKV, dScore
DAPE_MAX_ABS = 1e-3      # G2: dAPE (fp32 atomics)
PARITY_RTOL = 1e-6       # G3
PARITY_ATOL = 1e-4       # G3
R4_FWD_FRACTION = 1e-4   # ratio=4 forward: at most 0.01% of the elements one bf16 step off


def count_allowance(numel: int, fraction: float = COUNT_FRACTION) -> int:
    """How many elements G2 lets differ: ``max(1, int(fraction * numel))``."""
    return max(1, int(fraction * numel))


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
