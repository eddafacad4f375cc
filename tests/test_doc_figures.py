"""The figure blocks of docs/KERNELS.md are what ``perf/doc_figures.py`` renders from the JSON
committed beside the doc (docs/figures/), so a hand edit or a stale number fails here. The bench
blocks render from tests/data/ fixtures in the schema ``csagate bench --json`` writes until a
bench JSON of the H200 is committed. No GPU, no compile."""

from __future__ import annotations

from pathlib import Path

import pytest
from csagate.perf import doc_figures as F

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "KERNELS.md"
DATA = Path(__file__).resolve().parent / "data"


def _blocks():
    return F.blocks(DOC.read_text())


def test_the_doc_has_its_figure_blocks():
    kinds = [m["kind"] for m in _blocks()]
    assert kinds == ["dispatch", "dispatch", "probe-d128", "probe", "bench-r128-large",
                     "bench-r128-short", "bench-small"], kinds


def test_every_block_with_its_json_is_what_the_script_renders():
    text = DOC.read_text()
    new, missing = F.rewrite(text, DOC.parent)
    assert not any(line.startswith("probe:") for line in missing), missing  # committed
    assert new == text, "docs/KERNELS.md: run `python -m csagate.perf.doc_figures`"
    assert F.main(["--check"]) == 0


def test_the_probe_block_says_what_its_json_holds():
    (probe,) = [m for m in _blocks() if m["kind"] == "probe"]
    (name,) = probe["sources"].split()
    doc = F._load(DOC.parent / name)
    assert doc["schema"] == "csagate.kernels/1" and doc["command"] == "probe"
    body = probe["body"]
    assert doc["summary"] in body
    for k in doc["kernels"]:
        if k["ratio"] == F.TABLE_RATIO:
            assert f"`{k['tag']}`" in body, k["tag"]


def test_a_hand_edit_of_a_block_is_found(tmp_path):
    (probe,) = [m for m in _blocks() if m["kind"] == "probe"]
    text = DOC.read_text()
    edited = text[:probe.start("body")] + "| hand | edit |\n" + text[probe.start("body"):]
    doc = tmp_path / "KERNELS.md"
    doc.write_text(edited)
    for name in probe["sources"].split():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text((DOC.parent / name).read_text())
    assert F.main(["--doc", str(doc), "--check"]) == 1
    assert F.main(["--doc", str(doc)]) == 0
    assert doc.read_text() == text


def _fixture_doc(tmp_path, kind: str, *names: str) -> Path:
    doc = tmp_path / "KERNELS.md"
    marker = " ".join(f"data/{n}" for n in names)
    doc.write_text(f"# figures\n\n<!-- figures:{kind} {marker} -->\nold\n<!-- /figures -->\n\n"
                   "after\n")
    (tmp_path / "data").mkdir(exist_ok=True)
    for n in names:
        (tmp_path / "data" / n).write_text((DATA / n).read_text())
    return doc


def test_the_small_ratio_table_with_cudnn_beside_it(tmp_path):
    doc = _fixture_doc(tmp_path, "bench-small", "bench-r4.json")
    assert F.main(["--doc", str(doc)]) == 0
    lines = doc.read_text().splitlines()
    assert lines[-1] == "after" and "old" not in lines
    assert "From `data/bench-r4.json`: NVIDIA H200, iters 30, copy ceiling 4.17 TB/s." in lines
    header = next(line for line in lines if line.startswith("| ratio, config"))
    assert header.count("x cuDNN") == 2
    # longest packs first; a shape without a peer row shows "-"
    rows = [line for line in lines if line.startswith("| r4 ")]
    assert rows == [
        "| r4 c1d128 | 131072 | v4 | 28.0 (64 / 90%) | 1.05 | v1 | 64.0 (56 / 64%) | 1.13 "
        "| 61.0 | 68.4 |",
        "| r4 c1d512 | 131072 | v4 | 87.5 (82 / 85%) | - | v1 | 196.0 (73 / 69%) | - "
        "| 191.9 | 230.0 |",
        "| r4 c2d128 | 8192 | v2 | 9.0 (24 / 102%) | 1.04 | v1 | 15.4 (28 / 56%) | 1.20 "
        "| 11.0 | 23.4 |"]
    assert F.main(["--doc", str(doc), "--check"]) == 0  # idempotent


def test_the_ratio128_tables_and_a_peer_of_ratio128(tmp_path):
    doc = _fixture_doc(tmp_path, "bench-r128-large", "bench-r128.json")
    F.main(["--doc", str(doc)])
    text = doc.read_text()
    assert ("| config | tokens | fwd cold µs (% roof / % copy) | x cuDNN | bwd cold µs (% roof / "
            "% copy) | x cuDNN | det. cost |") in text
    assert "| c1d128 | 131072 | 27.8 (60 / 74%) | 1.08 | 49.6 (67 / 73%) | 1.01 | +6.0% |" in text
    assert "8192" not in text
    short = F.render("bench-r128-short", [DATA / "bench-r128.json"])
    assert "| c1d128 | 7.8 (14 / 67%) | 10.0 (21 / 59%) | 6.6 | 12.0 (+20.0%) |" in short
    assert "x cuDNN" not in short  # the peer row is the 131072-token shape's only
    assert "131072" not in short


def test_small_rows_without_a_peer_have_no_cudnn_column(tmp_path):
    import json

    doc = json.loads((DATA / "bench-r4.json").read_text())
    del doc["peer"]
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(doc))
    text = F.render("bench-small", [path])
    assert "x cuDNN" not in text and "| r4 c2d128 | 8192 | v2 | 9.0 (24 / 102%) |" in text


def test_a_block_without_its_json_is_left_as_written(tmp_path):
    doc = tmp_path / "KERNELS.md"
    text = "<!-- figures:bench-small figures/none.json -->\nby hand\n<!-- /figures -->\n"
    doc.write_text(text)
    new, missing = F.rewrite(text, tmp_path)
    assert new == text and missing == ["bench-small: missing figures/none.json"]
    assert F.main(["--doc", str(doc), "--check"]) == 0


def _cells(body: str, header: str) -> list[list[str]]:
    """The rows of the table under the header line that starts with ``header``."""
    lines = body.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_the_dispatch_tables_are_what_csagate_schedules_prints(arch):
    """Every (direction, config, bucket) entry of ``csagate schedules --json`` appears in the
    doc's block of its arch with the same kernel tag and shared memory; nothing else does."""
    import json

    from click.testing import CliRunner

    from csagate.cli import cli

    result = CliRunner().invoke(cli, ["schedules", "--arch", arch, "--json"])
    assert result.exit_code == 0, result.output
    entries = json.loads(result.output)["tables"]
    (block,) = [m for m in _blocks() if m["kind"] == "dispatch" and m["sources"].split() == [arch]]
    seen = 0
    for direction, header in (("forward", "| config | bucket | N | forward kernel"),
                              ("backward", "| config | bucket | N | backward kernel")):
        rows = _cells(block["body"], header)
        have = {(config, b): (tag, smem) for config, buckets, _, tag, _, _, _, smem in rows
                for b in buckets.split(", ")}
        want = {(e["config"], e["bucket"]): (e["tag"], str(e["smem_bytes"]))
                for e in entries if e["direction"] == direction and e["arch"] == arch}
        assert have == want, (direction, arch)
        seen += len(want)
    assert seen >= 10


def test_a_dispatch_block_follows_the_tables(tmp_path, monkeypatch):
    """A changed table entry changes the rendered block (the render reads the code)."""
    from dataclasses import replace

    from csagate.kernels import schedule as S

    before = F.render("dispatch", ["sm_90a"])
    entry = S.FWD_DEFAULT_H200[(1, 128)]
    monkeypatch.setitem(S.FWD_DEFAULT_H200, (1, 128), replace(entry, tchunks=4))
    after = F.render("dispatch", ["sm_90a"])
    assert after != before
    assert "| c1d128 | default | 129-1023 | v4t4x32_form_oneexp | 128 |" in after


def test_the_d128_register_table_names_every_small_kernel_at_d128():
    (block,) = [m for m in _blocks() if m["kind"] == "probe-d128"]
    (name,) = block["sources"].split()
    doc = F._load(DOC.parent / name)
    rows = {r[0]: r for r in _cells(block["body"], "| ratio |")}
    for k in doc["kernels"]:
        if k["ratio"] != F.TABLE_RATIO and k["d"] == 128 and not k["deterministic"]:
            column = 1 if k["direction"] == "fwd" else 2
            half = rows[str(k["ratio"])][column].split(" / ")[k["coff"] - 1]
            assert half == f"{k['regs']} (`{k['schedule']['tag']}`)", k["tag"]


def test_an_unknown_kind_is_an_error():
    with pytest.raises(ValueError, match="unknown figure kind"):
        F.render("bench-nothing", [DATA / "bench-r4.json"])


def test_the_fixtures_have_the_schema_bench_writes():
    """The fixtures' rows carry exactly the keys ``csagate bench --json`` writes today."""
    import json

    from csagate.perf.bench import ShapeRow
    from csagate.perf.peer import PeerRow

    from csagate.commands.bench import peer_json, shape_json

    shape = set(shape_json(ShapeRow("c1d128", 8192, 64, "f", "b")))
    peer = set(peer_json(PeerRow("r4 c1d128", 8192, (1.0, 1.0), (1.0, 1.0), (1.0, 1.0),
                                 (1.0, 1.0), 1, 1, 1.0, 0.0, 0.0, True, True)))
    for name in ("bench-r4.json", "bench-r128.json"):
        doc = json.loads((DATA / name).read_text())
        assert {"gpu", "cc", "iters", "warmup", "copy_bw_Bps", "method"} <= set(doc)
        for row in doc.get("small", []) + doc.get("shapes", []):
            assert set(row) == shape, name
        for row in doc.get("peer", []):
            assert set(row) == peer, name
