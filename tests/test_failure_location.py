"""Every failing check is located and drawn: a tensor that fails the zeros gate (its tails) and
G2 (the slots windows read) gets a location, a line and a picture for each, and the -v detail
table shows the numbers of a bitwise rule's failure (its count and largest gap), not "-"."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner
from csagate.gates.driver import Driver
from csagate.gates.runner import run_gate
from csagate.reference import never_consumed_mask
from gate_backends import SMALL_R4_CONTRACT, RefImpl, case_named

from csagate import render
from csagate.cli import cli

CASE = "r4/c2d32/ragged"


class TailBug(RefImpl):
    """A tail bug: each segment's tail tokens get the gradient of a phantom block (nonzero
    where exact zeros are due), and the last block's slots are read one token late (off in
    G2 wherever it lands)."""

    def after_backward(self, kv, score, ape, cu, cuc, grad_out, dkv, dscore, dape, prefill, *,
                       ratio, coff):
        if ratio != 4 or kv.shape[1] != 64:
            return
        mask = never_consumed_mask(cu, ratio=ratio, coff=coff, d=dkv.shape[1] // coff,
                                   n_tokens=dkv.shape[0])
        dkv[mask] = 0.25
        dkv[~mask] = torch.roll(dkv, 1, 0)[~mask]


def _verdict():
    return run_gate(Driver(TailBug(), torch.device("cpu")), SMALL_R4_CONTRACT,
                    cases=[case_named(CASE)], drift_driver=Driver(RefImpl(), torch.device("cpu")))


def test_both_failing_checks_of_one_tensor_are_located():
    v = _verdict()
    (result,) = v.cases
    failing = {(g.gate, g.tensor) for g in result.failures}
    assert {("zeros", "dkv"), ("G2", "dkv")} <= failing
    where = {(w["gate"], w["tensor"]): w for w in result.recorded["where"]}
    assert ("zeros", "dkv") in where and ("G2", "dkv") in where
    g2 = result.result("G2", "dkv")
    assert where[("G2", "dkv")]["n_offending"] == g2.numbers["n_diff"] > 0
    zeros = result.result("zeros", "dkv")
    assert where[("zeros", "dkv")]["n_offending"] == zeros.numbers["n_nonzero"]
    from csagate.where import where_lines

    lines = where_lines(v)
    assert any("dkv (zeros)" in line for line in lines)
    assert any("dkv (G2)" in line for line in lines)


def test_the_detail_table_shows_a_bitwise_failure_in_numbers():
    v = _verdict()
    (result,) = v.cases
    cell = render._diff_cell(result.result("G2", "dkv"))
    assert cell != "-" and cell.startswith(f"{result.result('G2', 'dkv').numbers['n_diff']} / ")
    assert result.result("G2", "dkv").numbers["max_abs"] > 0


def test_the_report_draws_each_failing_check(tmp_path):
    pytest.importorskip("matplotlib")
    from csagate.report import write_report

    v = _verdict()
    write_report(tmp_path, v, {})
    pictures = sorted(p.name for p in tmp_path.glob("*.png"))
    assert any(p.endswith("__dkv__zeros.png") for p in pictures), pictures
    assert any(p.endswith("__dkv__G2.png") for p in pictures), pictures
    page = (tmp_path / "index.html").read_text()
    assert "dkv (zeros)" in page and "dkv (G2)" in page
    doc = json.loads((tmp_path / "verdict.json").read_text())
    wheres = doc["cases"][0]["recorded"]["where"]
    assert {(w["gate"], w["tensor"]) for w in wheres} >= {("zeros", "dkv"), ("G2", "dkv")}


def test_the_cli_shows_both_where_lines_and_the_numbers(monkeypatch, tmp_path):
    from gate_backends import use_stand_in

    from csagate import options

    monkeypatch.setattr(options, "contracts", lambda ratio: (SMALL_R4_CONTRACT,))
    use_stand_in(monkeypatch, TailBug())
    result = CliRunner().invoke(cli, ["run", "--ratio", "4", "--case", CASE, "-v"],
                                env={"COLUMNS": "200", "NO_COLOR": "1"},
                                catch_exceptions=False)
    assert result.exit_code == 1, result.output
    out = result.stdout
    assert "dkv (zeros)" in out and "dkv (G2)" in out
    row = next(line for line in out.splitlines()
               if line.split()[:2] == ["1", CASE] and "/" in line)
    assert " - " not in f" {row} ".replace(f" {CASE} ", " ")   # every failing cell a number
