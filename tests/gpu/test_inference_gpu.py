"""GPU: ``decode`` keeps its bitwise claim on CUDA (the claim was measured on the CPU by the
tests of tests/test_inference_impls.py; on the GPU the reference's ``exp`` is CUDA's, and
decode computes with the same device's ops, so the claim must hold there too)."""

from __future__ import annotations

import pytest
import torch
from csagate.gates.contracts import CONTRACTS
from csagate.gates.driver import Driver
from csagate.gates.inference_impls import Decode
from csagate.gates.runner import run_case
from csagate.gates.verdict import PASS

pytestmark = pytest.mark.gpu

# the short named cases of each family, the non-finite ones included
SHORT = ("ragged3", "edgepack", "overflow", "pad")


@pytest.mark.parametrize("ratio", [4, 128])
def test_decode_keeps_its_bitwise_claim_on_the_gpu(ratio):
    contract = CONTRACTS[ratio]
    cases = [c for c in contract.cases + contract.hardening
             if any(word in c.name for word in SHORT) and "1x" not in c.name]
    assert cases
    driver = Driver(Decode(), torch.device("cuda", 0))
    for case in cases:
        result = run_case(driver, case, contract)
        claims = [g for g in result.gates if g.tensor == "out[claimed bitwise]"]
        assert result.status == PASS, (case.name, [(g.gate, g.tensor, g.reason)
                                                   for g in result.gates if g.status != PASS])
        assert case.inputs == "overflow" or claims, case.name
