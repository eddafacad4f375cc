"""CPU checks of ``csagate bench --peer``: its usage errors and refusals, the peer row's derived
figures, its table, and the cold timing's hide-host option (the GPU parts stubbed)."""

from __future__ import annotations

import io

import click
import pytest
import torch
from click.testing import CliRunner
from csagate.perf import bench as B
from csagate.perf.peer import PeerRow
from rich.console import Console

from csagate.cli import cli
from csagate.commands import bench as bench_cmd


def _error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("Error:")]


@pytest.mark.parametrize("args, words", [
    (["--peer", "cudnn", "--ab", "goreuse"], "does not go with --ab"),
    (["--peer", "cudnn", "--host"], "does not go with --ab"),
    (["--peer", "cudnn", "--ratio", "all", "--sweep", "fwd"], "does not go with --ab"),
    (["--peer", "cudnn", "--ratio", "8"], "--peer supports --ratio 2|4|128|all"),
    (["--peer", "nope"], "Invalid value for '--peer'"),
])
def test_peer_usage_errors_exit_2_with_one_line(args, words):
    r = CliRunner().invoke(cli, ["bench", *args])
    assert r.exit_code == 2, r.output
    errors = _error_lines(r.output)
    assert len(errors) == 1 and words in errors[0], r.output


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA GPU")
def test_peer_without_a_gpu_exits_3():
    r = CliRunner().invoke(cli, ["bench", "--ratio", "4", "--peer", "cudnn"])
    assert r.exit_code == 3 and "no CUDA GPU" in r.output
    assert r.output.count("csagate:") == 1 and "Traceback" not in r.output


def test_peer_refusal_exits_3_naming_the_reason_and_the_env(monkeypatch):
    """The peer's own refusal, checked before any timing (nothing else reaches the GPU)."""
    from csagate.gates import builtin_impls

    why = "nvidia-cudnn-frontend refuses: RuntimeError: needs compute capability major >= 10"
    monkeypatch.setattr(bench_cmd, "_need_gpu", lambda: None)
    monkeypatch.setattr(builtin_impls.Cudnn, "unavailable", lambda self, device: why)
    monkeypatch.setattr(B, "copy_bandwidth", lambda: pytest.fail("timed before the check"))
    r = CliRunner().invoke(cli, ["bench", "--ratio", "2", "--peer", "cudnn"])
    assert r.exit_code == 3, r.output
    message = " ".join(r.output.split())
    assert message.count("csagate:") == 1 and "Traceback" not in r.output
    assert why in message and builtin_impls.CUDNN_MEASURE_ENV in message
    assert "--peer cudnn cannot run" in message


@pytest.mark.parametrize("ratio, small, want", [
    ("all", [2, 4, 8, 16, 32], [2, 4, 128]), ("2", [2], [2]), ("4", [4], [4]),
    ("128", [], [128])])
def test_peer_ratios_are_the_benched_ones_it_supports(ratio, small, want):
    assert bench_cmd._peer_ratios(ratio, small) == want


def test_peer_ratios_refuse_a_ratio_it_lacks():
    with pytest.raises(click.UsageError, match="--ratio 16"):
        bench_cmd._peer_ratios("16", [16])


def _row(**kw) -> PeerRow:
    base = dict(config="r4 c2d128", tokens=8192, ours_fwd_us=(10.0, 12.0),
                peer_fwd_us=(15.0, 18.0), ours_bwd_us=(20.0, 20.0), peer_bwd_us=(19.0, 21.0),
                fwd_bytes=44_000_000, bwd_bytes=80_000_000, copy_bw=4e12, out_max_abs=0.0078,
                dape_max_abs=1e-6, dkv_equal=True, dscore_equal=True)
    return PeerRow(**(base | kw))


def test_peer_row_means_speedups_and_ceiling():
    row = _row()
    assert row.us("ours", "fwd") == 11.0 and row.us("peer", "fwd") == 16.5
    assert row.speedup("fwd") == pytest.approx(1.5)       # peer / ours: ours 1.5x faster
    assert row.speedup("bwd") == pytest.approx(1.0)
    assert row.roofline("ours", "fwd") == pytest.approx(1.0)      # 44 MB in 11 us of 4 TB/s
    assert row.roofline("peer", "bwd") == pytest.approx(1.0)      # 80 MB in 20 us
    assert row.roofline("peer", "fwd") == pytest.approx(11.0 / 16.5)
    assert row.bits_equal and not _row(dscore_equal=False).bits_equal
    missing = _row(ours_fwd_us=(0.0, 0.0))
    assert missing.speedup("fwd") == 0.0 and missing.roofline("ours", "fwd") == 0.0


def test_peer_json_keeps_the_orders_and_adds_the_derived_figures():
    rec = bench_cmd.peer_json(_row(dkv_equal=False))
    assert rec["ours_fwd_us"] == (10.0, 12.0) and rec["peer_fwd_mean_us"] == 16.5
    assert rec["fwd_speedup"] == pytest.approx(1.5) and rec["ours_fwd_roofline"] == 1.0
    assert rec["bits_equal"] is False and rec["out_max_abs"] == 0.0078


def test_peer_table_fits_80_columns_with_every_figure():
    con = Console(file=io.StringIO(), width=80, color_system=None, markup=False, emoji=False,
                  highlight=False)
    label = "cudnn [MEASUREMENT ONLY: the package's compute-capability check lowered to 9]"
    rows = [_row(), _row(config="r128 c2d512", tokens=131072, ours_bwd_us=(180.4, 183.6),
                         peer_bwd_us=(190.0, 192.0), dkv_equal=False)]
    bench_cmd.console.print_table(bench_cmd.peer_table(rows, f"{label}, 1.32.0"), con)
    text = con.file.getvalue()
    assert all(len(line) <= 80 for line in text.splitlines()) and "…" not in text
    flat = " ".join(text.split())
    for cell in ("MEASUREMENT ONLY", "1.32.0", "vs cuDNN", "11.0", "16.5", "1.50", "182.0",
                 "191.0", "1.05", "131072"):
        assert cell in flat, cell
    marks = [line.split()[-2] for line in text.splitlines() if line.lstrip("│ ").startswith("r")]
    assert marks == ["yes", "no"], text


def test_sleep_cycles_last_at_least_the_microseconds_asked():
    assert B.sleep_cycles(200.0) == 200 * B.SLEEP_CYCLES_PER_US
    assert B.SLEEP_CYCLES_PER_US >= 1980               # the H200's boost clock, MHz
    assert B.sleep_cycles(0.0) == 0 and B.sleep_cycles(-1.0) == 0


def test_interleaved_pairs_per_launcher_with_hide_host_and_befores(monkeypatch):
    """The orders, the per-launcher ``before`` and the hide-host option reach every sample;
    each launcher gets its (order 1, order 2) pair. ``_cold_once`` (the GPU part) is stubbed
    with a fixed time per launcher and order."""
    seen = []

    def fake_cold_once(fn, flush, before, hide_host_us=0.0):
        seen.append((fn.name, before, hide_host_us))
        order = 1 if len(seen) > 2 * B.COLD_MIN_ITERS else 0
        return {"a": 10.0, "b": 20.0}[fn.name] + order

    monkeypatch.setattr(B, "_cold_once", fake_cold_once)
    monkeypatch.setattr(B.torch.cuda, "synchronize", lambda: None)
    launched = []
    a, b = (lambda: launched.append("a")), (lambda: launched.append("b"))
    a.name, b.name = "a", "b"
    zero_a, zero_b = (lambda: launched.append("za")), (lambda: launched.append("zb"))
    got_a, got_b = B.interleaved([a, b], iters=1, warmup=2, flush=lambda: None,
                                 before=[zero_a, zero_b], hide_host_us=200.0)
    assert got_a == (10.0, 11.0) and got_b == (20.0, 21.0)
    n = B.COLD_MIN_ITERS
    assert len(seen) == 4 * n and all(h == 200.0 for *_, h in seen)
    assert all(before is (zero_a if name == "a" else zero_b) for name, before, _ in seen)
    assert [name for name, *_ in seen[:2]] == ["a", "b"]          # order 1: A first
    assert [name for name, *_ in seen[2 * n:2 * n + 2]] == ["b", "a"]  # order 2: B first
    assert launched[:4] == ["za", "a", "za", "a"]                # warm-ups zero first too
    seen.clear()
    B.interleaved([a, b], iters=1, warmup=0, flush=lambda: None, before=zero_a)
    assert all(before is zero_a and h == 0.0 for _, before, h in seen)
