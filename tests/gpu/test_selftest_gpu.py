"""The gate's known-answer self-tests on the GPU, where the gate judges its own kernels: every
answer right on CUDA tensors (the reference, the comparators and the driver seam on the
device), fast, and the fp64 oracle on the GPU agrees with its scalar derivation at every
ratio family."""

from __future__ import annotations

import pytest
from csagate.gates import selftest
from csagate.reference.scalar import check_oracle

pytestmark = pytest.mark.gpu


def test_every_self_test_passes_on_cuda_and_fast():
    """Warm, the 40 checks take well under a second: the best of three warm runs is held to
    it (another process on the device slows a run, never speeds one up)."""
    first = selftest.run("cuda:0")
    assert first.ok, first.message()
    warm = [selftest.run("cuda:0") for _ in range(3)]
    assert all(r.ok for r in warm), [r.message() for r in warm if not r.ok]
    assert min(r.seconds for r in warm) < 1.0, [r.seconds for r in warm]


@pytest.mark.parametrize("ratio, coff, d, lens", [
    (2, 2, 7, (1, 5, 0, 4, 33)), (4, 2, 128, (13, 0, 8, 3, 21)), (8, 1, 5, (30, 7, 16)),
    (16, 2, 3, (15, 49, 0)), (32, 1, 4, (31, 97)), (128, 1, 4, (300, 127, 256)),
    (128, 2, 2, (300, 129, 0, 127))])
def test_the_oracle_on_cuda_agrees_with_its_scalar_derivation(ratio, coff, d, lens):
    found = check_oracle(ratio, coff, d, lens, 2, 3, device="cuda:0")
    assert found.ok, found.summary()
