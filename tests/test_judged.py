"""Green means judged, and bounds come before work.

A run, a case, a fuzz run or a comparison that judged no element is never a pass: before any
work it is a usage error (exit 2: nothing selected applies), after it a verdict of its own
(``NOTHING JUDGED`` or ``INCONCLUSIVE``, exit 3). Float options refuse NaN and infinity,
``--out`` is checked before the first trial, a case too large for the machine is refused with
the numbers, and Ctrl-C during ``fuzz`` still writes the failures already shrunk.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import replace

import pytest
import torch
from adapter_source import reference_adapter
from click.testing import CliRunner
from csagate.gates import memory
from csagate.gates.cases import Case
from csagate.gates.contracts import CONTRACTS
from csagate.gates.fuzz import FuzzRun, Trial
from csagate.gates.verdict import (
    ERROR,
    FAIL,
    INCONCLUSIVE,
    NA,
    NOTHING_JUDGED,
    PASS,
    UNTRUSTED,
    CaseResult,
    CoverageResult,
    GateResult,
    Verdict,
    case_status,
)
from gate_backends import SMALL_CONTRACT, SMALL_R4_CONTRACT

from csagate import options
from csagate.cli import cli
from csagate.pytest_plugin import check

ADAPTER = reference_adapter("Supports(ratios=(4,))") + '''

class ForwardOnly(Reference):
    name = "fwd-only"
    backward = None


CALLS = {"n": 0}


class InterruptedOddHeadDim(Reference):
    """out wrong when the head dim is odd; Ctrl-C on its 7th forward (while shrinking)."""
    name = "interrupted"

    def forward(self, kv, score, ape, cu, cuc, n_rows, *, ratio, coff):
        CALLS["n"] += 1
        if CALLS["n"] == 7:
            raise KeyboardInterrupt
        out = super().forward(kv, score, ape, cu, cuc, n_rows, ratio=ratio, coff=coff)
        if out.shape[1] % 2:
            out[-1, 0] += 1.0
        return out
'''


@pytest.fixture
def adapter(tmp_path):
    path = tmp_path / "adapters.py"
    path.write_text(ADAPTER)
    return path


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


# --- the verdict's states ------------------------------------------------------------------------

CASE = Case("c", 1, 4, (8,), "union", "", ratio=4)


def verdict(*statuses, drift=NA, coverage=NA, full=True):
    return Verdict(CaseResult(CASE, drift), tuple(CaseResult(CASE, s) for s in statuses),
                   CoverageResult(coverage, {}, {}), full=full)


@pytest.mark.parametrize("statuses, state", [
    ((), NOTHING_JUDGED),
    ((NA, NA), NOTHING_JUDGED),
    ((INCONCLUSIVE, NA), NOTHING_JUDGED),
    ((PASS, INCONCLUSIVE), INCONCLUSIVE),
    ((PASS, NA), PASS),
    ((PASS, FAIL, INCONCLUSIVE), FAIL),
    ((ERROR,), FAIL),
    ((UNTRUSTED,), FAIL),
])
def test_verdict_states(statuses, state):
    v = verdict(*statuses)
    assert v.state == state and v.ok == (state == PASS)
    word = {PASS: "PASS", FAIL: "FAIL", NOTHING_JUDGED: "NOTHING JUDGED",
            INCONCLUSIVE: "INCONCLUSIVE"}[state]
    assert v.headline.startswith(f"GATE {word} ")
    if state == NOTHING_JUDGED:
        assert v.reasons and "nothing was judged" in v.reasons[-1]


def test_a_failed_drift_check_or_coverage_fails_whatever_the_cases():
    assert verdict(PASS, drift=FAIL).state == FAIL
    assert verdict(PASS, coverage=FAIL).state == FAIL
    assert verdict(NA, coverage=FAIL).state == FAIL


def test_a_case_of_inconclusive_checks_is_not_a_pass():
    inc, na = GateResult("G2", "out", INCONCLUSIVE, {}), GateResult("G1", "dkv", NA, {})
    assert case_status([inc, na]) == INCONCLUSIVE
    assert case_status([inc, GateResult("G1", "out", PASS, {})]) == PASS
    assert case_status([]) == INCONCLUSIVE


def test_fuzz_run_states():
    def trial(status):
        return Trial(0, CASE, status, (), 0.0)

    assert FuzzRun(1).state == NOTHING_JUDGED
    assert FuzzRun(1, trials=[trial(PASS)]).state == PASS
    assert FuzzRun(1, trials=[trial(PASS), trial(INCONCLUSIVE)]).state == INCONCLUSIVE
    assert FuzzRun(1, trials=[trial(INCONCLUSIVE), trial(ERROR)]).state == FAIL


# --- nothing selected applies: exit 2 before any work -------------------------------------------


def test_an_na_case_is_refused_before_any_work():
    result = invoke("run", "--impl", "decode", "--device", "cpu", "--ratio", "4", "--case",
                    "r4/c1d128/edgepack/deterministic")
    assert result.exit_code == 2, result.output
    assert "nothing to judge" in result.stderr and "no deterministic backward" in result.stderr
    assert "GATE PASS" not in result.output and "self-test" not in result.stderr


@pytest.fixture
def small_families(monkeypatch):
    small = {"128": (SMALL_CONTRACT,), "4": (SMALL_R4_CONTRACT,),
             "all": (SMALL_CONTRACT, SMALL_R4_CONTRACT)}
    monkeypatch.setattr(options, "contracts", lambda ratio: small[ratio])


def test_a_full_run_of_a_family_the_adapter_does_not_support_is_refused(small_families,
                                                                          adapter):
    result = invoke("run", "--impl", f"{adapter}:Reference", "--device", "cpu", "--ratio",
                    "128")
    assert result.exit_code == 2, result.output
    assert "nothing to judge" in result.stderr and "ratio 4" in result.stderr


def test_ratio_all_judges_the_families_that_apply_and_names_the_others(small_families,
                                                                         adapter, tmp_path):
    result = invoke("run", "--impl", f"{adapter}:Reference", "--device", "cpu", "--ratio",
                    "all", "--json", tmp_path / "v.json")
    assert result.exit_code == 0, result.output
    assert "ratio=8: nothing applies to ref-adapter" in " ".join(result.stderr.split())
    assert "GATE PASS" in result.stdout and "csagate ratio=8 gate" not in result.stdout
    assert (tmp_path / "v.r4.json").exists() and not (tmp_path / "v.r8.json").exists()


# --- a run that judged nothing: its own verdict, exit 3 -----------------------------------------

# Ratio 4, 3 tokens: no output row, so a forward-only implementation has nothing to judge.
NO_ROWS = Case("r4/c1d4/3", 1, 4, (3,), "union", "no full block", ratio=4)
ROWS = Case("r4/c1d4/9", 1, 4, (9,), "union", "two blocks and a tail", ratio=4)


@pytest.mark.parametrize("cases, word", [((NO_ROWS,), "NOTHING JUDGED"),
                                         ((ROWS, NO_ROWS), "INCONCLUSIVE")])
def test_a_run_that_judged_nothing_is_exit_3_with_its_own_headline(monkeypatch, adapter,
                                                                   tmp_path, cases, word):
    contract = replace(CONTRACTS[4], cases=cases, deterministic_cases=(), coverage_configs=())
    monkeypatch.setattr(options, "contracts", lambda ratio: (contract,))
    report, junit = tmp_path / "v.json", tmp_path / "v.xml"
    result = invoke("run", "--impl", f"{adapter}:ForwardOnly", "--device", "cpu", "--ratio",
                    "4", "--json", report, "--junit-xml", junit)
    assert result.exit_code == 3, result.output
    lines = result.stdout.splitlines()
    headline = next(line for line in lines if line.startswith("GATE "))
    assert headline.startswith(f"GATE {word} ")
    doc = json.loads(report.read_text())
    assert doc["verdict"] == word and doc["exit_code"] == 3 and doc["reason"]
    row = next(c for c in doc["cases"] if c["name"] == NO_ROWS.name)
    assert row["status"] == "inconclusive" and row["gate_counts"].get("pass", 0) == 0
    suite = ET.parse(junit).getroot()
    assert int(suite.get("errors")) >= 1


# --- fuzz: options before work, Ctrl-C keeps what was found -------------------------------------


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN"])
def test_float_options_refuse_nan_and_inf(value, adapter):
    for args in (("fuzz", "--device", "cpu", "--budget", value),
                 ("compare", "--impl", "decode", "--impl", "online-c128", "--device", "cpu",
                  "--max-abs", value),
                 ("compare", "--impl", "decode", "--impl", "online-c128", "--device", "cpu",
                  "--bound", f"out={value}")):
        result = invoke(*args)
        assert result.exit_code == 2, (args, result.output)
        assert "not a finite number" in result.stderr


def test_an_unwritable_out_is_refused_before_the_first_trial(adapter):
    result = invoke("fuzz", "--impl", f"{adapter}:Reference", "--device", "cpu", "--trials",
                    "3", "--out", "/proc/1/zz")
    assert result.exit_code == 2, result.output
    assert "--out" in result.stderr and "trial" not in result.stderr


def test_ctrl_c_while_shrinking_writes_the_shrunk_failure_and_exits_130(adapter, tmp_path):
    out, report = tmp_path / "cases", tmp_path / "f.json"
    result = invoke("fuzz", "--impl", f"{adapter}:InterruptedOddHeadDim", "--device", "cpu",
                    "--trials", 5, "--seed", 12, "--out", out, "--json", report)
    assert result.exit_code == 130, result.output
    files = list(out.glob("*.json"))
    assert len(files) == 1
    text = " ".join(result.stderr.split())
    assert "interrupted after 1 trial(s)" in text and str(out) in text
    doc = json.loads(report.read_text())
    assert doc["stopped"] == "interrupted" and doc["exit_code"] == 130
    assert doc["failures"][0]["case_file"] == str(files[0])


# --- compare ---------------------------------------------------------------------------------


def test_compare_with_no_case_in_both_envelopes_is_refused(adapter):
    result = invoke("compare", "--impl", f"{adapter}:Reference", "--impl", "decode",
                    "--device", "cpu", "--ratio", "128")
    assert result.exit_code == 2 and "nothing to compare" in result.stderr


RAISES = reference_adapter("Supports(ratios=(4,))") + '''

class Raises(Reference):
    name = "raises"

    def forward(self, *args, **kwargs):
        raise RuntimeError("no kernel for this")
'''


def test_compare_where_every_case_raised_is_exit_3(tmp_path):
    path = tmp_path / "raises.py"
    path.write_text(RAISES)
    result = invoke("compare", "--impl", f"{path}:Raises", "--impl", "decode", "--device",
                    "cpu", "--ratio", "4", "--case", "r4/c1d128/overflow")
    assert result.exit_code == 3, result.output
    assert "NOTHING COMPARED" in result.stdout


# --- the pytest plugin -----------------------------------------------------------------------


def test_the_plugin_refuses_a_call_that_judges_nothing(adapter):
    with pytest.raises(pytest.fail.Exception, match="nothing to judge: no case and no fuzz"):
        check(f"{adapter}:Reference", ratio=4, cases=())
    with pytest.raises(pytest.fail.Exception, match="nothing to judge: r4/c1d128/edgepack/"
                                                    "deterministic is n/a for decode"):
        check("decode", ratio=4, cases=["r4/c1d128/edgepack/deterministic"])


# --- memory before work ----------------------------------------------------------------------


def test_the_estimate_grows_with_the_pack_and_names_the_largest_case():
    small, big = CONTRACTS[128].cases[0], CONTRACTS[128].cases[14]   # 8192 and 131072 tokens
    assert memory.case_bytes(big) > memory.case_bytes(small) > memory.WORKING_BYTES
    line = memory.too_large([small, big], "cpu", available=memory.case_bytes(small))
    assert line.startswith(f"{big.name} needs about ") and "GB available" in line
    assert memory.too_large([small], "cpu", available=memory.case_bytes(small)) is None


def test_a_case_file_too_large_for_the_machine_is_refused_with_the_numbers(
        monkeypatch, adapter, tmp_path):
    from csagate.gates import casefile

    monkeypatch.setattr(memory, "available_bytes", lambda device: 1 << 30)
    big = Case("big", 2, 512, (1 << 20,), "fuzz", "", ratio=4)
    path = casefile.write(tmp_path / "big.json", big)
    result = invoke("run", "--case-file", path, "--impl", f"{adapter}:Reference", "--device",
                    "cpu")
    assert result.exit_code == 3, result.output
    text = " ".join(result.stderr.split())
    assert "big needs about" in text and "1.0 GB available" in text
    assert "GATE" not in result.stdout


def test_the_cpu_has_a_number():
    have = memory.available_bytes("cpu")
    assert have is None or have > 0
    assert torch.device("cpu").type == "cpu"


def test_a_gpu_counts_the_blocks_torchs_allocator_holds_unused(monkeypatch):
    """Free GPU memory plus what torch's caching allocator reserved but does not use: the runner
    leaves a small case's blocks cached, and the next case reuses them."""
    gib = 1 << 30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev: (2 * gib, 80 * gib))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda dev: 3 * gib)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda dev: 1 * gib)
    assert memory.available_bytes("cuda:0") == 4 * gib
