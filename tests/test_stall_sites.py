"""perf.stall_sites: Nsight Compute's source-page CSV read into per-instruction stall sites."""

from __future__ import annotations

import csv
import io

import pytest
from csagate.perf import stall_sites as SS

HEADER = ["Address", "Source", SS.SAMPLES, "Warp Stall Sampling (Not-issued Samples)",
          SS.EXECUTED, "stall_barrier", "stall_long_sb", "stall_short_sb",
          "stall_long_sb (Not Issued)"]


def export(kernels: dict[str, list[list]]) -> str:
    out = io.StringIO()
    w = csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\n")
    for name, rows in kernels.items():
        w.writerow(["Kernel Name", name])
        w.writerow(HEADER)
        for r in rows:
            w.writerow(r)
    return out.getvalue()


ROWS = [
    ["0x10", "LDG.E R121, desc[UR12][R6.64]", "5", "5", "14336", "0", "0", "0", "0"],
    ["0x20", "PRMT R122, R121, 0x7610, R122", "628", "620", "14336", "0", "624", "0", "500"],
    ["0x30", "@P0 BRA 0x40", "150", "150", "16384", "146", "2", "0", "0"],
    ["0x40", "EXIT", "-", "-", "2,048", "-", "-", "-", "-"],
]


def test_parse_reads_samples_reasons_and_skips_not_issued_copies():
    (p,) = SS.parse(export({"k_bwd": ROWS}))
    assert p.kernel == "k_bwd" and len(p.sites) == 4 and p.total == 783
    prmt = p.sites[1]
    assert (prmt.index, prmt.samples, prmt.executed) == (1, 628, 14336)
    assert prmt.reasons == {"barrier": 0, "long_sb": 624, "short_sb": 0}
    assert prmt.top_reasons() == [("long_sb", 624)]
    assert p.sites[3].samples == 0 and p.sites[3].executed == 2048  # "-" and "2,048"
    assert p.reason_totals() == {"barrier": 146, "long_sb": 626, "short_sb": 0}
    assert [s.index for s in p.top(2)] == [1, 2]


def test_report_ranks_sites_and_shares():
    (p,) = SS.parse(export({"k_bwd": ROWS}))
    lines = SS.report(p, top=2)
    assert lines[0] == "k_bwd: 783 samples"
    assert lines[1].startswith("  long_sb 79.9%, barrier 18.6%")
    assert "PRMT R122" in lines[2] and "80.2%" in lines[2] and "long_sb=624" in lines[2]
    assert "BRA" in lines[3] and len(lines) == 4


def test_several_kernels_and_the_cli(tmp_path, capsys):
    path = tmp_path / "sass.csv"
    path.write_text(export({"fwd_k": ROWS[:1], "r128bwd_k": ROWS}))
    assert [p.kernel for p in SS.parse(path.read_text())] == ["fwd_k", "r128bwd_k"]
    assert SS.main([str(path), "--kernel", "r128bwd", "--top", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("r128bwd_k: 783 samples") and "fwd_k" not in out
    assert SS.main([str(path), "--kernel", "nothing"]) == 2
    assert "no kernel name contains 'nothing'" in capsys.readouterr().err


def test_bad_exports_are_one_line_errors(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    assert SS.main([str(bad)]) == 2
    assert "not an ncu --page source --csv export" in capsys.readouterr().err
    with pytest.raises(ValueError, match="lacks column"):
        SS.parse('"Kernel Name","k"\n"Address","Other"\n"0x1","2"\n')
    assert SS.main([str(tmp_path / "missing.csv")]) == 2
