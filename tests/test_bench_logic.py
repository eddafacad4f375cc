"""The benchmark's pure parts: bytes, decisions, the sweep's candidate space, the CLI's exits."""

import pytest
import torch
from click.testing import CliRunner
from csagate.kernels import schedule as S
from csagate.perf import bench as B

from csagate.cli import cli


def test_op_bytes_counts_every_operand_once():
    fwd = B.op_bytes("fwd", coff=2, d=512, n_tokens=131072, n_rows=1024)
    assert fwd == 2 * 131072 * 1024 * 2 + 128 * 1024 * 4 + 1024 * 512 * 2
    bwd = B.op_bytes("bwd", coff=1, d=128, n_tokens=8192, n_rows=64)
    assert bwd == 4 * 8192 * 128 * 2 + 2 * 128 * 128 * 4 + 64 * 128 * 2


def _ab(base, var, noise=0.0):
    return B.ABRow("bwd", "c1d128", "small", 8192, "goreuse", "a", "b", base, var, noise)


def test_ab_decision_needs_a_win_in_both_orders():
    assert _ab((10.0, 10.0), (9.0, 9.0)).decision == "adopt variant"
    assert _ab((10.0, 10.0), (11.0, 11.0)).decision == "keep base"
    assert _ab((10.0, 10.0), (9.0, 10.2)).decision == "tie: keep base"
    assert _ab((10.0, 10.0), (9.9, 9.9), noise=0.02).decision == "tie: keep base"


def test_ab_shapes_land_in_their_buckets():
    for (direction, coff, d, bucket), tokens in B.AB_SHAPES.items():
        pick = S.fwd_bucket if direction == "fwd" else S.bwd_bucket
        assert pick(coff, d, tokens // 128) == bucket
    covered = {(k[0], k[1], k[2], k[3]) for k in B.AB_SHAPES}
    for direction in ("fwd", "bwd"):
        select = S.select_fwd if direction == "fwd" else S.select_bwd
        for (coff, d), sched in S.selectable(direction):
            assert any(k[0] == direction and (k[1], k[2]) == (coff, d)
                       and select(coff, d, B.AB_SHAPES[k] // 128) == sched for k in covered)


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_sweep_candidates_are_valid_and_include_the_table_geometry(direction):
    for (dr, coff, d, _), tokens in B.AB_SHAPES.items():
        if dr != direction:
            continue
        base = (S.select_fwd if dr == "fwd" else S.select_bwd)(coff, d, tokens // 128)
        geo = B._geometries(dr, coff, d, base)
        assert base in geo and len(geo) == len(set(geo))
        for cand in geo + B._flag_variants(dr, coff, d, base):
            assert S.config_problems(coff, d, cand) == []


def test_sweep_decision():
    row = B.SweepRow("fwd", "c1d128", "small", 8192, "a", "b", None,
                     base_us=(10.0, 10.0), best_us=(8.0, 8.1))
    assert row.decision == "adopt best"
    row.best_us = (9.95, 9.95)
    assert row.decision == "keep base (within noise)"
    same = B.SweepRow("fwd", "c1d128", "small", 8192, "a", "a", None)
    assert same.decision == "keep base (fastest)"


def test_tolerance_check():
    ref = torch.zeros(1000)
    got = ref.clone()
    from csagate.gates import limits

    allowed = limits.count_allowance(ref.numel())
    got[:allowed] = 1e-3
    assert B._tolerance_ok(got, ref)
    got[allowed] = 1e-3
    assert not B._tolerance_ok(got, ref)        # one more than the count allowance
    got = ref.clone()
    got[0] = float("nan")
    assert not B._tolerance_ok(got, ref)


def test_bench_cli_exits():
    runner = CliRunner()
    assert runner.invoke(cli, ["bench", "--shape", "c3d1:9"]).exit_code == 2
    assert runner.invoke(cli, ["bench", "--ratio", "5"]).exit_code == 2   # no such family
    if not torch.cuda.is_available():
        r = runner.invoke(cli, ["bench"])
        assert r.exit_code == 3 and "no CUDA GPU" in r.output


def test_flush_is_at_least_twice_l2_and_256mb():
    assert B.flush_bytes(60 << 20) == 256 << 20            # H200: 60 MB L2 -> the 256 MB floor
    assert B.flush_bytes(200 << 20) == 400 << 20           # a larger L2: twice it
    assert B.flush_bytes(0) == B.FLUSH_MIN_BYTES


def test_cold_iters_never_below_sixty():
    assert B.cold_iters(1) == 60 and B.cold_iters(60) == 60 and B.cold_iters(100) == 100


def test_bandwidth_and_percent():
    assert B.bandwidth(4_000_000, 1.0) == pytest.approx(4e12)
    assert B.bandwidth(1, 0.0) == 0.0
    assert B.percent_of(2e12, 4e12) == 0.5
    assert B.percent_of(2e12, 0.0) == 0.0 and B.percent_of(0.0, 4e12) == 0.0


def test_shape_row_headline_is_cold_and_graph_is_second():
    row = B.ShapeRow("c1d128", 8192, 64, "f", "b", fused_fwd_cold_us=10.0,
                     fused_fwd_graph_us=5.0, fused_bwd_cold_us=20.0, fused_bwd_graph_us=10.0,
                     eager_fwd_us=100.0, eager_total_us=600.0, fwd_bytes=40_000_000,
                     bwd_bytes=80_000_000, copy_bw=8e12)
    assert row.bw("fwd") == pytest.approx(4e12) and row.bw("fwd", "graph") == pytest.approx(8e12)
    assert row.roofline("fwd") == pytest.approx(0.5)
    assert row.roofline("bwd", "graph") == pytest.approx(1.0)
    assert row.fwd_speedup == 10.0 and row.total_speedup == 20.0


def test_vs_copy_is_the_same_size_cold_copy_over_the_kernel():
    row = B.ShapeRow("c1d128", 131072, 1024, "f", "b", fused_fwd_cold_us=28.0,
                     fused_bwd_cold_us=50.0, copy_fwd_cold_us=24.0, copy_bwd_cold_us=40.0)
    assert row.vs_copy("fwd") == pytest.approx(24.0 / 28.0)
    assert row.vs_copy("bwd") == pytest.approx(0.8)
    assert B.ShapeRow("c1d128", 8192, 64, "f", "b", fused_fwd_cold_us=1.0).vs_copy("fwd") == 0.0
    assert B.ShapeRow("c1d128", 8192, 64, "f", "b", copy_fwd_cold_us=1.0).vs_copy("fwd") == 0.0


def test_method_record_names_flush_iters_and_ceiling():
    m = B.method(60 << 20, B.flush_bytes(60 << 20), iters=10, warmup=5)
    assert m["headline"] == "cold" and m["cold_iters"] == 60
    assert m["flush_bytes"] == 256 << 20 and m["l2_bytes"] == 60 << 20
    assert "one launch" in m["cold"] and str(B.COPY_BYTES) in m["copy_ceiling"]
    assert "cold" in m["vs_copy"] and "same" not in m["copy_ceiling"]
    assert f"{B.DET_SLEEP_US} us GPU sleep" in m["cold_bwd_det"] and B.DET_SLEEP_US > 0


def test_shape_json_has_cold_and_graph_figures():
    from csagate.commands.bench import shape_json

    row = B.ShapeRow("c1d128", 8192, 64, "f", "b", fused_fwd_cold_us=10.0,
                     fused_fwd_graph_us=5.0, fused_bwd_cold_us=20.0, fused_bwd_graph_us=10.0,
                     fwd_bytes=40_000_000, bwd_bytes=80_000_000, copy_bw=8e12,
                     copy_bwd_cold_us=15.0)
    rec = shape_json(row)
    assert rec["bwd_vs_copy"] == pytest.approx(0.75) and rec["fwd_vs_copy"] == 0.0
    assert rec["copy_bwd_cold_us"] == 15.0
    assert rec["fwd_cold_Bps"] == pytest.approx(4e12)
    assert rec["fwd_graph_roofline"] == pytest.approx(1.0)
    assert rec["fwd_bytes"] == 40_000_000 and rec["fused_bwd_cold_us"] == 20.0


def test_profile_shapes():
    from csagate.perf import profile as P

    assert P.parse_shape("c2d512:131072") == (2, 512, 131072)
    shapes = P.table_shapes()
    assert set(P.LARGE) <= set(shapes) and len(shapes) == 8
    assert {(c, d) for c, d, t in shapes if t == P.SHORT_TOKENS} == {(c, d) for c, d, _ in P.LARGE}


def test_deterministic_cost():
    assert B.deterministic_cost(100.0, 104.0) == pytest.approx(0.04)
    assert B.deterministic_cost(0.0, 5.0) == 0.0 and B.deterministic_cost(5.0, 0.0) == 0.0
    row = B.ShapeRow("c1d128", 8192, 64, "f", "b", fused_bwd_cold_us=50.0,
                     fused_bwd_det_cold_us=51.0)
    assert row.det_cost == pytest.approx(0.02)
