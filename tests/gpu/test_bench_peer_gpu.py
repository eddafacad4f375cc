"""GPU: ``csagate bench --peer cudnn``'s row for one small shape (r4 c2d128, 8192 tokens).

Needs nvidia-cudnn-frontend and a GPU it accepts: below compute capability 10 only with
``CSAGATE_MEASURE_CUDNN_MIN_CC`` set to the GPU's major (a measurement outside the package's
envelope); otherwise the test skips with the package's own reason.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("needs_dsl")]


@pytest.fixture(scope="module")
def peer():
    from csagate.gates.builtin_impls import CUDNN_MEASURE_ENV, Cudnn

    impl = Cudnn()
    why = impl.unavailable(torch.device("cuda", 0))
    if why:
        pytest.skip(f"the cudnn peer cannot run here ({why}); below compute capability 10 "
                    f"set {CUDNN_MEASURE_ENV}=<major> to measure it")
    return impl


def test_peer_row_times_both_sides_on_the_same_inputs(peer):
    from csagate.perf import bench as B
    from csagate.perf.peer import compare_shape

    copy_bw = B.copy_bandwidth(nbytes=256 << 20, iters=5, warmup=2)
    row = compare_shape(peer, 4, 2, 128, 8192, copy_bw=copy_bw, iters=10, warmup=3)
    assert row.config == "r4 c2d128" and row.tokens == 8192
    for us in (*row.ours_fwd_us, *row.peer_fwd_us, *row.ours_bwd_us, *row.peer_bwd_us):
        assert us > 0
    # every sample starts behind the host-hiding sleep, which the events do not include
    assert row.us("ours", "fwd") < 100 and row.us("peer", "fwd") < 100
    for who in ("ours", "peer"):
        for direction in ("fwd", "bwd"):
            assert 0 < row.roofline(who, direction) < 1.5
    assert row.out_max_abs <= 1e-2
    # ratio 4: both packages' dKV/dScore are bitwise the fp32 reference's (docs/CONTRACT.md)
    assert row.bits_equal
