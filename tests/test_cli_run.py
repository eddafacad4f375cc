"""``csagate run`` and ``csagate reference`` on a CPU machine.

The exit-3 paths are real (this machine has no GPU). For the paths that need a verdict, the
command's seams (``run.contracts``, ``judging.preflight`` and the built-in ``csagate``)
are replaced with the small cases and the reference-backed stand-in of the kernels
(``gate_backends.use_stand_in``): that is a test double, not an option of the CLI.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from csagate.gates import judging
from gate_backends import (
    SMALL_CASES,
    SMALL_CONTRACT,
    SMALL_DRIFT,
    SMALL_HARDENING,
    SMALL_R4_CASES,
    SMALL_R4_CONTRACT,
    FailingBuildImpl,
    FaultyImpl,
    RefImpl,
    use_stand_in,
)

from csagate import options
from csagate.cli import cli

REPO = Path(__file__).resolve().parents[1]
N, H, N4 = len(SMALL_CASES), len(SMALL_HARDENING), len(SMALL_R4_CASES)
HEAD = f"{N}/{N} + {H}/{H} hardening"
SMALL = {"128": (SMALL_CONTRACT,), "4": (SMALL_R4_CONTRACT,),
         "all": (SMALL_CONTRACT, SMALL_R4_CONTRACT)}


def messages(stderr: str) -> list[str]:
    """stderr as messages: a message wrapped at the width continues on lines indented by two
    spaces; each line fits 80 columns, except one word longer than that (a path) alone on its
    line."""
    out: list[str] = []
    for line in stderr.strip().splitlines():
        assert len(line) <= 80 or " " not in line.strip(), line
        if line.startswith("  ") and out:
            out[-1] += " " + line.strip()
        else:
            out.append(line)
    return out


def case_rows(out: str) -> list[list[str]]:
    """The verdict's case rows (they start with the index): [index, name, marks..., result]."""
    return [line.split() for line in out.splitlines() if line.split()
            and line.split()[0].isdigit()]


def invoke(*args, env=None):
    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)


@pytest.fixture
def cpu_gate(monkeypatch):
    """Route the run command to the small cases and a reference backend (test double)."""
    monkeypatch.setattr(options, "contracts", lambda ratio: SMALL[ratio])
    return use_stand_in(monkeypatch)


# --- could not evaluate: exit 3 with one line ---------------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA GPU")
def _cli_in_a_fresh_process(argv: list[str], report: str) -> subprocess.CompletedProcess:
    """``csagate argv`` in a new interpreter; on its exit, ``report`` (an expression of ``e``,
    the SystemExit, and ``sys``) is printed to stdout."""
    code = ("import sys\n"
            "from csagate.cli import cli\n"
            "try:\n"
            f"    cli({argv!r}, prog_name='csagate')\n"
            "except SystemExit as e:\n"
            f"    print({report})\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


def test_no_gpu_exits_3_with_one_line_before_importing_cutlass():
    proc = _cli_in_a_fresh_process(["run", "--ratio", "128"],
                                   "'cutlass' in sys.modules, e.code")
    assert proc.stdout.strip() == "False 3", proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) <= 2 and all(len(line) <= 80 for line in lines), proc.stderr
    message = " ".join(" ".join(lines).split())
    assert message.startswith("csagate: no CUDA GPU visible")
    assert "needs an H100, H200, B200 or B300 GPU" in message
    assert message.endswith("(nothing was judged)")
    assert ("a CUDA build of torch" in message) == (torch.version.cuda is None)


@pytest.mark.parametrize("cuda", [None, "13.0"])
def test_no_gpu_message_names_a_cuda_build_only_when_torch_is_not_one(cuda):
    from csagate.gates.builtin_impls import no_gpu_message

    message = no_gpu_message("2.11.0", cuda)
    assert ("a CUDA build of torch" in message) == (cuda is None)
    assert (f"CUDA {cuda}" in message) == (cuda is not None)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA GPU")
@pytest.mark.parametrize("args", [["run", "--quick"], ["reference", "--check"]])
def test_no_gpu_exit_3_paths(args):
    result = invoke(*args)
    assert result.exit_code == 3
    assert result.stdout == ""
    assert len(messages(result.stderr)) == 1


def test_missing_dsl_exits_3_with_one_line(monkeypatch):
    import csagate.kernels._dsl as dsl

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(dsl, "device_arch", lambda index=None: "sm_90a")
    monkeypatch.setattr(dsl, "dsl_available",
                        lambda: (False, "nvidia-cutlass-dsl is not importable (ImportError: x)"))
    result = invoke("run", "--ratio", "128")
    assert result.exit_code == 3
    lines = messages(result.stderr)
    assert len(lines) == 1
    assert "nvidia-cutlass-dsl is not importable" in lines[0]
    assert "pip install nvidia-cutlass-dsl==4.8.1" in lines[0]


def test_unsupported_arch_exits_3(monkeypatch):
    import csagate.kernels._dsl as dsl

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "NVIDIA A100")
    monkeypatch.setattr(dsl, "device_arch", lambda index=None: "sm_80")
    result = invoke("run")
    assert result.exit_code == 3
    assert "sm_80" in result.stderr and len(messages(result.stderr)) == 1


def test_device_out_of_range_is_a_usage_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    result = invoke("run", "--device", "3")
    assert result.exit_code == 2
    assert "device 3 does not exist" in result.stderr


def test_build_failure_exits_3(cpu_gate):
    cpu_gate["backend"] = FailingBuildImpl()
    result = invoke("run", "--ratio", "128")
    assert result.exit_code == 3
    assert result.stdout == ""
    last = messages(result.stderr)[-1]
    assert last.startswith("csagate: building ratio=128 c1d128 for sm_90a failed")
    assert "nothing was judged" in last


# --- usage errors: exit 2 -----------------------------------------------------------------------


@pytest.mark.parametrize("args, needle", [
    (["run", "--ratio", "7"], "'7' is not one of '128', '2', '4', '8', '16', '32', 'all'"),
    (["run", "--device", "-1"], "--device"),
    (["run", "--bogus"], "No such option"),
    (["run", "--quick", "--case", "c1d128/1x8192"], "exclusive"),
])
def test_bad_options_exit_2(args, needle):
    result = invoke(*args)
    assert result.exit_code == 2
    assert needle in result.stderr


def test_report_path_in_a_missing_directory_is_a_usage_error(tmp_path):
    result = invoke("run", "--json", str(tmp_path / "nope" / "v.json"))
    assert result.exit_code == 2
    assert "--json" in result.stderr and "does not exist" in result.stderr


def test_a_broken_gate_exits_3(cpu_gate):
    class Broken(RefImpl):
        def kernels(self, ratio, direction, configs=None):
            raise KeyError("tables")

    cpu_gate["backend"] = Broken()
    result = invoke("run")
    assert result.exit_code == 3
    assert result.stdout == ""
    assert messages(result.stderr)[-1] == \
        "csagate: the gate could not finish: KeyError: 'tables'"


def test_unknown_case_exits_2_with_close_names_not_all_of_them():
    result = invoke("run", "--case", "c1d128/1x819")
    assert result.exit_code == 2
    assert "unknown case 'c1d128/1x819'" in result.stderr
    assert "Did you mean 'c1d128/1x8192'" in result.stderr
    assert "See `csagate cases`" in result.stderr
    from csagate.gates.contracts import R4, R128

    named = [c.name for c in R128.all_cases + R4.all_cases if f"'{c.name}'" in result.stderr]
    assert 1 <= len(named) <= 3, named
    assert len(result.stderr) < 400
    r4 = invoke("run", "--case", "r4/c1d128/ragged", "--ratio", "4")   # any option order
    assert r4.exit_code == 2 and "Did you mean 'r4/c1d128/ragged3'" in r4.stderr
    other = invoke("run", "--case", R4.cases[0].name)   # a ratio=4 name under --ratio 128
    assert other.exit_code == 2 and "another family" in other.stderr
    far = invoke("run", "--case", "zzz")
    assert far.exit_code == 2 and "Did you mean" not in far.stderr
    assert "`csagate cases`" in far.stderr


def test_rejecting_a_case_imports_no_torch():
    proc = _cli_in_a_fresh_process(
        ["run", "--case", "c1d128/typo"],
        "e.code, sorted(m for m in ('torch', 'cutlass') if m in sys.modules)")
    assert proc.stdout.strip() == "2 []", proc.stdout + proc.stderr


def test_help_names_the_exit_codes():
    result = invoke("run", "--help")
    assert result.exit_code == 0
    assert "3 could not evaluate" in result.stdout
    for option in ("--json", "--junit-xml", "--case", "--quick", "--device", "--ratio"):
        assert option in result.stdout


# --- a verdict: table on stdout, status on stderr, exit 0/1 --------------------------------------


def test_passing_run_prints_the_table_and_exits_0(cpu_gate):
    result = invoke("run", "--ratio", "128", env={"NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "\x1b[" not in out
    lines = out.splitlines()
    assert lines[-1] == f"GATE PASS {HEAD}"
    rows = case_rows(out)
    names = [SMALL_DRIFT.name, *(c.name for c in SMALL_CASES + SMALL_HARDENING)]
    # one row per named case, in order (drift first, hardening after the cases), each name
    # whole on its row, every mark whole; coverage last
    assert [r[1] for r in rows] == names
    assert [r[0] for r in rows] == [str(i) for i in range(len(names))]
    assert all(r[-1] == "PASS" for r in rows)
    cov = out[out.index("coverage ("):out.index("self-test ")].split()
    assert cov[:5] == ["coverage", "(fwd", "9/9,", "bwd", "6/6,"]
    assert cov[-2:] == ["edges", "36/36)"]
    assert cov[5:-2] == ["-", "-", "-", "-", "PASS"]   # the coverage row's marks
    assert "detail:" not in out and "0 / 0.00e+00" not in out  # the numbers are behind -v
    verbose = invoke("run", "-v", env={"NO_COLOR": "1", "COLUMNS": "200"})
    assert verbose.exit_code == 0, verbose.output
    assert "detail: differing elements" in verbose.stdout
    assert "0 / 0.00e+00" in verbose.stdout and "large" in verbose.stdout
    # status and progress on stderr, not stdout
    assert "built 3 kernel(s)" not in out and "built" in result.stderr
    assert "gate [" in result.stderr and "gate [" not in out


def test_failing_run_exits_1_and_names_the_gate(cpu_gate):
    cpu_gate["backend"] = FaultyImpl("dape", "c1d16/edge")
    result = invoke("run")
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("GATE "))
    assert lines[head] == f"GATE FAIL {N - 1}/{N} + {H}/{H} hardening"
    assert lines[head + 1].startswith("  - c1d16/edge: G2 dape: max_abs 2.")


def test_case_subset_and_quick(cpu_gate):
    pick = [SMALL_CASES[3].name, SMALL_CASES[1].name]
    result = invoke("run", "--case", pick[0], "--case", pick[1])
    assert result.exit_code == 0, result.output
    assert "GATE PASS 2/2 (subset run: schedule coverage not asserted" in result.stdout
    cov = next(line for line in result.stdout.splitlines() if "coverage" in line).split()
    assert cov[:2] == ["coverage", "not"] and cov[-1] == "n/a"   # coverage: not asserted
    # contract order, whatever the order given
    assert result.stdout.index(f" {pick[1]} ") < result.stdout.index(f" {pick[0]} ")
    quick = invoke("run", "--quick")
    assert quick.exit_code == 0
    assert "GATE PASS 2/2 (subset run" in quick.stdout
    assert SMALL_CASES[0].name in quick.stdout and SMALL_CASES[2].name not in quick.stdout


# --- reports ------------------------------------------------------------------------------------


def test_json_report_schema(cpu_gate, tmp_path):
    path = tmp_path / "verdict.json"
    result = invoke("run", "--json", str(path))
    assert result.exit_code == 0, result.output
    doc = json.loads(path.read_text())
    assert doc["schema"] == "csagate.verdict/1"
    assert doc["verdict"] == "PASS" and doc["passed"] == N and doc["total"] == N
    assert doc["hardening_passed"] == H and doc["hardening_total"] == H
    assert doc["full_contract"] is True and doc["reasons"] == []
    from csagate import __version__

    assert doc["csagate_version"] == __version__
    for key in ("backend", "device", "gpu", "arch", "torch", "python"):
        assert key in doc["env"]
    assert doc["seeds"] == {"input": 1234, "grad": 7, "pad_grad": 11, "pad_token": 13}
    assert set(doc["wall_seconds"]) == {"build", "gate", "total"}
    assert doc["build"]["targets"][0] == [4, 2, 16]
    assert doc["drift"]["name"] == SMALL_DRIFT.name and doc["drift"]["status"] == "pass"
    assert [c["name"] for c in doc["cases"]] == [c.name for c in SMALL_CASES + SMALL_HARDENING]
    case = doc["cases"][0]
    for key in ("kind", "config", "lens", "tokens", "rows", "scale", "seeds", "status",
                "seconds", "schedules", "selections", "gates", "recorded", "gate_status"):
        assert key in case
    # c1d16/1x256: exact blocks at coff 1, so no slot is never consumed: zeros judged nothing
    assert case["gate_status"] == {"G1": "pass", "G2": "pass", "G3": "pass",
                                   "zeros": "inconclusive"}
    assert doc["judged_cases"] == N + H and doc["exit_code"] == 0
    assert doc["selftest"]["passed"] == doc["selftest"]["total"] > 30
    g2 = next(g for g in case["gates"] if g["gate"] == "G2" and g["tensor"] == "dkv")
    for key in ("numel", "n_diff", "allowed", "max_abs", "bound", "first_index"):
        assert key in g2["numbers"]
    for key in ("bitwise_equal_to_eager", "err_fused", "err_eager", "dape_replay_delta"):
        assert key in case["recorded"]
    overflow = next(c for c in doc["cases"] if c["kind"] == "overflow")
    assert overflow["recorded"]["err_eager"]["out"] == "inf"   # non-finite -> string
    assert overflow["gate_status"]["G3"] == "skip"
    cov = doc["coverage"]
    assert cov["status"] == "pass" and cov["fwd"]["covered"] == 9 and cov["bwd"]["missing"] == []
    assert cov["fwd"]["table"]["n_entries"] == 9
    assert cov["edges"]["n_probes"] == 36 and cov["edges"]["n_mismatch"] == 0
    partial = next(c for c in doc["cases"] if c["inputs"] == "partial_overflow")
    assert partial["kind"] == "hardening" and partial["recorded"]["eager_nan"]["out"] == 3


def test_json_report_of_a_failure(cpu_gate, tmp_path):
    cpu_gate["backend"] = FaultyImpl("coverage")
    path = tmp_path / "v.json"
    result = invoke("run", "--json", str(path))
    assert result.exit_code == 1
    doc = json.loads(path.read_text())
    assert doc["verdict"] == "FAIL"
    assert doc["coverage"]["fwd"]["missing"] == ["fwd c2d32 large"]
    assert doc["reasons"][0] == "coverage (table entries): no case selects fwd c2d32 large"
    assert doc["reasons"][1].startswith("bucket edges: ")


def test_junit_xml_one_testcase_per_named_gate(cpu_gate, tmp_path):
    cpu_gate["backend"] = FaultyImpl("raises", "c1d16/edge")
    path = tmp_path / "junit.xml"
    result = invoke("run", "--junit-xml", str(path), "--json", str(tmp_path / "v.json"))
    assert result.exit_code == 1
    assert f"GATE FAIL {N - 1}/{N}" in result.stdout
    assert "  - c1d16/edge: raised RuntimeError: CUDA out of memory." in result.stdout
    row = next(ln for ln in result.stdout.splitlines() if " c1d16/edge " in ln)
    assert row.split()[-1] == "FAIL", row
    assert f"GATE FAIL {N - 1}/{N} + {H}/{H} hardening" in result.stdout
    root = ET.parse(path).getroot()
    assert root.tag == "testsuites"
    suite = root.find("testsuite")
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == [SMALL_DRIFT.name, *(c.name for c in SMALL_CASES),
                                              *(c.name for c in SMALL_HARDENING), "coverage"]
    assert suite.get("tests") == str(N + H + 2)
    assert suite.get("errors") == "1" and suite.get("failures") == "0"
    errored = next(c for c in cases if c.get("name") == "c1d16/edge")
    assert errored.find("error").get("message").startswith("RuntimeError: CUDA out of memory")
    passing = next(c for c in cases if c.get("name") == "c1d16/ragged")
    assert passing.find("failure") is None and passing.find("error") is None
    assert "G2 dkv: pass" in passing.find("system-out").text


def test_junit_xml_failure_and_subset_coverage_skip(cpu_gate, tmp_path):
    cpu_gate["backend"] = FaultyImpl("unwritten", "c1d16/ragged")
    path = tmp_path / "junit.xml"
    result = invoke("run", "--case", "c1d16/ragged", "--junit-xml", str(path))
    assert result.exit_code == 1
    suite = ET.parse(path).getroot().find("testsuite")
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    failure = cases["c1d16/ragged"].find("failure")
    assert failure.get("type") == "G1,zeros"
    assert "c1d16/ragged: G1 dkv" in failure.text
    assert cases["coverage"].find("skipped") is not None


# --- csagate reference -------------------------------------------------------------------------


def test_reference_prints_its_source_and_where_it_lives():
    result = invoke("reference")
    assert result.exit_code == 0
    first = result.stdout.splitlines()[0]
    assert first == f"# reference: {REPO / 'reference' / 'compressor.py'}"
    contract = [line for line in result.stdout.splitlines() if line.startswith("# contract:")]
    assert contract == ["# contract:  docs/CONTRACT.md in the csagate repository (the source "
                        "of truth)"], contract
    assert (REPO / "docs" / "CONTRACT.md").is_file()
    assert "def backward(" in result.stdout and "def never_consumed_mask(" in result.stdout


def test_reference_check_pass_and_fail(cpu_gate):
    result = invoke("reference", "--check")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-1] == "DRIFT PASS"
    assert SMALL_DRIFT.name in result.stdout
    cpu_gate["backend"] = FaultyImpl("drift")
    bad = invoke("reference", "--check")
    assert bad.exit_code == 1
    assert "DRIFT FAIL" in bad.stdout
    assert f"{SMALL_DRIFT.name}: drift dscore: 1 of" in bad.stdout
    assert "differ in their bits" in bad.stdout


# --- reports on every exit path -----------------------------------------------------------------


def _reports(tmp_path):
    paths = tmp_path / "v.json", tmp_path / "junit.xml"
    return paths, ["--json", str(paths[0]), "--junit-xml", str(paths[1])]


def _assert_could_not_evaluate(result, paths, needle):
    assert result.exit_code == 3, result.output
    doc = json.loads(paths[0].read_text())
    assert doc["verdict"] == "COULD NOT EVALUATE" and doc["exit_code"] == 3
    assert needle in doc["reason"] and doc["reasons"] == [doc["reason"]]
    assert doc["schema"] == "csagate.verdict/1" and doc["cases"] == [] and doc["drift"] is None
    for key in ("python", "torch", "nvidia_cutlass_dsl"):
        assert key in doc["env"]
    # the reason is the line printed on stderr
    assert f"csagate: {doc['reason']}" in messages(result.stderr)
    suite = ET.parse(paths[1]).getroot().find("testsuite")
    assert suite.get("tests") == "1" and suite.get("errors") == "1"
    (case,) = suite.findall("testcase")
    assert case.get("name") == "could not evaluate"
    assert case.find("error").get("message") == doc["reason"]
    return doc


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA GPU")
def test_no_gpu_still_writes_both_reports(tmp_path):
    paths, args = _reports(tmp_path)
    result = invoke("run", *args)
    _assert_could_not_evaluate(result, paths, "no CUDA GPU visible")
    assert result.stdout == ""


def test_missing_dsl_still_writes_both_reports(monkeypatch, tmp_path):
    def no_dsl(device, kernels):
        from csagate import console
        from csagate.exitcodes import ExitCode

        console.abort("nvidia-cutlass-dsl is not importable (ImportError: x)",
                      ExitCode.COULD_NOT_EVALUATE)

    monkeypatch.setattr(judging, "preflight", no_dsl)
    paths, args = _reports(tmp_path)
    doc = _assert_could_not_evaluate(invoke("run", "--quick", *args), paths,
                                     "nvidia-cutlass-dsl is not importable")
    assert doc["selection"]["quick"] is True and doc["full_contract"] is False


def test_build_failure_still_writes_both_reports(cpu_gate, tmp_path):
    cpu_gate["backend"] = FailingBuildImpl()
    paths, args = _reports(tmp_path)
    doc = _assert_could_not_evaluate(invoke("run", *args), paths, "ptxas error")
    assert doc["env"]["backend"] == "reference (CPU test stand-in)"  # known by then


def test_gate_crash_still_writes_both_reports(cpu_gate, tmp_path):
    class Broken(RefImpl):
        def kernels(self, ratio, direction, configs):
            raise KeyError("tables")

    cpu_gate["backend"] = Broken()
    paths, args = _reports(tmp_path)
    _assert_could_not_evaluate(invoke("run", *args), paths,
                               "the gate could not finish: KeyError: 'tables'")


def test_unexpected_error_is_exit_3_with_reports(cpu_gate, monkeypatch, tmp_path):
    def broken(device, kernels):
        raise OSError("libcuda.so: cannot open shared object file\nsecond line")

    monkeypatch.setattr(judging, "preflight", broken)
    paths, args = _reports(tmp_path)
    result = invoke("run", *args)
    doc = _assert_could_not_evaluate(result, paths, "OSError: libcuda.so: cannot open")
    assert "second line" not in doc["reason"] and "Traceback" not in result.output


def test_exit_code_is_in_every_json_report(cpu_gate, tmp_path):
    path = tmp_path / "v.json"
    assert invoke("run", "--json", str(path)).exit_code == 0
    assert json.loads(path.read_text())["exit_code"] == 0
    cpu_gate["backend"] = FaultyImpl("dape", "c1d16/edge")
    assert invoke("run", "--json", str(path)).exit_code == 1
    doc = json.loads(path.read_text())
    assert doc["exit_code"] == 1 and doc["verdict"] == "FAIL" and doc["reason"] is None
# --- --ratio 4 and --ratio all -------------------------------------------------------------------


def test_ratio4_run_passes_with_its_own_cases(cpu_gate, tmp_path):
    path = tmp_path / "r4.json"
    result = invoke("run", "--ratio", "4", "--json", str(path), env={"NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-1] == f"GATE PASS {N4}/{N4}"
    assert "ratio=4 gate" in result.stdout
    doc = json.loads(path.read_text())
    assert doc["ratio"] == 4 and doc["selection"]["ratio"] == 4
    assert [c["name"] for c in doc["cases"]] == [c.name for c in SMALL_R4_CASES]
    assert doc["coverage"]["edges"] is None and doc["coverage"]["summary"] == "fwd 4/4, bwd 4/4"


def test_ratio_all_runs_both_and_exits_with_the_worse_code(cpu_gate, tmp_path):
    cpu_gate["backend"] = FaultyImpl("count", "r4/c1d16/ragged", n=1)
    junit = tmp_path / "j.xml"
    result = invoke("run", "--ratio", "all", "--json", str(tmp_path / "v.json"),
                    "--junit-xml", str(junit))
    assert result.exit_code == 1
    heads = [ln for ln in result.stdout.splitlines() if ln.startswith("GATE ")]
    assert heads == [f"GATE PASS {HEAD}", f"GATE FAIL {N4 - 1}/{N4}"]
    assert "r4/c1d16/ragged: G2 dkv: 1 of" in result.stdout
    # one report per family, named by its ratio
    small = SMALL_CONTRACT.ratio
    assert json.loads((tmp_path / f"v.r{small}.json").read_text())["verdict"] == "PASS"
    assert json.loads((tmp_path / "v.r4.json").read_text())["verdict"] == "FAIL"
    suite = ET.parse(tmp_path / "j.r4.xml").getroot().find("testsuite")
    assert suite.get("name") == "csagate.ratio4" and suite.get("failures") == "1"
    assert not junit.exists()


def test_ratio_all_with_a_case_runs_only_the_family_that_has_it(cpu_gate):
    result = invoke("run", "--ratio", "all", "--case", "r4/c2d16/edge")
    assert result.exit_code == 0, result.output
    heads = [ln for ln in result.stdout.splitlines() if ln.startswith("GATE ")]
    assert len(heads) == 1 and heads[0].startswith("GATE PASS 1/1 (subset run")
    assert ("GATE PASS 1/1 (subset run: schedule coverage not asserted, not the full contract)"
            in " ".join(result.stdout.split()))  # the headline may wrap at 80 columns
