"""The shared-reciprocal division (``kernels/device.py``: ``div_seed``, ``div_by``) bitwise
``div.rn.f32`` on the GPU over its domain, e in [2^-64, 1] and den in [1, 64]: every
significand of three dividend binades against sampled divisors of every den binade
(``perf/div_check.py``; its full run, every significand pair, is in docs/PERF_NOTES.md)."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("needs_dsl")]


@pytest.mark.parametrize("x_binade", (-1, -33, -64))
def test_shared_reciprocal_division_is_div_rn(x_binade):
    from csagate.perf import div_check

    ys = div_check.divisors(step=1 << 11, binades=6)  # 4096 per binade and 64
    res = div_check.check(x_binade, ys)
    assert res.quotients == (1 << 23) * ys.numel()
    assert res.mismatches == 0, (
        f"{res.mismatches} of {res.quotients} quotients differ from div.rn.f32 "
        f"(x in [2^{x_binade}, 2^{x_binade + 1}), e.g. x = {res.first!r})")
