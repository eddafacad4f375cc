"""The ratio=128 forward kernels the tests build and run: every arch's table kernels plus the
tuning variants (vec 8, unroll, prefetch, one-exp) that the H200 sweep explores. Shared by the
CPU build test and the GPU contract test so the two cannot drift apart."""

from csagate.kernels.schedule import FwdSchedule, selectable_any, threads_x_for

KERNELS = sorted(selectable_any("fwd"), key=lambda cs: (cs[0], cs[1].astuple()))


def variant(coff, d, vec, tchunks, twophase=False, fastexp=False, unroll=4, prefetch=False,
            oneexp=False):
    """((coff, d), schedule) with the tuning fields set."""
    tx = threads_x_for(d, vec)
    return (coff, d), FwdSchedule(vec, tchunks, tx, twophase, fastexp, unroll, prefetch, oneexp)


VARIANTS = [
    variant(1, 128, 8, 4),                                        # vec 8, d=128 (threads_x 16)
    variant(1, 512, 8, 4, fastexp=True),                          # vec 8, d=512
    variant(2, 128, 2, 8, fastexp=True, unroll=8),                # unroll 8, coff 2
    variant(2, 512, 4, 4, fastexp=True, unroll=2),                # unroll 2, coff 2
    variant(1, 512, 4, 4, oneexp=True),                           # one exp, exact
    variant(1, 128, 2, 8, unroll=8, prefetch=True, oneexp=True),  # small bucket: C = 2 groups
    variant(1, 128, 4, 4, True, True, unroll=2, prefetch=True),   # large bucket, two-phase
    variant(2, 128, 2, 8, fastexp=True, prefetch=True),           # coff 2, skipped chunks
    variant(2, 512, 8, 4, fastexp=True, unroll=2, prefetch=True, oneexp=True),  # vec 8, C=64
]
