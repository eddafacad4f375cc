"""``csagate compare --report DIR`` on the CPU: compare.json is the ``--json`` document, one PNG
per case that differs (none for a case that does not), index.html lists every case and links
each picture, without matplotlib the JSON and the page are still written, and a bad DIR is a
usage error before anything runs. The small ratio-4 contract of ``tests/gate_backends.py``,
two built-in eager variants."""

from __future__ import annotations

import json
import struct

import pytest
from click.testing import CliRunner
from csagate.kernels import diskcache as D
from gate_backends import small_gate

from csagate import pair_report
from csagate.cli import cli
from csagate.report import NO_MATPLOTLIB

DIFFERS = "r4/c2d16/ragged+pad3r5t"     # every output differs; capacity padding rows
SAME = "r4/c1d16/overflow"              # both sides give the same (non-finite) values
PNG = b"\x89PNG\r\n\x1a\n"


def compare(*args):
    argv = ["compare", "--impl", "eager-bf16w", "--impl", "eager-bf16ape", "--ratio", "4",
            "--device", "cpu", "--case", DIFFERS, "--case", SAME, *args]
    return CliRunner().invoke(cli, argv, env={"COLUMNS": "80"}, catch_exceptions=False)


@pytest.fixture
def gate(monkeypatch):
    return small_gate(monkeypatch)


def test_the_report_holds_the_json_one_picture_per_differing_case_and_the_page(gate, tmp_path):
    pytest.importorskip("matplotlib")
    rep = tmp_path / "rep"
    r = compare("--report", str(rep), "--json", "-")
    assert r.exit_code == 0, r.output
    # the same run's --json document, byte for byte
    assert (rep / "compare.json").read_text() == r.stdout
    doc = json.loads(r.stdout)
    assert [c["name"] for c in doc["cases"]] == [DIFFERS, SAME]
    # (a path too long for the line goes to its own: compare the words)
    assert f"wrote {rep / 'index.html'} (1 picture(s))" in " ".join(r.stderr.split())
    pngs = sorted(p.name for p in rep.glob("*.png"))
    assert pngs == ["r4_c2d16_ragged_pad3r5t.png"]            # none for the case without
    data = (rep / pngs[0]).read_bytes()
    assert data[:8] == PNG
    width, height = struct.unpack(">II", data[16:24])         # IHDR: two panels side by side
    assert width > height > 200
    page = (rep / "index.html").read_text()
    assert "A=eager-bf16w B=eager-bf16ape" in page
    assert f'<img src="{pngs[0]}"' in page
    assert f"<h3>{SAME}</h3><p>no difference</p>" in page
    assert f"<h3>{DIFFERS}</h3><figure>" in page
    assert 'href="compare.json"' in page
    # the key numbers: each output's differing count out of its elements
    for t in doc["cases"][0]["tensors"]:
        assert f"{t['n_diff']} / {t['numel']}" in page
        assert t["n_diff"] > 0


def test_a_bound_beyond_still_writes_the_report(gate, tmp_path):
    rep = tmp_path / "rep"
    r = compare("--report", str(rep), "--bound", "out=0")
    assert r.exit_code == 1, r.output
    doc = json.loads((rep / "compare.json").read_text())
    assert doc["beyond"] and doc["beyond"][0].startswith(f"{DIFFERS} out: max |A-B|")
    assert "beyond the bound" in (rep / "index.html").read_text()


def test_without_matplotlib_the_json_and_the_page_are_written(gate, tmp_path, monkeypatch):
    monkeypatch.setattr(pair_report, "have_matplotlib", lambda: False)
    rep = tmp_path / "rep"
    r = compare("--report", str(rep))
    assert r.exit_code == 0, r.output
    assert NO_MATPLOTLIB in r.stderr
    assert not list(rep.glob("*.png"))
    assert json.loads((rep / "compare.json").read_text())["a"] == "eager-bf16w"
    page = (rep / "index.html").read_text()
    assert "pip install 'csagate[report]'" in page and DIFFERS in page and SAME in page


def _refuse(directory):
    raise PermissionError(13, "Permission denied", str(directory))


@pytest.mark.parametrize("bad", ["a file", "under a file", "not writable"])
def test_a_bad_report_dir_is_one_usage_line_before_anything_runs(gate, tmp_path, monkeypatch,
                                                                 bad):
    ran = []
    from csagate.gates import judging

    monkeypatch.setattr(judging, "judging", lambda impl, device: ran.append(device))
    a_file = tmp_path / "f"
    a_file.write_text("x")
    target = {"a file": a_file, "under a file": a_file / "rep",
              "not writable": tmp_path / "rep"}[bad]
    if bad == "not writable":
        monkeypatch.setattr(D, "_write_probe", _refuse)
    r = compare("--report", str(target))
    assert r.exit_code == 2, r.output
    errors = [line for line in r.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "--report" in errors[0], r.stderr
    why = {"a file": "is a file", "under a file": "is not a directory, so",
           "not writable": "cannot"}[bad]
    assert why in " ".join(r.stderr.split()), r.stderr
    assert ran == [] and not r.stdout
    assert not (tmp_path / "rep").exists()


def test_help_says_what_the_report_holds_and_what_it_needs():
    r = CliRunner().invoke(cli, ["compare", "--help"], env={"COLUMNS": "200"})
    flat = " ".join(r.output.split())
    assert "--report DIR" in flat and "compare.json" in flat
    assert "pip install 'csagate[report]'" in flat
    assert "no --report" not in flat


def test_the_fraction_panel_is_logarithmic_so_a_small_share_shows():
    """0.9% of a group differing is a visible bar: the panel's floor sits a decade below the
    smallest share (and below one element of the largest group), on a log axis."""
    from csagate.pair_report import fraction_floor

    where = [{"n_diff": 9, "numel": 1000}, {"n_diff": 0, "numel": 4096},
             {"n_diff": 900, "numel": 1000}]
    floor = fraction_floor(where)
    assert floor <= 0.009 / 10 and floor <= 1 / 4096 / 10
    assert fraction_floor([{"n_diff": 0, "numel": 10}]) == 1 / 10 / 10
    plt = pytest.importorskip("matplotlib.pyplot")
    from csagate import pair_report

    groups = [{**w, "by": "length", "group": "<1K", "max_steps": 2.0, "p99": 1.0}
              for w in where]
    fig, (ax_frac, ax_steps) = plt.subplots(2)
    pair_report._where_panels(ax_frac, ax_steps, groups)
    assert ax_frac.get_yscale() == "log" and ax_frac.get_ylim()[0] == pytest.approx(floor)
    heights = [bar.get_height() for bar in ax_frac.patches]
    assert heights[0] == pytest.approx(0.009) and heights[0] > 10 * ax_frac.get_ylim()[0] * 0.9
    plt.close(fig)
