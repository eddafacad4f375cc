"""The shared-reciprocal division (``kernels/device.py``: ``div_seed``, ``div_by``) bitwise
``div.rn.f32`` on the GPU over its domain, e in [2^-64, 1] and den in [1, 64]: every
significand of three dividend binades against sampled divisors of every den binade
(``perf/div_check.py``; its full run, every significand pair, is in docs/PERF_NOTES.md)."""

from __future__ import annotations

import pytest
import torch
from csagate.kernels._dsl import dsl_available

_DSL_OK, _DSL_WHY = dsl_available()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason="needs a CUDA GPU (run on an H100 or H200)"),
    pytest.mark.skipif(not _DSL_OK, reason=_DSL_WHY or "cutlass DSL unavailable"),
]


@pytest.mark.parametrize("x_binade", (-1, -33, -64))
def test_shared_reciprocal_division_is_div_rn(x_binade):
    from csagate.perf import div_check

    ys = div_check.divisors(step=1 << 11, binades=6)  # 4096 per binade and 64
    res = div_check.check(x_binade, ys)
    assert res.quotients == (1 << 23) * ys.numel()
    assert res.mismatches == 0, (
        f"{res.mismatches} of {res.quotients} quotients differ from div.rn.f32 "
        f"(x in [2^{x_binade}, 2^{x_binade + 1}), e.g. x = {res.first!r})")
