"""The memory a case needs, against what it takes: for the largest named case of every family,
judged on the CPU with a reference-backed implementation in a fresh process, the measured peak
resident size stays under the estimate ``csagate`` refuses cases by (``gates.memory``), and
README states each family's peak within that estimate. Slow on 2 cores (about 2 minutes in all,
the ratio=128 case one of them): the references are evaluated in row chunks, so the peak is
the gate's own tensors, not the references' temporaries."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from csagate.gates.contracts import CONTRACTS
from csagate.gates.memory import GB, case_bytes

ROOT = Path(__file__).resolve().parents[1]

MEASURE = """
import resource, sys, torch
from csagate.gates.contracts import CONTRACTS
from csagate.gates.driver import Driver
from csagate.gates.runner import run_case
from csagate.gates.selftest import RefImplementation

contract = CONTRACTS[int(sys.argv[1])]
case = next(c for c in contract.all_cases if c.name == sys.argv[2])
result = run_case(Driver(RefImplementation(), torch.device("cpu")), case, contract)
print(result.status, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""


def largest(ratio: int):
    return max(CONTRACTS[ratio].all_cases, key=case_bytes)


@pytest.mark.xdist_group(name="memory")
@pytest.mark.parametrize("ratio", list(CONTRACTS))
def test_the_largest_case_of_each_family_stays_under_its_estimate(ratio):
    case = largest(ratio)
    proc = subprocess.run([sys.executable, "-c", MEASURE, str(ratio), case.name],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    status, peak = proc.stdout.split()
    assert status == "pass"
    assert int(peak) <= case_bytes(case), (f"{case.name}: measured {int(peak) / GB:.2f} GiB > "
                                           f"estimated {case_bytes(case) / GB:.2f} GiB")


def test_readme_states_each_familys_peak_within_the_estimate():
    text = (ROOT / "README.md").read_text()
    section = text[text.index("| family | largest case |"):]
    rows = re.findall(r"^\| (\d+) \| `([^`]+)` \| ([\d.]+) GiB \| ([\d.]+) GiB \|", section,
                      re.M)
    assert {int(r) for r, *_ in rows} == set(CONTRACTS)
    for ratio, name, measured, estimated in rows:
        case = largest(int(ratio))
        assert name == case.name
        assert float(estimated) == round(case_bytes(case) / GB, 1)
        assert float(measured) <= float(estimated)
