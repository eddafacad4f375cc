"""What a new user trips on, on CPU: strict environment variables, exit codes under debug,
unknown-command and unknown-case suggestions, compare's bounds, report paths checked first and
written on exit 3, an unwritable cache folder, PTX dumps in `cache info`/`clear`, kernel names
never split mid-word at 80 columns, and --json for the listing commands."""

from __future__ import annotations

import json
import re
import sys

import pytest
from click.testing import CliRunner
from csagate.gates import judging
from csagate.gates.contracts import CONTRACTS
from csagate.kernels import diskcache as D
from gate_backends import SMALL_FAMILIES, small_gate

from csagate import options
from csagate.cli import cli
from csagate.exitcodes import ExitCode


def invoke(*args, env=None):
    return CliRunner().invoke(cli, list(args), env={"COLUMNS": "200", **(env or {})})


@pytest.fixture
def gate(monkeypatch):
    return small_gate(monkeypatch)


# --- 6: environment variables and exit codes -------------------------------------------------


@pytest.mark.parametrize("name,value", [("CSAGATE_DISK_CACHE", "banana"),
                                        ("CSAGATE_DEBUG", "maybe"),
                                        ("CSAGATE_MEASURE_CUDNN_MIN_CC", "abc")])
def test_a_bad_environment_value_is_one_usage_line(name, value):
    r = invoke("cases", env={name: value})
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"csagate: {name}=") and value in lines[0]


@pytest.mark.parametrize("value,expected", [("0", False), ("off", False), ("No", False),
                                            ("1", True), (" TRUE ", True), ("on", True),
                                            ("", False)])
def test_booleans_are_parsed_strictly(monkeypatch, value, expected):
    from csagate.kernels import env

    monkeypatch.setenv("CSAGATE_DEBUG", value)
    assert env.debug() is expected
    monkeypatch.setenv("CSAGATE_DISK_CACHE", value)
    assert env.disk_cache() is (expected if value else True)


def test_one_env_helper():
    """The variables are read through kernels/env.py only (no second parser)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    for folder in ("csagate", "kernels", "gates"):
        for path in (root / folder).rglob("*.py"):
            if path.name == "env.py":
                continue
            text = path.read_text()
            for name in ("CSAGATE_DEBUG", "CSAGATE_DISK_CACHE", "CSAGATE_MEASURE_CUDNN_MIN_CC"):
                assert not re.search(rf"environ(\.get)?\(?\[?[\"']{name}", text), (path, name)


@pytest.mark.parametrize("debug", ["0", "1"])
def test_debug_keeps_exit_3(monkeypatch, capsys, debug):
    from csagate import cli as cli_mod

    monkeypatch.setattr(options, "contracts", lambda ratio: (object(),))
    monkeypatch.setattr(sys, "argv", ["csagate", "cases"])
    monkeypatch.setenv("CSAGATE_DEBUG", debug)
    with pytest.raises(SystemExit) as exc:
        cli_mod.main()
    assert exc.value.code == 3
    err = capsys.readouterr().err
    assert ("Traceback" in err) == (debug == "1")


# --- 10: suggestions ---------------------------------------------------------------------------


def test_unknown_command_suggests_the_close_one():
    r = invoke("runn")
    assert r.exit_code == 2 and "Did you mean run?" in r.stderr


def test_run_suggests_names_of_the_chosen_family():
    r = invoke("run", "--ratio", "4", "--case", "r4/c1d128/1x819")
    assert r.exit_code == 2
    close = re.findall(r"'(r\d+/[^']+)'", r.stderr.split("Did you mean")[1])
    assert close and all(name.startswith("r4/") for name in close), r.stderr


def test_compare_suggests_close_case_names(gate):
    r = invoke("compare", "--impl", "eager-bf16w", "--impl", "eager-bf16ape",
               "--case", "c1d16/ragge")
    assert r.exit_code == 2 and "Did you mean 'c1d16/ragged'" in r.stderr, r.stderr


# --- 3: compare's bounds -----------------------------------------------------------------------


def test_compare_help_lists_exactly_its_exits():
    r = invoke("compare", "--help")
    flat = " ".join(r.output.split())
    assert "--max-abs" in flat and "--bound" in flat
    assert re.findall(r"\b([0-3]) (?:compared|some|usage|could)", flat) == ["0", "1", "2", "3"]


@pytest.mark.parametrize("args,code", [((), 0), (("--max-abs", "1"), 0),
                                       (("--max-abs", "1e-9"), 1),
                                       (("--max-abs", "1", "--bound", "out=0"), 1),
                                       (("--max-abs", "1e-9", "--bound", "out=1",
                                         "--bound", "dkv=1", "--bound", "dscore=1",
                                         "--bound", "dape=1"), 0)])
def test_compare_exits_1_beyond_a_bound(gate, monkeypatch, tmp_path, args, code):
    out = tmp_path / "cmp.json"
    r = invoke("compare", "--impl", "eager-bf16w", "--impl", "eager-bf16ape", "--case",
               "c1d16/ragged", "--json", str(out), "--device", "cpu", *args)
    assert r.exit_code == code, r.output
    doc = json.loads(out.read_text())
    assert bool(doc["beyond"]) == (code == 1)
    if args:
        assert ("BEYOND THE BOUND" in r.stdout) == (code == 1)


@pytest.mark.parametrize("bad", ["out", "nope=1", "out=x", "out=-1"])
def test_compare_bad_bound_is_a_usage_error(gate, bad):
    r = invoke("compare", "--impl", "eager-bf16w", "--impl", "eager-bf16ape", "--bound", bad)
    assert r.exit_code == 2 and "--bound" in r.stderr


# --- 4: report paths ----------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/proc/version", "/dev/full"])
@pytest.mark.parametrize("command", [("run",), ("bench",),
                                     ("compare", "--impl", "eager-bf16w", "--impl",
                                      "eager-bf16ape")])
def test_unwritable_report_files_are_usage_errors(gate, command, path):
    r = invoke(*command, "--json", path)
    assert r.exit_code == 2, r.output
    assert "--json" in r.stderr and gate["preflights"] == 0


def test_report_dir_is_checked_first(gate, tmp_path, monkeypatch):
    a_file = tmp_path / "f"
    a_file.write_text("x")
    for bad in (a_file, a_file / "sub"):
        r = invoke("run", "--report", str(bad))
        assert r.exit_code == 2 and "--report" in r.stderr
    monkeypatch.setattr(D, "_write_probe", _refuse)
    r = invoke("run", "--report", str(tmp_path / "rep"))
    assert r.exit_code == 2 and "not writable" in r.stderr, r.stderr
    assert gate["preflights"] == 0


def _refuse(directory):
    raise PermissionError(13, "Permission denied", str(directory))


def test_exit_3_still_writes_the_report_dir(monkeypatch, tmp_path):
    from csagate import console

    def no_gpu(device, kernels):
        console.abort("no CUDA GPU visible (test)", ExitCode.COULD_NOT_EVALUATE)

    monkeypatch.setattr(options, "contracts", lambda ratio: SMALL_FAMILIES[ratio])
    monkeypatch.setattr(judging, "preflight", no_gpu)
    rep = tmp_path / "rep"
    r = invoke("run", "--report", str(rep))
    assert r.exit_code == 3
    doc = json.loads((rep / "verdict.json").read_text())
    assert "no CUDA GPU visible (test)" in json.dumps(doc)
    assert "could not evaluate" in (rep / "index.html").read_text()


# --- 5: the cache folder -----------------------------------------------------------------------


def test_unwritable_cache_dir_is_said_plainly(tmp_path, monkeypatch):
    root = tmp_path / "cc"
    root.mkdir(mode=0o700)
    monkeypatch.setattr(D, "_write_probe", _refuse)
    env = {"CSAGATE_CACHE_DIR": str(root)}
    r = invoke("build", "--arch", "sm_90a", env=env)
    assert r.exit_code == 2, r.output
    flat = " ".join(r.stderr.split())
    assert "not writable" in flat and "nvidia-cutlass-dsl" not in flat
    info = invoke("cache", "info", env=env)
    assert info.exit_code == 0
    assert re.search(r"usable\s+│?\s*no: .*not writable", info.stdout), info.stdout
    facts = json.loads(invoke("cache", "info", "--json", env=env).stdout)
    assert facts["usable"] is False and "not writable" in facts["problem"]


def test_cache_dir_whose_parent_is_a_file(tmp_path):
    a_file = tmp_path / "f"
    a_file.write_text("x")
    r = invoke("build", "--arch", "sm_90a", env={"CSAGATE_CACHE_DIR": str(a_file / "cc")})
    assert r.exit_code == 2 and "nvidia-cutlass-dsl" not in r.stderr


def test_ptx_dumps_are_counted_and_cleared(tmp_path):
    root = tmp_path / "cc"
    (root / "ptx" / "sub").mkdir(parents=True)
    root.chmod(0o700)
    (root / "ptx" / "a.ptx").write_text("x" * 10)
    (root / "ptx" / "sub" / "b.ptx").write_text("y" * 5)
    env = {"CSAGATE_CACHE_DIR": str(root)}
    facts = json.loads(invoke("cache", "info", "--json", env=env).stdout)
    assert (facts["ptx_files"], facts["ptx_bytes"]) == (2, 15)
    assert "PTX dumps" in invoke("cache", "info", env=env).stdout
    r = invoke("cache", "clear", env=env)
    assert r.exit_code == 0 and "removed 2 file(s)" in r.stderr
    assert not [p for p in (root / "ptx").rglob("*") if p.is_file()]


# --- 7: kernel names at 80 and 200 columns -----------------------------------------------------


def _whole_words(text: str, tag: str) -> bool:
    """Every '_'-separated word of ``tag`` stands whole somewhere in ``text``."""
    return all(re.search(rf"(^|[\s_│]){re.escape(w)}($|[\s_│])", text, re.M)
               for w in tag.split("_"))


@pytest.mark.parametrize("width", [80, 200])
def test_kernel_names_never_break_mid_word(width):
    import io

    from csagate.kernels.cache import BuildRecord
    from csagate.kernels.registry import keys_for
    from csagate.perf.probe import ProbeRow
    from rich.console import Console

    from csagate import console as C
    from csagate.commands import build, probe

    keys = keys_for(128, "sm_100a") + keys_for(4, "sm_90a")
    con = Console(file=io.StringIO(), width=width, color_system=None)
    C.print_table(build.build_table([BuildRecord(k, 1.0, False) for k in keys], "sm_100a"),
                  con)
    C.print_table(probe.probe_table([ProbeRow(k.tag, k.kind, (), k.arch, 1, 0, 0, 0, 0, 0,
                                              True, "clean") for k in keys], "sm_100a"), con)
    text = con.file.getvalue()
    assert max(len(line) for line in text.splitlines()) <= width
    for k in keys:
        assert _whole_words(text, k.tag), k.tag
    if width == 200:
        assert all(k.tag in text for k in keys)
    sched = invoke("schedules", env={"COLUMNS": str(width)}).stdout
    from csagate.kernels import schedule as S

    for arch in S.TABLE_ARCHES:
        for tables in (S.FWD_TABLES[arch], S.BWD_TABLES[arch]):
            for entries in tables.values():
                for s in entries.values():
                    assert _whole_words(sched, s.tag), s.tag


# --- 9, 11: text and --json --------------------------------------------------------------------


def test_help_lists_the_real_ratios():
    flat = " ".join(invoke("--help").output.split())
    assert ", ".join(str(r) for r in CONTRACTS) + " or all" in flat


def test_cases_verbose_names_the_large_bucket_form_per_arch():
    from csagate.kernels import schedule as S

    flat = " ".join(invoke("cases", "-v").stdout.split())
    form = {arch: S.FWD_TABLES[arch]["large"][(1, 128)].form for arch in S.TABLE_ARCHES}
    for arch, f in form.items():
        word = "two-phase" if f == "twophase" else str(f)
        assert f"{word} on {arch}" in flat


@pytest.mark.parametrize("args", [["cases", "--ratio", "all"], ["impls"], ["schedules"]])
def test_listing_commands_print_json(args):
    r = invoke(*args, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["schema"].startswith("csagate.")
    if args[0] == "cases":
        assert [f["ratio"] for f in doc["families"]] == list(CONTRACTS)
    if args[0] == "impls":
        assert {"csagate", "eager-bf16w"} <= {i["name"] for i in doc["impls"]}
    if args[0] == "schedules":
        assert {t["arch"] for t in doc["tables"]} == {"sm_100a", "sm_90a"}


def test_build_progress_shows_elapsed_and_eta():
    from rich.progress import TimeElapsedColumn, TimeRemainingColumn

    from csagate.progress import progress_bar

    bar = progress_bar(3, "x")
    kinds = {type(c) for c in bar.columns}
    assert {TimeElapsedColumn, TimeRemainingColumn} <= kinds
