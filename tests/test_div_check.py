"""perf.div_check's operand sets (CPU): the binades and the divisor sample it hands the GPU."""

from __future__ import annotations

import pytest
import torch
from csagate.perf import div_check as D


def test_binade_is_every_significand_in_order():
    xs = D.binade(-1, 1, "cpu")
    assert xs.numel() == 1 << 23
    assert xs[0].item() == 0.5 and xs[-1].item() == 1.0 - 2.0 ** -24
    assert bool((xs[1:] > xs[:-1]).all())
    assert torch.equal(xs.view(torch.int32)[1:] - xs.view(torch.int32)[:-1],
                       torch.ones(xs.numel() - 1, dtype=torch.int32))


def test_divisors_cover_one_to_two_to_the_binades():
    ys = D.divisors(step=1 << 13, binades=6, device="cpu")
    assert ys.numel() == 6 * (1 << 10) + 1
    assert ys.min().item() == 1.0 and ys.max().item() == 64.0
    for b in range(6):
        inside = ys[(ys >= 2.0 ** b) & (ys < 2.0 ** (b + 1))]
        assert inside.numel() == 1 << 10


@pytest.mark.parametrize("e", (0, -65, 1))
def test_check_refuses_dividends_outside_the_fast_path(e):
    with pytest.raises(ValueError, match="outside"):
        D.check(e, torch.ones(1))


def test_binade_refuses_subnormal_and_overflowing_exponents():
    for e in (-127, 128):
        with pytest.raises(ValueError, match="not a normal"):
            D.binade(e, 1, "cpu")
