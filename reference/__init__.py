"""The eager references of the CSA compressor: the numerics authority of csagate.

``csagate.reference.compressor`` is the one piece of code the gate and the tests compare against;
read it top to bottom. ``csagate.reference.inputs`` draws the documented input distribution.
This package never imports cutlass.
"""

from csagate.reference.compressor import (
    PRECISIONS,
    Grads,
    backward,
    forward,
    never_consumed_mask,
)
from csagate.reference.inputs import (
    Pack,
    make_grad_out,
    make_pack,
    overflow_pack,
    pad_nonfinite_slots,
    partial_overflow_slots,
    with_values,
)

__all__ = [
    "PRECISIONS",
    "Grads",
    "Pack",
    "backward",
    "forward",
    "make_grad_out",
    "make_pack",
    "never_consumed_mask",
    "overflow_pack",
    "pad_nonfinite_slots",
    "partial_overflow_slots",
    "with_values",
]
