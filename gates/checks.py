"""The gate checks, under their former single name: the contract's numbers
(:mod:`csagate.gates.limits`), the comparators (:mod:`csagate.gates.comparators`) and the
coverage check (:mod:`csagate.gates.coverage`)."""

from csagate.gates.comparators import *  # noqa: F403
from csagate.gates.comparators import __all__ as _comparators
from csagate.gates.coverage import *  # noqa: F403
from csagate.gates.coverage import __all__ as _coverage
from csagate.gates.limits import (
    COUNT_FRACTION,
    DAPE_MAX_ABS,
    MAX_ABS,
    PARITY_ATOL,
    PARITY_RTOL,
    R4_FWD_FRACTION,
    BucketEdge,
    count_allowance,
)

__all__ = [*_comparators, *_coverage, "COUNT_FRACTION", "DAPE_MAX_ABS", "MAX_ABS",
           "PARITY_ATOL", "PARITY_RTOL", "R4_FWD_FRACTION", "BucketEdge", "count_allowance"]
