"""The host benchmark's pure parts (perf/host_cost.py) on CPU: shapes, percentiles, the per-call
timer with a stand-in clock, the worker protocol with a stand-in subprocess, the targets, the
tables at 80 columns, and the autograd variants' gradients with the reference as the api."""

from __future__ import annotations

import io
import json
import sys
from types import SimpleNamespace

import csagate.reference as REF
import pytest
import torch
from csagate.kernels import ops
from csagate.perf import host_cost as H
from rich.console import Console

from csagate import console
from csagate.commands.bench import host_tables


def test_shape_parse_round_trips_and_refuses():
    s = H.HostShape.parse("r128:c1d128:1024")
    assert s == H.HostShape(128, 1, 128, 1024) and H.HostShape.parse(s.name) == s
    for bad in ("128:c1d128:1024", "r128:c1:1024", "r4:c2d128", "r4:c0d128:256", "x"):
        with pytest.raises(ValueError, match="rRATIO:cCOFFdD:TOKENS"):
            H.HostShape.parse(bad)


def test_percentiles_interpolate_between_ranks():
    p = H.percentiles(range(1, 12))  # 1..11
    assert p == {"p10": 2.0, "p50": 6.0, "p90": 10.0}
    assert H.percentiles([5.0]) == {"p10": 5.0, "p50": 5.0, "p90": 5.0}
    assert H.percentiles([0.0, 10.0], qs=(25,)) == {"p25": 2.5}
    assert H.spread({"p10": 2.0, "p90": 3.0}) == 1.5
    with pytest.raises(ValueError):
        H.percentiles([])


def test_per_call_us_times_each_call_after_the_warmups():
    now = [0.0]
    calls = []

    def call():
        calls.append(now[0])
        now[0] += 1e-6 * (10 if len(calls) % 2 else 30)  # 10 us, 30 us, 10 us ...

    synced = []
    times, tail = H.per_call_us(call, calls=4, warm=3, clock=lambda: now[0],
                                sync=lambda: synced.append(len(calls)))
    assert len(calls) == 7 and synced == [3, 7]  # synced after the warm-ups and at the end
    assert times == pytest.approx([30, 10, 30, 10]) and tail == 0


def test_worker_argv_and_protocol():
    argv = H.worker_argv("host", variants=("op", "api"), compiled=True, shapes=H.HOST_SHAPES,
                         calls=50)
    assert argv[:3] == [sys.executable, "-m", "csagate.perf.host_cost"]
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--variant"] == ["op", "api"]
    assert "--compiled" in argv
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--shape"] == [
        s.name for s in H.HOST_SHAPES]
    ok = lambda *a, **k: SimpleNamespace(returncode=0, stdout='warming\n{"x": 1}\n', stderr="")
    assert H.run_worker(argv, run=ok) == {"x": 1}
    bad = lambda *a, **k: SimpleNamespace(returncode=1, stdout="",
                                          stderr="Traceback\n  ...\nValueError: boom\n")
    with pytest.raises(RuntimeError, match="exited 1: .*ValueError: boom"):
        H.run_worker(argv, run=bad)


def _fake_worker(op_p50=110.0, base_p50=100.0, spread=(10.0, 12.0)):
    """A stand-in subprocess.run answering each task as the worker would."""
    seen = []

    def run(argv, **kw):
        seen.append(argv)
        task = argv[argv.index("--task") + 1]
        if task == "host":
            variants = [argv[i + 1] for i, a in enumerate(argv) if a == "--variant"]
            shapes = [argv[i + 1] for i, a in enumerate(argv) if a == "--shape"]
            out = []
            for v in variants:
                p50 = {"op": op_p50, "function-over-api": base_p50}.get(v, 50.0)
                out += [{"variant": v, "shape": s, "n_rows": 8, "p10": p50 - 5, "p50": p50,
                         "p90": p50 + 20, "mean": p50, "calls": 10, "sync_tail_us": 1.0}
                        for s in shapes]
        elif task == "gpu":
            e = {"p10": spread[0], "p50": spread[0], "p90": spread[1]}
            b = {"event_us": e, "host_us": e, "event_spread": spread[1] / spread[0]}
            out = {"cold": [{"shape": s.name, "op_us": 83.0, "api_us": 80.0,
                             "kernels_us": 76.0, "op_over_kernels": 83 / 76}
                            for s in H.COLD_SHAPES],
                   "spread": {"shape": H.SPREAD_SHAPE.name, "op_backward": b,
                              "api_backward": b}}
        else:
            out = [{"path": "api.forward (allocates out)", "us": 8.5, "sync_tail_us": 2.0}]
        return SimpleNamespace(returncode=0, stdout=json.dumps(out) + "\n", stderr="")

    return run, seen


def test_measure_all_runs_each_variant_in_both_processes():
    run, seen = _fake_worker()
    report = H.measure_all(run=run)
    host = [a for a in seen if "host" in a]
    assert len(host) == 2  # all variants interleaved in one process, fresh and compiled
    assert sorted("--compiled" in a for a in host) == [False, True]
    for a in host:
        assert [a[i + 1] for i, x in enumerate(a) if x == "--variant"] == list(H.VARIANTS)
    assert set(report["gpu"]) == {"fresh", "compiled"}
    assert {(r["variant"], r["process"], r["shape"]) for r in report["host"]} == {
        (v, p, s.name) for v in H.VARIANTS for p in ("fresh", "compiled") for s in H.HOST_SHAPES}


def test_targets_compare_against_their_limits():
    run, _ = _fake_worker(op_p50=130.0, base_p50=100.0, spread=(10.0, 14.0))
    t = {g["what"]: g for g in H.measure_all(run=run)["targets"]}
    fn = [g for w, g in t.items() if w.startswith("op / Function")]
    assert len(fn) == 2 * len(H.HOST_SHAPES)
    assert all(g["value"] == pytest.approx(1.3) and g["ok"] is False for g in fn)
    cold = [g for w, g in t.items() if w.startswith("op / kernels cold")]
    assert cold and all(g["ok"] for g in cold)
    spread = t[f"op backward p90/p10, {H.SPREAD_SHAPE.name}, compiled"]
    assert spread["value"] == pytest.approx(1.4) and spread["ok"] is True
    assert t[f"op backward p90/p10, {H.SPREAD_SHAPE.name}, fresh"]["ok"] is None


@pytest.mark.parametrize("width", [80, 120])
def test_host_tables_fit_and_keep_every_number(width):
    run, _ = _fake_worker()
    report = H.measure_all(run=run)
    buf = io.StringIO()
    con = Console(file=buf, width=width, markup=False, emoji=False, highlight=False,
                  no_color=True)
    for table in host_tables(report):
        console.print_table(table, con)
    text = buf.getvalue()
    assert max(len(line) for line in text.splitlines()) <= width
    for needle in ("110.0", "105-130", "83.0", "1.09", "1.20", "8.5", "yes"):
        assert needle in text, needle


# --- the autograd variants: same gradients, the reference standing in for the api ----------


class _RefApi:
    def forward(self, kv, score, ape, cu, cuc, *, ratio, coff, n_rows=None):
        return REF.forward(kv, score, ape, cu, cuc, ratio=ratio, coff=coff, n_rows=n_rows)

    def backward(self, kv, score, ape, cu, cuc, grad_out, *, ratio, coff):
        g = REF.backward(kv, score, ape, cu, cuc, grad_out, ratio=ratio, coff=coff)
        return g.dkv, g.dscore, g.dape


@pytest.mark.parametrize("variant", ["op", "function-over-api", "function-api-or-ops"])
def test_autograd_variants_give_the_reference_gradients(monkeypatch, variant):
    ref_api = _RefApi()
    monkeypatch.setattr(H, "_api", lambda: ref_api)
    monkeypatch.setattr(ops, "api", ref_api)
    monkeypatch.setattr(ops, "_eager", lambda kv, other: True)  # CPU stands in for CUDA
    p = REF.make_pack((300, 129), ratio=128, coff=2, d=128)
    inputs = [t.clone() for t in p.inputs()]
    for t in inputs[:3]:
        t.requires_grad_(True)
    go = REF.make_grad_out(p.n_rows, 128)
    step = H.training_step(variant, inputs, go, ratio=128, coff=2)
    step()
    first = [t.grad.clone() for t in inputs[:3]]
    step()  # grads reset, not accumulated
    ref = REF.backward(*p.inputs(), go, ratio=128, coff=2)
    for got, again, want in zip((t.grad for t in inputs[:3]), first,
                                (ref.dkv, ref.dscore, ref.dape)):
        assert torch.equal(got, want) and torch.equal(again, want)
