"""The cold bench method on the device: the flush size, the sample count, cold >= warm."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu


def test_l2_flush_covers_twice_the_l2():
    from csagate.perf import bench as B

    flush = B.L2Flush()
    assert flush.nbytes >= 2 * torch.cuda.get_device_properties(0).L2_cache_size
    assert flush.nbytes >= B.FLUSH_MIN_BYTES and flush.buf.numel() == flush.nbytes


def test_cold_copy_is_not_faster_than_warm():
    from csagate.perf import bench as B

    flush = B.L2Flush()
    src = torch.randn(4 << 20, device="cuda")          # 16 MB: L2-resident when warm
    dst = torch.empty_like(src)
    fn = lambda: dst.copy_(src)
    cold = B.cold_median(fn, flush, iters=10, warmup=5)
    assert cold.samples == B.COLD_MIN_ITERS
    warm = B.graph_median(fn, iters=30, warmup=5)
    assert cold.median_us >= 0.9 * warm.median_us


def test_same_size_cold_copy_grows_with_bytes_and_stays_under_the_ceiling():
    """The same-size cold copy: more bytes take longer, and no cold copy of tens of MB beats
    the warm 1 GiB copy ceiling (its fixed start is what the vs-copy column accounts for)."""
    from csagate.perf import bench as B

    flush = B.L2Flush()
    ceiling = B.copy_bandwidth(nbytes=256 << 20, iters=10, warmup=3)
    small = B.cold_copy_us(8 << 20, flush, iters=10, warmup=3)
    large = B.cold_copy_us(128 << 20, flush, iters=10, warmup=3)
    assert 0 < small < large
    assert B.bandwidth(128 << 20, large) < 1.05 * ceiling
