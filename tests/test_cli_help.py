"""Every command's --help says what its exit codes mean, no help line is cut with "...", and
a reader that goes away (``csagate schedules | head -1``) is not an error: exit 0, nothing on
stderr."""

from __future__ import annotations

import subprocess
import sys

import pytest
from click.testing import CliRunner

from csagate.cli import COMMANDS, cli

COMMAND_PATHS = [[name] for name in COMMANDS] + [["cache", sub] for sub in
                                                  ("info", "clear", "prune")]


@pytest.mark.parametrize("path", COMMAND_PATHS, ids=" ".join)
def test_every_help_lists_the_exit_codes(path):
    result = CliRunner().invoke(cli, [*path, "--help"], env={"COLUMNS": "100"})
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "Exit codes: 0 " in text and "130 interrupted" in text, path


@pytest.mark.parametrize("path", [[], ["cache"]], ids=["csagate", "cache"])
def test_no_command_list_entry_is_cut(path):
    result = CliRunner().invoke(cli, [*path, "--help"], env={"COLUMNS": "100"})
    assert result.exit_code == 0
    listing = result.output[result.output.index("Commands:"):]
    assert "..." not in listing


@pytest.mark.parametrize("args", [["schedules"], ["cases", "--ratio", "all"], ["impls"],
                                  ["cases", "--json"]])
def test_a_closed_pipe_is_exit_0_and_silent(args):
    proc = subprocess.Popen([sys.executable, "-m", "csagate", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 0, err
    assert err == b"", err
