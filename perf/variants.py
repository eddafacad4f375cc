"""The ratio=128 kernels beyond the tables that the tests build and the PTX hashes cover.

Forward: every arch's table kernels plus the tuning variants (vec 8, unroll, prefetch,
one-exp) that the H200 sweep explores. Backward: the staged table kernels and the register-
window schedules (both coffs, d 128 and 512, vec 1 and 2, both fastexp values, s kept or
recomputed, with and without the L2 prefetch) plus the tables' own regwin kernels. Shared by
the CPU build tests, the GPU contract tests and ``ptx_hashes``, so they cannot drift apart.
Pure Python (no cutlass, no torch).
"""

from __future__ import annotations

from csagate.kernels.schedule import BwdSchedule, FwdSchedule, selectable_any, threads_x_for

FWD_KERNELS = sorted(selectable_any("fwd"), key=lambda cs: (cs[0], cs[1].astuple()))


def fwd_variant(coff, d, vec, tchunks, twophase=False, fastexp=False, unroll=4, prefetch=False,
                oneexp=False):
    """((coff, d), schedule) with the tuning fields set."""
    tx = threads_x_for(d, vec)
    return (coff, d), FwdSchedule(vec, tchunks, tx, twophase, fastexp, unroll, prefetch, oneexp)


FWD_VARIANTS = [
    fwd_variant(1, 128, 8, 4),                                        # vec 8, d=128 (tx 16)
    fwd_variant(1, 512, 8, 4, fastexp=True),                          # vec 8, d=512
    fwd_variant(2, 128, 2, 8, fastexp=True, unroll=8),                # unroll 8, coff 2
    fwd_variant(2, 512, 4, 4, fastexp=True, unroll=2),                # unroll 2, coff 2
    fwd_variant(1, 512, 4, 4, oneexp=True),                           # one exp, exact
    fwd_variant(1, 128, 2, 8, unroll=8, prefetch=True, oneexp=True),  # small bucket: 2 groups
    fwd_variant(1, 128, 4, 4, True, True, unroll=2, prefetch=True),   # large bucket, two-phase
    fwd_variant(2, 128, 2, 8, fastexp=True, prefetch=True),           # coff 2, skipped chunks
    fwd_variant(2, 512, 8, 4, fastexp=True, unroll=2, prefetch=True, oneexp=True),  # vec 8
]

# Staged table kernels; the tables' register-window kernels join BWD_REGWIN below.
_BWD_TABLE = sorted(selectable_any("bwd"), key=lambda cs: (cs[0][1], cs[0][0], cs[1].tag))
BWD_BASE = [(cfg, s) for cfg, s in _BWD_TABLE if not s.regwin]


def _rw(coff: int, d: int, vec: int, tchunks: int, fastexp: bool, goreuse: bool):
    return (coff, d), BwdSchedule(vec, tchunks, threads_x_for(d, vec), fastexp, goreuse, True)


# regwin: both coffs, d 128 and 512, vec 1 and 2, both fastexp values; C*vec 32, 16, 16, 32.
BWD_REGWIN = [
    _rw(1, 128, 2, 8, True, True),     # 256 threads, 2 CTAs per SM: the register-tightest
    _rw(2, 128, 1, 16, False, True),   # exact exp, vec 1, 512 threads
    _rw(1, 512, 2, 16, True, False),   # goreuse off
    _rw(2, 512, 2, 16, True, True),
]
# regwin at 1024 threads per SM (64 registers): 512- and 1024-thread CTAs, both coffs.
BWD_REGWIN += [
    ((1, 128), BwdSchedule(1, 16, 32, True, True, True, sm_threads=1024)),
    ((1, 128), BwdSchedule(2, 32, 32, True, False, True, sm_threads=1024)),
    ((2, 128), BwdSchedule(1, 32, 32, True, True, True, sm_threads=1024)),
    ((2, 512), BwdSchedule(2, 32, 32, True, True, True, sm_threads=1024)),
]
# s kept in registers (keeps) with an L2 prefetch of the rows ahead (l2pf; 2 also takes the
# prologue's prefetch), the 512-thread window the sm_90a tables shipped before keeps, keeps
# with both of its options, and keeps alone at C*vec = 32.
BWD_REGWIN += [
    ((1, 512), BwdSchedule(2, 8, 32, True, False, True, keeps=True, l2pf=1)),
    ((2, 128), BwdSchedule(1, 16, 32, True, True, True, l2pf=2)),
    ((1, 128), BwdSchedule(2, 16, 32, True, False, True)),
    ((1, 128), BwdSchedule(2, 16, 32, True, False, True, keeps=True, vsm=True, keepdp=True)),
    ((2, 512), BwdSchedule(2, 16, 32, True, False, True, keeps=True)),
]
# the c1d128 sm_90a entries that sweep 5 replaced: small (vec 1, goreuse, no keeps) and
# default (keeps with vsm at tchunks 16)
BWD_REGWIN += [
    ((1, 128), BwdSchedule(1, 16, 32, True, True, True)),
    ((1, 128), BwdSchedule(2, 16, 32, True, False, True, keeps=True, vsm=True)),
]
# the four sm_90a default entries before the APE moved to shared memory (fifth session)
BWD_REGWIN += [
    ((1, 128), BwdSchedule(2, 8, 32, True, False, True, keeps=True, vsm=True, keepdp=True)),
    ((2, 128), BwdSchedule(2, 16, 32, True, False, True, keeps=True, keepdp=True)),
    ((1, 512), BwdSchedule(2, 8, 32, True, False, True, keeps=True, keepdp=True)),
    ((2, 512), BwdSchedule(2, 16, 32, True, False, True, keeps=True, keepdp=True)),
]
# the three sm_90a entries before grad_out was kept packed (gopack, fifth session)
BWD_REGWIN += [
    ((1, 128), BwdSchedule(1, 16, 32, True, False, True, keeps=True)),
    ((2, 128), BwdSchedule(2, 16, 32, True, False, True, keeps=True, keepdp=True, apesm=True)),
    ((2, 512), BwdSchedule(2, 16, 32, True, False, True, keeps=True, keepdp=True, apesm=True)),
]
# the two c1 sm_90a entries before grad_out went to shared memory (gosm, fifth session)
BWD_REGWIN += [
    ((1, 128), BwdSchedule(2, 8, 32, True, False, True, keeps=True, vsm=True, keepdp=True,
                           apesm=True)),
    ((1, 512), BwdSchedule(2, 8, 32, True, False, True, keeps=True, keepdp=True, apesm=True)),
    # and the c2d512 entry before its APE copy went by cp.async
    ((2, 512), BwdSchedule(2, 16, 32, True, True, True, keeps=True, keepdp=True, apesm=True,
                           gopack=True)),
]
BWD_REGWIN += [(cfg, s) for cfg, s in _BWD_TABLE if s.regwin and (cfg, s) not in BWD_REGWIN]
