"""``csagate run``'s report options on a CPU machine: every path is checked before anything
runs, ``-`` is stdout, the reports name the versions and the family. The gate path runs with
the reference-backed stand-ins of ``gate_backends`` (the command's module-level seams)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest
from click.testing import CliRunner
from csagate.gates import judging
from csagate.gates.contracts import CONTRACT_VERSION
from csagate.gates.errors import short_error
from gate_backends import SMALL_FAMILIES, small_gate

from csagate import __version__, console, options, render
from csagate.cli import cli
from csagate.exitcodes import ExitCode


@pytest.fixture
def gate(monkeypatch):
    """The small contracts and the reference backend; counts how often the gate started."""
    return small_gate(monkeypatch)


def invoke(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def _bad_paths(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    return {
        "in /proc": "/proc/csagate-report.json",
        "under a file": str(a_file / "v.json"),
        "empty": "",
        "a directory": str(tmp_path),
        "missing directory": str(tmp_path / "nope" / "v.json"),
    }


@pytest.mark.parametrize("option", ["--json", "--junit-xml"])
@pytest.mark.parametrize("what", ["in /proc", "under a file", "empty", "a directory",
                                  "missing directory"])
def test_a_bad_report_path_is_a_usage_error_before_anything_runs(gate, tmp_path, option, what):
    result = invoke("run", option, _bad_paths(tmp_path)[what])
    assert result.exit_code == 2, result.output
    assert gate["preflights"] == 0                        # nothing ran
    error = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(error) == 1 and option in error[0], result.stderr
    assert "GATE" not in result.output


def test_the_same_path_for_both_reports_is_a_usage_error(gate, tmp_path):
    path = str(tmp_path / "r.out")
    result = invoke("run", "--json", path, "--junit-xml", path)
    assert result.exit_code == 2 and "--junit-xml" in result.stderr
    assert "also the path of --json" in result.stderr and gate["preflights"] == 0
    both = invoke("run", "--json", "-", "--junit-xml", "-")
    assert both.exit_code == 2 and gate["preflights"] == 0
    # the same file spelled two ways, and under --ratio all (one file per family each)
    clash = invoke("run", "--ratio", "all", "--json", str(tmp_path / "a.xml"),
                   "--junit-xml", f"{tmp_path}/./a.xml")
    assert clash.exit_code == 2 and "also the path of --json" in clash.stderr


def test_checking_a_path_leaves_no_file_behind(gate, tmp_path):
    path = tmp_path / "v.json"
    result = invoke("run", "--json", str(path), "--device", "0", "--quick", "--case", "x")
    assert result.exit_code == 2 and not path.exists()


def test_json_to_stdout_keeps_stdout_valid_json(gate):
    result = invoke("run", "--json", "-")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)                       # stdout is the report alone
    assert doc["verdict"] == "PASS"
    assert doc["csagate_version"] == __version__ and doc["contract_version"] == CONTRACT_VERSION
    assert "GATE PASS" in result.stderr                   # the verdict went to stderr
    assert doc["device"]["index"] == 0 and doc["env"]["device_index"] == 0
    junit = invoke("run", "--junit-xml", "-")
    assert junit.exit_code == 0
    root = ET.fromstring(junit.stdout)
    assert root.tag == "testsuites" and "GATE PASS" in junit.stderr


def test_dash_with_ratio_all_is_a_usage_error(gate):
    result = invoke("run", "--ratio", "all", "--json", "-")
    assert result.exit_code == 2 and "--json" in result.stderr and gate["preflights"] == 0


def test_reports_name_both_versions(gate, tmp_path):
    paths = tmp_path / "v.json", tmp_path / "j.xml"
    result = invoke("run", "--json", str(paths[0]), "--junit-xml", str(paths[1]))
    assert result.exit_code == 0, result.output
    doc = json.loads(paths[0].read_text())
    assert (doc["csagate_version"], doc["contract_version"]) == (__version__, CONTRACT_VERSION)
    props = {p.get("name"): p.get("value")
             for p in ET.parse(paths[1]).getroot().iter("property")}
    assert props["csagate_version"] == __version__
    assert props["contract_version"] == CONTRACT_VERSION


@pytest.mark.parametrize("ratio", [4, 128])
def test_could_not_evaluate_junit_names_its_family(ratio, tmp_path):
    path = tmp_path / "j.xml"
    render.write_error_junit(path, "no GPU", {"python": "3"}, ratio=ratio)
    suite = ET.parse(path).getroot().find("testsuite")
    assert suite.get("name") == f"csagate.ratio{ratio}"
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props["contract_version"] == CONTRACT_VERSION


def test_ratio_all_without_a_gpu_writes_each_family_its_suite(monkeypatch, tmp_path):
    monkeypatch.setattr(options, "contracts", lambda ratio: SMALL_FAMILIES[ratio])
    monkeypatch.setattr(judging, "preflight", lambda device, kernels: console.abort(
        "no GPU here", ExitCode.COULD_NOT_EVALUATE))
    result = invoke("run", "--ratio", "all", "--junit-xml", str(tmp_path / "j.xml"))
    assert result.exit_code == 3
    for contract in SMALL_FAMILIES["all"]:
        path = tmp_path / f"j.r{contract.ratio}.xml"
        suite = ET.parse(path).getroot().find("testsuite")
        assert suite.get("name") == f"csagate.ratio{contract.ratio}"


def test_header_names_the_device_and_fits_80_columns(gate):
    result = CliRunner().invoke(cli, ["run", "--device", "0"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()
    assert lines[0].startswith(f"csagate {__version__}: ") and "cuda:0" in lines[0]
    assert all(len(line) <= 80 for line in lines), [ln for ln in lines if len(ln) > 80]


def test_no_color_after_the_command(gate):
    result = CliRunner().invoke(cli, ["run", "--no-color"], env={"COLUMNS": "80"})
    assert result.exit_code == 0 and "\x1b[" not in result.output
    forced = CliRunner().invoke(cli, ["cases", "--color"])
    assert forced.exit_code == 0 and "\x1b[" in forced.output


def test_an_out_of_memory_error_keeps_its_first_sentence_and_the_sizes():
    text = ("OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
            "capacity of 139.81 GiB of which 1.06 GiB is free. Including non-PyTorch memory, "
            "this process has 138.7 GiB memory in use. Of the allocated memory 130 GiB is "
            "allocated by PyTorch. If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")
    short = short_error(text)
    assert short == ("OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 "
                     "has a total capacity of 139.81 GiB of which 1.06 GiB is free.")
    assert short_error("ValueError: bad") == "ValueError: bad"
