"""What a newcomer meets writing an adapter and asking for reports: a ``file.py:NAME`` adapter
may import its sibling modules; ``run --impl`` refuses an adapter that breaks the protocol as
``impls --impl`` does (exit 2, before any work); ``--report`` wants an existing parent folder,
as ``--json`` does."""

from __future__ import annotations

from click.testing import CliRunner

from csagate.cli import cli

SIBLING = '''
import torch
from csagate.reference import backward, forward


def compress(kv, score, ape, cu, cuc, n_rows, ratio, coff):
    return forward(kv, score, ape, cu, cuc, ratio=ratio, coff=coff, n_rows=n_rows)
'''

ADAPTER = '''
from csagate.gates.plugin import Supports

import my_kernels          # a module beside this file


class Mine:
    name = "mine"
    supports = Supports(ratios=(4,))

    def forward(self, kv, score, ape, cu, cuc, n_rows, *, ratio, coff):
        return my_kernels.compress(kv, score, ape, cu, cuc, n_rows, ratio, coff)


class Broken:
    """forward takes the wrong arguments: impls --impl refuses it, so must run."""
    name = "broken"
    supports = Supports(ratios=(4,))

    def forward(self, kv, score):
        raise AssertionError("never called")
'''


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def _files(tmp_path):
    folder = tmp_path / "adapters"
    folder.mkdir()
    (folder / "my_kernels.py").write_text(SIBLING)
    (folder / "mine.py").write_text(ADAPTER)
    return folder / "mine.py"


def test_an_adapter_file_may_import_its_siblings(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)            # not the adapter's folder
    path = _files(tmp_path)
    result = invoke("run", "--impl", f"{path}:Mine", "--device", "cpu", "--ratio", "4",
                    "--case", "r4/c1d128/overflow")
    assert result.exit_code == 0, result.output
    assert "GATE PASS 1/1" in result.stdout


def test_run_refuses_what_impls_refuses(tmp_path):
    path = _files(tmp_path)
    impls = invoke("impls", "--impl", f"{path}:Broken")
    run = invoke("run", "--impl", f"{path}:Broken", "--device", "cpu", "--ratio", "4",
                 "--case", "r4/c1d128/overflow")
    assert impls.exit_code == run.exit_code == 2, (impls.output, run.output)
    assert "forward cannot be called as" in impls.stderr
    assert "forward cannot be called as" in run.stderr and "GATE" not in run.stdout


def test_report_wants_an_existing_parent_as_json_does(tmp_path):
    missing = tmp_path / "no" / "such"
    for option, value in (("--json", missing / "v.json"), ("--report", missing / "rep")):
        result = invoke("run", "--impl", "decode", "--device", "cpu", "--ratio", "4", "--case",
                        "r4/c1d128/overflow", option, value)
        assert result.exit_code == 2, (option, result.output)
        assert "does not exist" in result.stderr, option
    assert not (tmp_path / "no").exists()
