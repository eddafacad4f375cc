"""The eager references of the CSA compressor: the numerics authority of csagate.

``csagate.reference.compressor`` is the one piece of code the gate and the tests compare against;
read it top to bottom. ``csagate.reference.inputs`` draws the documented input distribution
with the seeds of ``csagate.reference.seeds``. This package never imports cutlass; its names
load on first use, so ``csagate.reference.seeds`` alone imports no torch.
"""

from __future__ import annotations

import importlib

_FROM = {
    "compressor": ("PRECISIONS", "Grads", "backward", "forward", "never_consumed_mask"),
    "inputs": ("Pack", "make_grad_out", "make_pack", "overflow_pack", "pad_nonfinite_slots",
               "partial_overflow_slots", "peaked", "with_values"),
}
_WHERE = {name: module for module, names in _FROM.items() for name in names}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name in _FROM:  # a submodule: ``csagate.reference.compressor``
        return importlib.import_module(f"{__name__}.{name}")
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
