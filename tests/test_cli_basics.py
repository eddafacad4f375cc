"""CLI skeleton via click's CliRunner: help, version, cases, usage errors."""

import re
import subprocess
import sys

import pytest
from click.testing import CliRunner
from csagate.gates.contracts import CONTRACTS, R4, R128

from csagate import __version__
from csagate.cli import cli


def run(*args):
    return CliRunner().invoke(cli, list(args))


def test_help_lists_commands_and_exit_codes():
    r = run("--help")
    assert r.exit_code == 0, r.output
    for word in ("run", "cases", "build", "probe", "schedules", "bench", "reference"):
        assert word in r.output
    text = " ".join(r.output.split())
    assert "0 pass, 1 contract failure, 2 usage error (nothing to judge included), 3 could " \
        "not evaluate" in text and "nothing judged" in text
    assert "130 interrupted" in " ".join(r.output.split())


def test_version():
    r = run("--version")
    assert r.exit_code == 0 and __version__ in r.output


def _rows(output: str) -> list[str]:
    """Table rows of a case: they start with its index (-v's reason lines do not)."""
    return [line for line in output.splitlines() if line.split() and line.split()[0].isdigit()]


def _names(line: str) -> str:
    return line.split()[1]


def test_cases_table():
    r = run("cases", "--ratio", "128")
    assert r.exit_code == 0, r.output
    lines = _rows(r.output)
    assert [_names(line) for line in lines] == [c.name for c in (R128.drift, *R128.all_cases)]
    assert all(line.split()[-1] == "hardening" for line in lines[22:25])
    assert all(line.split()[-1] == "deterministic" for line in lines[25:])
    assert "drift check + 21 + 3 hardening + 4 deterministic cases" in " ".join(r.output.split())
    assert "131072" in r.output and "padding" in r.output


def test_cases_verbose_shows_every_why():
    from csagate.commands.cases import why_text  # the why, a form note derived from the tables
    r = CliRunner().invoke(cli, ["cases", "-v", "--ratio", "all"], env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    flat = " ".join(r.output.split())
    for contract in CONTRACTS.values():
        for case in (contract.drift, *contract.all_cases):
            assert " ".join(why_text(case).split()) in flat, case.name


def test_cases_table_ratio4_and_all():
    r = run("cases", "--ratio", "4")
    assert r.exit_code == 0, r.output
    lines = _rows(r.output)
    assert [_names(line) for line in lines] == [c.name for c in (R4.drift, *R4.all_cases)]
    counts = f"drift check + {len(R4.cases)} + {len(R4.deterministic_cases)} deterministic cases"
    assert counts in " ".join(r.output.split())
    wide = CliRunner().invoke(cli, ["cases", "--ratio", "4"], env={"COLUMNS": "200"}).output
    assert "r4/c2d512/1x65536" in wide and "r4/c1d512/short4+pad8r37t" in wide
    both = run("cases", "--ratio", "all")
    assert both.exit_code == 0
    assert "ratio=128 gate" in both.output and "ratio=4 gate" in both.output
    from csagate.gates.contracts import CONTRACTS

    assert len(_rows(both.output)) == sum(1 + len(k.all_cases) for k in CONTRACTS.values())


@pytest.mark.parametrize("ratio", ["2", "8", "16", "32"])
def test_cases_table_small_ratios(ratio):
    from csagate.gates.contracts import CONTRACTS

    r = run("cases", "--ratio", ratio)
    assert r.exit_code == 0, r.output
    k = CONTRACTS[int(ratio)]
    assert f"ratio={ratio} gate" in r.output and len(_rows(r.output)) == 1 + len(k.all_cases)
    assert f"r{ratio}/c1d128/1x8192" in _rows(r.output)[1]


def test_bad_ratio_is_a_usage_error():
    r = run("cases", "--ratio", "7")
    assert r.exit_code == 2 and "Invalid value" in r.output


def test_unknown_command_is_a_usage_error():
    assert run("frobnicate").exit_code == 2


def test_cases_imports_neither_torch_kernels_nor_cutlass():
    code = ("import sys; from csagate.cli import main; sys.argv=['csagate','cases'];\n"
            "try:\n  main()\nexcept SystemExit: pass\n"
            "bad=[m for m in ('cutlass','csagate.kernels.small','csagate.kernels.api')"
            " if m in sys.modules];"
            "print('LOADED', bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "LOADED []" in out.stdout, out.stdout + out.stderr


def test_schedules_table():
    r = run("schedules")
    assert r.exit_code == 0, r.output
    # the counts are the tables': any tuning may change them, never their sum
    from csagate.kernels.schedule import TABLE_ARCHES

    for arch in TABLE_ARCHES:
        m = re.search(rf"{arch} selectable kernels: forward (\d+), backward (\d+), total (\d+)",
                      r.output)
        assert m, r.output
        assert int(m[1]) + int(m[2]) == int(m[3]) and int(m[1]) >= 1 and int(m[2]) >= 1
    assert "105024" in r.output and "invalid" not in r.output


def test_color_flag_forces_or_forbids_colour():
    coloured = CliRunner().invoke(cli, ["--color", "cases"], env={"NO_COLOR": "1"})
    assert coloured.exit_code == 0 and "\x1b[" in coloured.output
    plain = CliRunner().invoke(cli, ["--no-color", "cases"])
    assert plain.exit_code == 0 and "\x1b[" not in plain.output
    assert "\x1b[" not in run("cases").output   # not a terminal: no colour by default


def test_unexpected_error_is_one_line_and_exit_3(monkeypatch, capsys):
    from csagate import cli as cli_mod
    from csagate import options

    monkeypatch.setattr(options, "contracts", lambda ratio: (object(),))
    monkeypatch.setattr(sys, "argv", ["csagate", "cases"])
    monkeypatch.delenv("CSAGATE_DEBUG", raising=False)
    try:
        cli_mod.main()
    except SystemExit as exc:
        code = exc.code
    assert code == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("csagate: internal error, could not evaluate: AttributeError")
    assert "CSAGATE_DEBUG=1" in err[0]
    monkeypatch.setenv("CSAGATE_DEBUG", "1")   # the traceback, and still exit 3
    with pytest.raises(SystemExit) as exc:
        cli_mod.main()
    assert exc.value.code == 3 and "AttributeError" in capsys.readouterr().err


def _main_exit(monkeypatch, *argv) -> int:
    from csagate import cli as cli_mod

    monkeypatch.setattr(sys, "argv", ["csagate", *argv])
    with pytest.raises(SystemExit) as exc:
        cli_mod.main()
    return exc.value.code


def test_ctrl_c_in_a_command_is_one_line_and_exit_130(monkeypatch, capsys):
    """KeyboardInterrupt anywhere in a command: ``csagate: interrupted``, exit 130 (not click's
    "Aborted!" and exit 1), no traceback, even under CSAGATE_DEBUG."""
    from csagate import options
    from csagate.exitcodes import ExitCode

    def interrupted(ratio):
        raise KeyboardInterrupt

    monkeypatch.setattr(options, "contracts", interrupted)
    for debug in ("", "1"):
        monkeypatch.setenv("CSAGATE_DEBUG", debug)
        assert _main_exit(monkeypatch, "cases") == ExitCode.INTERRUPTED == 130
        captured = capsys.readouterr()
        assert captured.err.strip().splitlines() == ["csagate: interrupted"]
        assert captured.out == ""


def test_ctrl_c_in_a_running_gate_is_exit_130(monkeypatch, capsys):
    from csagate.commands import run as run_cmd

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(run_cmd, "_evaluate", interrupted)
    monkeypatch.delenv("CSAGATE_DEBUG", raising=False)
    assert _main_exit(monkeypatch, "run", "--ratio", "4") == 130
    assert capsys.readouterr().err.strip().splitlines() == ["csagate: interrupted"]


def test_main_keeps_the_other_exit_codes(monkeypatch, capsys):
    assert _main_exit(monkeypatch, "--version") == 0
    assert _main_exit(monkeypatch, "cases", "--ratio", "4") == 0
    assert _main_exit(monkeypatch, "cases", "--ratio", "9") == 2
    assert "Error: Invalid value for '--ratio'" in capsys.readouterr().err
    assert _main_exit(monkeypatch, "nope") == 2


def test_help_says_what_the_exit_codes_and_debug_are():
    r = run("--help")
    assert "--color / --no-color" in r.output and "CSAGATE_DEBUG=1" in r.output
