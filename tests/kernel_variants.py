"""Test helper: the ratio=128 kernels the tests build: the table kernels, and the twins built
from their fields where a test needs one (the bitwise oracle of an option that changes no bit).

Shared by the CPU build tests and the GPU contract tests, so they cannot drift apart. Pure
Python (no cutlass, no torch).
"""

from __future__ import annotations

from dataclasses import replace

from csagate.kernels.schedule import FwdForm, restrict, selectable_any, threads_x_for

FWD_KERNELS = sorted(selectable_any("fwd"), key=lambda cs: (cs[0], cs[1].astuple(), cs[1].tag))
_BWD_TABLE = sorted(selectable_any("bwd"), key=lambda cs: (cs[0][1], cs[0][0], cs[1].tag))
BWD_BASE = [(cfg, s) for cfg, s in _BWD_TABLE if not s.regwin]   # staged table kernels
BWD_REGWIN = [(cfg, s) for cfg, s in _BWD_TABLE if s.regwin]     # register-window ones


def fwd_twin(cfg, sched):
    """The plain vec-2 unroll-4 loop of a forward schedule, with its tchunks, fastexp and
    two-phase choice: the same bits (vec, unroll, prefetch and the one-exp step change none)."""
    form = FwdForm.ONLINE if sched.form is FwdForm.ONEEXP else sched.form
    return replace(sched, vec=2, threads_x=threads_x_for(cfg[1], 2), form=form, unroll=4,
                   prefetch=False)


def staged_twin(sched):
    """The staged backward of a register-window schedule (its options dropped): its bitwise
    oracle."""
    return restrict(replace(sched, regwin=False))


# (cfg, kernel, twin): each table forward whose plain twin is another kernel
FWD_TWINS = [(cfg, s, fwd_twin(cfg, s)) for cfg, s in FWD_KERNELS if fwd_twin(cfg, s) != s]
BWD_TWINS = [(cfg, s, staged_twin(s)) for cfg, s in BWD_REGWIN]
