"""The README adapter as source text, for the tests that write an adapter file and judge it
through ``--impl path.py:NAME``: ``reference_adapter(...)`` plus a module's own subclasses of
``Reference`` (each planting one fault)."""

from __future__ import annotations


def reference_adapter(supports: str = "Supports()") -> str:
    """The source of a module whose ``Reference`` is the fp32 reference behind the adapter
    protocol (it passes the contract), declaring ``supports``."""
    return f'''
import torch
from csagate.gates.plugin import Supports
from csagate.reference import backward, forward


class Reference:
    """fp32 eager on any device: passes the contract."""
    name = "ref-adapter"
    supports = {supports}

    def forward(self, kv, score, ape, cu, cuc, n_rows, *, ratio, coff):
        return forward(kv, score, ape, cu, cuc, ratio=ratio, coff=coff, n_rows=n_rows)

    def backward(self, kv, score, ape, cu, cuc, grad_out, *, ratio, coff):
        g = backward(kv, score, ape, cu, cuc, grad_out, ratio=ratio, coff=coff)
        return g.dkv, g.dscore, g.dape
'''
