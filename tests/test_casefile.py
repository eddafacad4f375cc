"""Case files (``gates/casefile.py``): a case round-trips through JSON; a bad file is one line
naming the file and the field, and ``csagate run --case-file`` exits 2 on it; replay on the
CPU (``--device cpu``) judges a CPU-capable implementation with the drift check shown n/a."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from adapter_source import reference_adapter
from click.testing import CliRunner
from csagate.gates import casefile
from csagate.gates.casefile import CaseFileError, load, parse
from csagate.gates.cases import R4_CASES, Case

from csagate.cli import cli

ADAPTER = reference_adapter('Supports()') + '''

class Narrow(Reference):
    name = "narrow"
    supports = Supports(ratios=(128,))
'''

CASE = Case("fuzz/s1/t2/min/r4/c2d5/3+9", 2, 5, (3, 9), "fuzz", "a small pack", ratio=4,
            input_seed=5, grad_seed=6, pad_seed=7, scale=8.0, pad_rows=2, pad_tokens=3)


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture
def adapter(tmp_path) -> Path:
    path = tmp_path / "adapter.py"
    path.write_text(ADAPTER)
    return path


def _doc(**changes) -> dict:
    doc = casefile.document(CASE, failing=["G2 out"], implementation="x.py:Y",
                            origin={"seed": 1, "trial": 2})
    case = changes.pop("case", {})
    doc["case"].update(case)
    doc.update(changes)
    return doc


def test_a_case_round_trips(tmp_path):
    path = casefile.write(tmp_path / "c.json", CASE, failing=["G2 out"], implementation="x",
                          origin={"seed": 1, "trial": 2})
    found = load(path)
    assert found.case == CASE and found.contract_ratio == 4 and found.failing == ("G2 out",)
    assert found.implementation == "x" and found.origin == {"seed": 1, "trial": 2}
    assert found.path == str(path)
    doc = json.loads(path.read_text())
    assert doc["schema"] == "csagate.case" and doc["version"] == 1
    assert {"csagate_version", "contract_version"} <= set(doc)


def test_named_cases_round_trip_too():
    for case in R4_CASES:
        assert parse(casefile.document(case)).case == case


def test_only_the_geometry_is_required():
    doc = {"schema": "csagate.case", "version": 1,
           "case": {"name": "mine", "coff": 1, "d": 16, "lens": [8, 3], "ratio": 4}}
    case = parse(doc).case
    assert case.kind == "fuzz" and case.scale == 1.0 and case.input_seed == Case(
        "", 1, 1, (1,), "fuzz", "").input_seed


@pytest.mark.parametrize("changes, needle", [
    ({"schema": "csagate.verdict/1"}, "schema must be"),
    ({"version": 2}, "newer csagate"),
    ({"version": "1"}, "version must be an integer"),
    ({"case": {"colour": 1}}, "unknown field(s) colour"),
    ({"case": {"coff": 3}}, "case.coff must be 1 or 2"),
    ({"case": {"coff": True}}, "case.coff must be 1 or 2"),
    ({"case": {"d": 0}}, "case.d must be an integer in [1, 1024], got 0"),
    ({"case": {"lens": []}}, "case.lens must be a list of 1 to 4096 segment lengths"),
    ({"case": {"lens": [4, -1]}}, "case.lens[1] must be an integer in [0, 4194304]"),
    # bounds before work: no field reaches the allocator outside its documented range
    ({"case": {"lens": [10 ** 12]}}, "case.lens[0] must be an integer in [0, 4194304]"),
    ({"case": {"lens": [1 << 21] * 3}}, "case.lens holds 6291456 tokens, more than 4194304"),
    ({"case": {"lens": [1] * 4097}}, "case.lens must be a list of 1 to 4096"),
    ({"case": {"pad_rows": 10 ** 12}}, "case.pad_rows must be an integer in [0, 65536]"),
    ({"case": {"pad_tokens": 65537}}, "case.pad_tokens must be an integer in [0, 65536]"),
    ({"case": {"d": 10 ** 9}}, "case.d must be an integer in [1, 1024]"),
    ({"case": {"d": 1025}}, "case.d must be an integer in [1, 1024]"),
    ({"case": {"scale": 1e308}}, "case.scale must be a finite number in [2^-10, 2^10]"),
    ({"case": {"scale": 2.0 ** -11}}, "case.scale must be a finite number in [2^-10, 2^10]"),
    ({"case": {"input_seed": 2 ** 70}}, "case.input_seed must be an integer in [0, "),
    ({"case": {"grad_seed": 2 ** 63}}, "case.grad_seed must be an integer in [0, "),
    ({"case": {"ratio": 3}}, "case.ratio 3 has no contract"),
    ({"case": {"scale": float("nan")}}, "case.scale must be a finite number"),
    ({"case": {"kind": "random"}}, "case.kind must be one of"),
    ({"case": {"deterministic": 1}}, "case.deterministic must be true or false"),
    ({"contract_ratio": 128}, "differs from case.ratio 4"),
    ({"failing": "G2"}, "failing must be a list"),
])
def test_bad_documents_say_what_is_wrong(changes, needle):
    with pytest.raises(CaseFileError) as info:
        parse(_doc(**changes))
    assert needle in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("field, value", [("lens", [1 << 22]), ("pad_rows", 1 << 16),
                                          ("pad_tokens", 1 << 16), ("d", 1024),
                                          ("scale", 1024.0), ("input_seed", 2 ** 63 - 1)])
def test_the_ends_of_each_range_are_accepted(field, value):
    doc = _doc(case={field: value})
    assert getattr(parse(doc).case, field) == (tuple(value) if field == "lens" else value)


def test_a_deeply_nested_file_is_one_line_not_a_recursion_error(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(CaseFileError, match="nested too deeply") as info:
        casefile.load(path)
    assert "\n" not in str(info.value)


def test_a_file_larger_than_a_case_file_is_not_read(tmp_path):
    path = tmp_path / "big.json"
    path.write_text(" " * (casefile.MAX_FILE_BYTES + 1))
    with pytest.raises(CaseFileError, match="more than a case file holds"):
        casefile.load(path)


def test_a_case_without_its_geometry_is_refused():
    doc = _doc()
    del doc["case"]["lens"]
    with pytest.raises(CaseFileError, match="case lacks lens"):
        parse(doc)


def test_unreadable_files_name_the_file(tmp_path):
    with pytest.raises(CaseFileError, match="cannot read it"):
        load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(CaseFileError, match=r"bad\.json: not JSON \(.* at line 1"):
        load(bad)


# --- csagate run --case-file -------------------------------------------------------------------


def test_a_bad_case_file_exits_2_with_one_line(tmp_path, adapter):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_doc(case={"coff": 5})))
    result = invoke("run", "--case-file", bad, "--impl", f"{adapter}:Reference", "--device",
                    "cpu")
    assert result.exit_code == 2, result.output
    assert f"{bad}: case.coff must be 1 or 2" in " ".join(result.stderr.split())
    missing = invoke("run", "--case-file", tmp_path / "nope.json", "--device", "cpu")
    assert missing.exit_code == 2 and "cannot read it" in missing.stderr


def test_case_file_excludes_case_and_quick(tmp_path):
    path = casefile.write(tmp_path / "c.json", CASE)
    for extra in (["--quick"], ["--case", "c1d128/1x8192"]):
        result = invoke("run", "--case-file", path, "--device", "cpu", *extra)
        assert result.exit_code == 2 and "--case-file replays its own cases" in result.stderr


def test_replay_on_the_cpu_passes_with_the_drift_check_not_run(tmp_path, adapter):
    path = casefile.write(tmp_path / "c.json", CASE)
    report = tmp_path / "v.json"
    result = invoke("run", "--case-file", path, "--case-file", path, "--impl",
                    f"{adapter}:Reference", "--device", "cpu", "--json", report)
    assert result.exit_code == 0, result.output
    assert "GATE PASS 1/1" in result.stdout          # the same case twice: judged once
    assert "drift check not run on the CPU" in " ".join(result.stdout.split())
    doc = json.loads(report.read_text())
    assert doc["drift"]["status"] == "n/a" and doc["verdict"] == "PASS"
    assert doc["selection"]["device"] == "cpu" and doc["selection"]["case_files"] == [str(path)]
    assert [c["name"] for c in doc["cases"]] == [CASE.name]


def test_replay_outside_the_envelope_judges_nothing_and_is_refused(tmp_path, adapter):
    """A case file outside the implementation's envelope would judge nothing: a usage error
    before any work (exit 2), never ``GATE PASS 0/0``."""
    path = casefile.write(tmp_path / "c.json", CASE)
    result = invoke("run", "--case-file", path, "--impl", f"{adapter}:Narrow", "--device", "cpu")
    assert result.exit_code == 2, result.output
    assert "nothing to judge" in result.stderr and "outside narrow's envelope" in result.stderr
    assert "GATE" not in result.stdout


def test_run_on_the_cpu_refuses_the_gates_own_kernels(tmp_path):
    path = casefile.write(tmp_path / "c.json", CASE)
    result = invoke("run", "--case-file", path, "--device", "cpu")
    assert result.exit_code == 3, result.output
    assert "need a CUDA GPU" in result.stderr


@pytest.mark.parametrize("value", ["gpu", "cuda:x", "-1", ""])
def test_a_bad_device_is_a_usage_error(value):
    result = invoke("run", "--device", value)
    assert result.exit_code == 2 and "--device" in result.stderr
