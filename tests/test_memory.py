"""The memory a case needs, against what it takes: for the largest named case of every family,
judged on the CPU with a reference-backed implementation in a fresh process, the measured peak
resident size stays under the estimate ``csagate`` refuses cases by (``gates.memory``), and
README states each family's peak within that estimate. The references are evaluated in row
chunks and judged in pieces (``gates.piecewise``), so the peak is the gate's own tensors (the
inputs and two runs of the implementation's outputs), not the references'.

The implementation computes each direction once and copies its first call's buffers, which the
gate holds anyway, into the later ones: the gate holds what it holds for any implementation,
and the three runs and the op check cost one evaluation (the ratio=128 case, the slowest, about
40 s on one thread). One torch thread: the other test worker has the other core. The peak is
the process's own high-water mark (``VmHWM``): ``getrusage``'s ``ru_maxrss`` would also count the
size of the test process it was forked from."""

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
import sys, torch
from csagate.gates.contracts import CONTRACTS
from csagate.gates.driver import Driver
from csagate.gates.runner import run_case
from csagate.gates.selftest import RefImplementation
from csagate.reference.compressor import backward_pieces

torch.set_num_threads(1)


class Once(RefImplementation):
    def forward_into(self, kv, score, ape, cu, cuc, out, *, ratio, coff):
        if self.direct:
            out.copy_(self.direct[0])
            return None
        return super().forward_into(kv, score, ape, cu, cuc, out, ratio=ratio, coff=coff)

    def backward_into(self, kv, score, ape, cu, cuc, grad_out, dkv, dscore, dape, *, ratio,
                      coff, deterministic=False):
        if len(self.direct) < 4:   # written piece by piece: no whole reference of its own
            for got in backward_pieces(kv, score, ape, cu, cuc, grad_out, ratio=ratio,
                                       coff=coff):
                dkv[got.start:got.end] = got.dkv
                dscore[got.start:got.end] = got.dscore
            self.dape = got.dape
            self.direct += [dkv, dscore, dape]
        else:
            dkv.copy_(self.direct[1])
            dscore.copy_(self.direct[2])
        dape += self.dape
        return None


contract = CONTRACTS[int(sys.argv[1])]
case = next(c for c in contract.all_cases if c.name == sys.argv[2])
impl = Once()
result = run_case(Driver(impl, torch.device("cpu")), case, contract)
peak = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status")
            if line.startswith("VmHWM:"))
print(result.status, impl.forwards, peak)
"""


def largest(ratio: int):
    return max(CONTRACTS[ratio].all_cases, key=case_bytes)


@pytest.mark.parametrize("ratio", list(CONTRACTS))
def test_the_largest_case_of_each_family_stays_under_its_estimate(ratio):
    case = largest(ratio)
    proc = subprocess.run([sys.executable, "-c", MEASURE, str(ratio), case.name],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    status, forwards, peak = proc.stdout.split()
    assert status == "pass" and forwards == "1", proc.stdout  # judged, one evaluation
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


def test_after_a_gpu_case_the_runner_releases_only_a_large_ones_memory(monkeypatch):
    """On a GPU the runner collects garbage and empties torch's cache after a case only when the
    case's own tensors reach ``RELEASE_BYTES`` (a full collection costs about 0.1 s, and the
    self-tests judge ten small cases before every verdict); on the CPU never."""
    from csagate.gates import runner
    from csagate.gates.memory import tensor_bytes

    calls = []
    monkeypatch.setattr(runner.gc, "collect", lambda: calls.append("collect"))
    monkeypatch.setattr(runner.torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    small, large = largest(2), largest(128)
    assert tensor_bytes(small) < runner.RELEASE_BYTES <= tensor_bytes(large)
    runner._release("cpu", large)
    runner._release("cuda:0", small)
    assert calls == []
    runner._release("cuda:0", large)
    assert calls == ["collect", "empty_cache"]
