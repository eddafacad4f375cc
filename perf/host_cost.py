"""Host time of the op as a training step pays it (GPU only; pure helpers are CPU-tested).

Three measurements, each in a process of its own (``python -m csagate.perf.host_cost``), once in
a fresh process and once in one that has first run a torch.compile (a small Linear + GELU
training step through inductor), because what the process has done shows in the op's cost:

* ``host``: forward + ``.backward()`` through autograd, per variant (:data:`VARIANTS`: the op,
  the alternatives it was chosen from, a plain autograd.Function over the api, a do-nothing
  custom op with ``register_autograd`` = the dispatcher's toll, and the api without
  autograd), CPU wall time of each call, p10 / p50 / p90 over ``calls`` back-to-back calls
  after warm-ups, on small shapes (the GPU keeps up: the host is the limit);
* ``gpu``: the cold comparison at 131072 tokens (op forward + backward against the direct
  kernels, L2 flushed before each, CUDA events around one step: perf/bench.py's cold_median),
  and the spread of the op's backward (and api.backward's) over 60 calls at 8192 tokens, CUDA
  events around ``out.backward`` with the GPU idle before it (so a host stall shows);
* ``calls``: one call of each path without autograd (the op's forward and backward ops, the
  api, the do-nothing ops), 1000 back-to-back calls, median of 5.

Nothing here prints except :func:`main` (the worker's one JSON line on stdout).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

# --- the do-nothing ops: the dispatcher's toll --------------------------------------------


@torch.library.custom_op("csagate_bench::noop_fwd", mutates_args=(), device_types="cuda")
def noop_fwd(kv: torch.Tensor, score: torch.Tensor, ape: torch.Tensor, cu_seqlens: torch.Tensor,
             cu_seqlens_comp: torch.Tensor, ratio: int, coff: int, n_rows: int | None = None
             ) -> torch.Tensor:
    """The forward op's signature and output allocation, no kernel."""
    return torch.empty((n_rows, kv.shape[1] // coff), dtype=kv.dtype, device=kv.device)


@noop_fwd.register_fake
def _(kv, score, ape, cu_seqlens, cu_seqlens_comp, ratio, coff, n_rows=None):
    return kv.new_empty((n_rows, kv.shape[1] // coff))


@torch.library.custom_op("csagate_bench::noop_bwd", mutates_args=(), device_types="cuda")
def noop_bwd(kv: torch.Tensor, score: torch.Tensor, ape: torch.Tensor, cu_seqlens: torch.Tensor,
             cu_seqlens_comp: torch.Tensor, grad_out: torch.Tensor, ratio: int, coff: int
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward op's signature and output allocation, no kernel (the op allocates its
    three outputs uninitialized too: the launch zeroes dAPE itself)."""
    return torch.empty_like(kv), torch.empty_like(score), torch.empty_like(ape)


@noop_bwd.register_fake
def _(kv, score, ape, cu_seqlens, cu_seqlens_comp, grad_out, ratio, coff):
    return torch.empty_like(kv), torch.empty_like(score), torch.empty_like(ape)


def _noop_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:5])
    ctx.ratio, ctx.coff = inputs[5], inputs[6]


def _noop_backward(ctx, grad_out):
    dkv, dscore, dape = noop_bwd(*ctx.saved_tensors, grad_out.contiguous(), ctx.ratio, ctx.coff)
    return dkv, dscore, dape, None, None, None, None, None


noop_fwd.register_autograd(_noop_backward, setup_context=_noop_setup)


# --- the op as it was: custom ops over the api, register_autograd, both directions dispatched


@torch.library.custom_op("csagate_bench::before_fwd", mutates_args=(), device_types="cuda")
def before_fwd(kv: torch.Tensor, score: torch.Tensor, ape: torch.Tensor,
               cu_seqlens: torch.Tensor, cu_seqlens_comp: torch.Tensor, ratio: int, coff: int,
               n_rows: int | None = None) -> torch.Tensor:
    return _api().forward(kv, score, ape, cu_seqlens, cu_seqlens_comp, ratio=ratio, coff=coff,
                          n_rows=n_rows)


@torch.library.custom_op("csagate_bench::before_bwd", mutates_args=(), device_types="cuda")
def before_bwd(kv: torch.Tensor, score: torch.Tensor, ape: torch.Tensor,
               cu_seqlens: torch.Tensor, cu_seqlens_comp: torch.Tensor, grad_out: torch.Tensor,
               ratio: int, coff: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _api().backward(kv, score, ape, cu_seqlens, cu_seqlens_comp, grad_out, ratio=ratio,
                           coff=coff)


def _before_backward(ctx, grad_out):
    dkv, dscore, dape = before_bwd(*ctx.saved_tensors, grad_out.contiguous(), ctx.ratio,
                                   ctx.coff)
    return dkv, dscore, dape, None, None, None, None, None


before_fwd.register_autograd(_before_backward, setup_context=_noop_setup)


# --- the alternatives to the op (autograd.Function forms) ---------------------------------


def _api():
    from csagate.kernels import api

    return api


class FunctionOverApi(torch.autograd.Function):
    """The baseline: a plain autograd.Function calling api.forward / api.backward."""

    @staticmethod
    def forward(ctx, kv, score, ape, cu, cuc, ratio, coff, n_rows):
        ctx.save_for_backward(kv, score, ape, cu, cuc)
        ctx.ratio, ctx.coff = ratio, coff
        return _api().forward(kv, score, ape, cu, cuc, ratio=ratio, coff=coff, n_rows=n_rows)

    @staticmethod
    def backward(ctx, grad_out):
        dkv, dscore, dape = _api().backward(*ctx.saved_tensors, grad_out.contiguous(),
                                            ratio=ctx.ratio, coff=ctx.coff)
        return dkv, dscore, dape, None, None, None, None, None


class FunctionOverOps(torch.autograd.Function):
    """An autograd.Function calling the registered custom ops always (what dynamo would
    trace; eagerly it pays the custom ops' dispatch, not their register_autograd)."""

    @staticmethod
    def forward(ctx, kv, score, ape, cu, cuc, ratio, coff, n_rows):
        ctx.save_for_backward(kv, score, ape, cu, cuc)
        ctx.ratio, ctx.coff = ratio, coff
        return torch.ops.csagate.csa_compress_fwd(kv, score, ape, cu, cuc, ratio, coff, n_rows)

    @staticmethod
    def backward(ctx, grad_out):
        dkv, dscore, dape = torch.ops.csagate.csa_compress_bwd(
            *ctx.saved_tensors, grad_out.contiguous(), ctx.ratio, ctx.coff)
        return dkv, dscore, dape, None, None, None, None, None


class FunctionApiOrOps(torch.autograd.Function):
    """flash-attention's form: one Function, the api when not compiling, the ops when
    dynamo traces it (the op routes before the Function instead, kernels/ops.py)."""

    @staticmethod
    def forward(ctx, kv, score, ape, cu, cuc, ratio, coff, n_rows):
        ctx.save_for_backward(kv, score, ape, cu, cuc)
        ctx.ratio, ctx.coff = ratio, coff
        if torch.compiler.is_compiling():
            return torch.ops.csagate.csa_compress_fwd(kv, score, ape, cu, cuc, ratio, coff,
                                                      n_rows)
        return _api().forward(kv, score, ape, cu, cuc, ratio=ratio, coff=coff, n_rows=n_rows)

    @staticmethod
    def backward(ctx, grad_out):
        args = (*ctx.saved_tensors, grad_out.contiguous())
        if torch.compiler.is_compiling():
            dkv, dscore, dape = torch.ops.csagate.csa_compress_bwd(*args, ctx.ratio, ctx.coff)
        else:
            dkv, dscore, dape = _api().backward(*args, ratio=ctx.ratio, coff=ctx.coff)
        return dkv, dscore, dape, None, None, None, None, None


# variant -> what it is (the table's row label)
VARIANTS: dict[str, str] = {
    "op": "csagate.kernels.ops.csa_compress (shipped)",
    "op-before": "custom ops + register_autograd, both dispatched (the op before)",
    "op-register-autograd": "the forward custom op called directly (its register_autograd)",
    "function-over-ops": "autograd.Function calling the custom ops",
    "function-api-or-ops": "autograd.Function, api unless compiling",
    "function-over-api": "plain autograd.Function over the api",
    "noop-register-autograd": "do-nothing custom op + register_autograd",
    "api": "api.forward + api.backward, no autograd",
}


def _forward_of(variant: str, ratio: int, coff: int, n_rows: int) -> Callable:
    """``f(kv, score, ape, cu, cuc) -> out`` for an autograd variant."""
    from csagate.kernels import ops

    functions = {"function-over-ops": FunctionOverOps, "function-api-or-ops": FunctionApiOrOps,
                 "function-over-api": FunctionOverApi}
    if variant == "op":
        return lambda *t: ops.csa_compress(*t, ratio=ratio, coff=coff, n_rows=n_rows)
    if variant == "op-register-autograd":
        op = torch.ops.csagate.csa_compress_fwd
        return lambda *t: op(*t, ratio, coff, n_rows)
    if variant in ("noop-register-autograd", "op-before"):
        op = (torch.ops.csagate_bench.noop_fwd if variant.startswith("noop")
              else torch.ops.csagate_bench.before_fwd)
        return lambda *t: op(*t, ratio, coff, n_rows)
    apply = functions[variant].apply
    return lambda *t: apply(*t, ratio, coff, n_rows)


def training_step(variant: str, inputs, grad_out, *, ratio: int, coff: int) -> Callable:
    """One forward + backward of ``variant`` on ``inputs`` (kv, score, ape, cu, cuc; kv,
    score and ape require grad), the grads reset to None first (the first accumulation then
    takes the gradient tensor itself, no add)."""
    kv, score, ape, cu, cuc = inputs
    n_rows = grad_out.shape[0]
    if variant == "api":
        api = _api()

        def step():
            api.forward(kv, score, ape, cu, cuc, ratio=ratio, coff=coff, n_rows=n_rows)
            api.backward(kv, score, ape, cu, cuc, grad_out, ratio=ratio, coff=coff)
        return step
    f = _forward_of(variant, ratio, coff, n_rows)

    def step():
        kv.grad = score.grad = ape.grad = None
        f(kv, score, ape, cu, cuc).backward(grad_out)
    return step


# --- measuring (pure, clock and sync injectable) ---------------------------------------------


@dataclass(frozen=True)
class HostShape:
    ratio: int
    coff: int
    d: int
    tokens: int

    @property
    def name(self) -> str:
        return f"r{self.ratio}:c{self.coff}d{self.d}:{self.tokens}"

    @classmethod
    def parse(cls, spec: str) -> HostShape:
        """'r128:c1d128:1024' -> HostShape(128, 1, 128, 1024); ValueError naming the spec."""
        from csagate.kernels.registry import parse_shape

        try:
            r, rest = spec.split(":", 1)
            ratio = int(r.removeprefix("r"))
            shape = cls(ratio, *parse_shape(rest))
        except ValueError:
            raise ValueError(f"{spec!r} is not rRATIO:cCOFFdD:TOKENS") from None
        if not r.startswith("r") or ratio < 1:
            raise ValueError(f"{spec!r} is not rRATIO:cCOFFdD:TOKENS")
        return shape


HOST_SHAPES = (HostShape(128, 1, 128, 1024), HostShape(4, 2, 128, 256))


def percentiles(samples, qs=(10, 50, 90)) -> dict[str, float]:
    """{'p10': ..., 'p50': ..., 'p90': ...}: linear interpolation between closest ranks."""
    xs = sorted(float(x) for x in samples)
    if not xs:
        raise ValueError("no samples")
    out = {}
    for q in qs:
        pos = (len(xs) - 1) * q / 100
        lo = int(pos)
        hi = min(lo + 1, len(xs) - 1)
        out[f"p{q}"] = xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)
    return out


def spread(p: dict[str, float]) -> float:
    """p90 / p10 (inf for a zero p10)."""
    return p["p90"] / p["p10"] if p["p10"] > 0 else float("inf")


def per_call_us(call: Callable[[], None], *, calls: int, warm: int,
                clock: Callable[[], float] = time.perf_counter,
                sync: Callable[[], None] | None = None) -> tuple[list[float], float]:
    """CPU wall time of each of ``calls`` back-to-back calls after ``warm`` (us), and the
    wait in the final synchronize (us: a few when the GPU kept up)."""
    sync = sync or torch.cuda.synchronize
    for _ in range(warm):
        call()
    sync()
    times = []
    for _ in range(calls):
        t0 = clock()
        call()
        times.append((clock() - t0) * 1e6)
    t1 = clock()
    sync()
    return times, (clock() - t1) * 1e6


def host_record(times: list[float], tail_us: float) -> dict:
    return {**percentiles(times), "mean": statistics.fmean(times), "calls": len(times),
            "sync_tail_us": tail_us}


def run_a_compile() -> None:
    """What a training process has done besides the op: one inductor-compiled step."""
    lin = torch.nn.Linear(64, 64, device="cuda")
    f = torch.compile(lambda x: torch.nn.functional.gelu(lin(x)).square().mean())
    x = torch.randn(32, 64, device="cuda", requires_grad=True)
    for _ in range(2):
        f(x).backward()
    torch.cuda.synchronize()


# --- the worker's tasks (GPU) ----------------------------------------------------------------


def _pack(shape: HostShape, *, grad: bool = True):
    from csagate.reference import make_grad_out, make_pack

    p = make_pack((shape.tokens,), ratio=shape.ratio, coff=shape.coff, d=shape.d,
                  device="cuda")
    inputs = [t.clone() for t in p.inputs()]
    if grad:
        for t in inputs[:3]:
            t.requires_grad_(True)
    return inputs, make_grad_out(p.n_rows, shape.d, device="cuda")


def host_task(variants, shapes, *, calls: int = 1000, warm: int = 100,
              rounds: int = 10) -> list[dict]:
    """Forward + backward per call of each variant, each shape: p10/p50/p90 us. The variants
    run interleaved in one process, ``rounds`` rounds of ``calls // rounds`` calls, the order
    reversed every other round, so machine drift falls on all of them alike."""
    rows = []
    for shape in shapes:
        inputs, go = _pack(shape)
        steps = {v: training_step(v, inputs, go, ratio=shape.ratio, coff=shape.coff)
                 for v in variants}
        samples = {v: [] for v in variants}
        tails = {v: [] for v in variants}
        for step in steps.values():
            per_call_us(step, calls=1, warm=warm)
        for r in range(rounds):
            for v in (variants if r % 2 == 0 else tuple(reversed(variants))):
                times, tail = per_call_us(steps[v], calls=max(1, calls // rounds), warm=5)
                samples[v] += times
                tails[v].append(tail)
        rows += [{"variant": v, "shape": shape.name, "n_rows": go.shape[0],
                  **host_record(samples[v], statistics.median(tails[v]))} for v in variants]
    return rows


def backward_spread(shape: HostShape, *, calls: int = 60, warm: int = 10) -> dict:
    """The op's backward (``out.backward``) and api.backward, ``calls`` times each with the
    GPU idle before: CUDA-event us (host stalls show) and host us, p10/p50/p90."""
    from csagate.kernels import ops

    api = _api()
    inputs, go = _pack(shape)
    kv, score, ape, cu, cuc = inputs
    r, c, n = shape.ratio, shape.coff, go.shape[0]
    detached = [t.detach() for t in inputs]

    def op_backward():
        kv.grad = score.grad = ape.grad = None
        out = ops.csa_compress(kv, score, ape, cu, cuc, ratio=r, coff=c, n_rows=n)
        return lambda: out.backward(go)

    def api_backward():
        return lambda: api.backward(*detached, go, ratio=r, coff=c)

    out = {"shape": shape.name}
    for name, prepare in (("op_backward", op_backward), ("api_backward", api_backward)):
        ev, host = [], []
        for i in range(warm + calls):
            call = prepare()
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            start.record()
            call()
            end.record()
            t1 = time.perf_counter()
            end.synchronize()
            if i >= warm:
                ev.append(start.elapsed_time(end) * 1e3)
                host.append((t1 - t0) * 1e6)
        out[name] = {"event_us": percentiles(ev), "host_us": percentiles(host)}
        out[name]["event_spread"] = spread(out[name]["event_us"])
    return out


def cold_compare(shape: HostShape, *, iters: int = 60, warmup: int = 10) -> dict:
    """Cold (L2 flushed) forward + backward: the op through autograd, api.forward +
    api.backward, and the direct kernels (run_forward / run_backward into buffers)."""
    from csagate.perf.bench import L2Flush, cold_median

    api = _api()
    inputs, go = _pack(shape)
    kv, score, ape, cu, cuc = inputs
    r, c, n = shape.ratio, shape.coff, go.shape[0]
    plain = [t.detach() for t in inputs]
    out = torch.empty(n, shape.d, dtype=torch.bfloat16, device="cuda")
    dkv, dscore, dape = (torch.empty_like(t) for t in plain[:3])

    def kernels():
        api.run_forward(*plain, out, ratio=r, coff=c)
        api.run_backward(*plain, go, dkv, dscore, dape, ratio=r, coff=c, zero_dape=True)

    steps = {"op": training_step("op", inputs, go, ratio=r, coff=c),
             "api": training_step("api", plain, go, ratio=r, coff=c), "kernels": kernels}
    flush = L2Flush()
    res = {"shape": shape.name}
    for name, fn in steps.items():
        res[f"{name}_us"] = cold_median(fn, flush, iters=iters, warmup=warmup).median_us
    res["op_over_kernels"] = res["op_us"] / res["kernels_us"]
    return res


COLD_SHAPES = (HostShape(128, 1, 128, 131072), HostShape(128, 2, 512, 131072))
SPREAD_SHAPE = HostShape(128, 1, 128, 8192)


def gpu_task() -> dict:
    return {"cold": [cold_compare(s) for s in COLD_SHAPES],
            "spread": backward_spread(SPREAD_SHAPE)}


def host_us(call, *, calls: int = 1000, warm: int = 100, reps: int = 5) -> tuple[float, float]:
    """Median over ``reps`` of the mean us per call of ``calls`` back-to-back calls."""
    per, tails = [], []
    for _ in range(reps):
        times, tail = per_call_us(call, calls=calls, warm=warm)
        per.append(statistics.fmean(times))
        tails.append(tail)
    return statistics.median(per), statistics.median(tails)


def calls_task(*, tokens: int = 1024, coff: int = 1, d: int = 128) -> list[dict]:
    """One call of each path, no autograd (ratio=128): the api, the op's custom ops, the
    do-nothing ops."""
    from csagate.kernels import ops

    api = _api()
    (kv, score, ape, cu, cuc), go = _pack(HostShape(128, coff, d, tokens), grad=False)
    n = go.shape[0]
    out = torch.empty(n, d, dtype=torch.bfloat16, device="cuda")
    dkv, dsc, dape = torch.empty_like(kv), torch.empty_like(score), torch.zeros_like(ape)
    fwd_op, bwd_op = torch.ops.csagate.csa_compress_fwd, torch.ops.csagate.csa_compress_bwd
    nf, nb = torch.ops.csagate_bench.noop_fwd, torch.ops.csagate_bench.noop_bwd
    paths = [
        ("api.run_forward (launch into out)",
         lambda: api.run_forward(kv, score, ape, cu, cuc, out, ratio=128, coff=coff)),
        ("api.forward (allocates out)",
         lambda: api.forward(kv, score, ape, cu, cuc, ratio=128, coff=coff, n_rows=n)),
        ("csa_compress without grad (= api.forward)",
         lambda: ops.csa_compress(kv, score, ape, cu, cuc, ratio=128, coff=coff, n_rows=n)),
        ("op csa_compress_fwd", lambda: fwd_op(kv, score, ape, cu, cuc, 128, coff, n)),
        ("do-nothing op, forward signature", lambda: nf(kv, score, ape, cu, cuc, 128, coff, n)),
        ("api.run_backward (launch into buffers)",
         lambda: api.run_backward(kv, score, ape, cu, cuc, go, dkv, dsc, dape, ratio=128,
                                  coff=coff)),
        ("api.backward (allocates; the launch zeroes dape)",
         lambda: api.backward(kv, score, ape, cu, cuc, go, ratio=128, coff=coff)),
        ("api.backward(deterministic=True)",
         lambda: api.backward(kv, score, ape, cu, cuc, go, ratio=128, coff=coff,
                              deterministic=True)),
        ("op csa_compress_bwd", lambda: bwd_op(kv, score, ape, cu, cuc, go, 128, coff)),
        ("do-nothing op, backward signature",
         lambda: nb(kv, score, ape, cu, cuc, go, 128, coff)),
    ]
    return [{"path": name, "us": us, "sync_tail_us": tail}
            for name, (us, tail) in ((name, host_us(call)) for name, call in paths)]


# --- the parent: one process per measurement ------------------------------------------------


def worker_argv(task: str, *, variants=(), compiled: bool = False,
                shapes=(), calls: int | None = None) -> list[str]:
    argv = [sys.executable, "-m", "csagate.perf.host_cost", "--task", task]
    for v in variants:
        argv += ["--variant", v]
    if compiled:
        argv.append("--compiled")
    for s in shapes:
        argv += ["--shape", s.name]
    if calls is not None:
        argv += ["--calls", str(calls)]
    return argv


def run_worker(argv: list[str], *, run=subprocess.run) -> dict:
    """The worker's result: the last line of its stdout, JSON. RuntimeError with the tail of
    its stderr when it failed."""
    proc = run(argv, capture_output=True, text=True)
    lines = [ln for ln in (proc.stdout or "").splitlines() if ln.strip()]
    if proc.returncode != 0 or not lines:
        tail = " | ".join((proc.stderr or "").strip().splitlines()[-3:])
        raise RuntimeError(f"{' '.join(argv[2:])} exited {proc.returncode}: {tail}")
    return json.loads(lines[-1])


def measure_all(variants=tuple(VARIANTS), shapes=HOST_SHAPES, *, calls: int = 1000,
                run=subprocess.run, progress: Callable[[str], None] | None = None) -> dict:
    """Every measurement: the variants interleaved in one fresh process and in one that has
    run a torch.compile; the GPU figures and the per-call paths each in a process of their
    own."""
    report = {"host": [], "gpu": {}, "calls": None}
    for compiled in (False, True):
        process = "compiled" if compiled else "fresh"
        if progress:
            progress(f"{len(variants)} variants interleaved ({process} process)")
        rows = run_worker(worker_argv("host", variants=variants, compiled=compiled,
                                      shapes=shapes, calls=calls), run=run)
        report["host"] += [{"process": process, **r} for r in rows]
        if progress:
            progress(f"cold 131072-token comparison, backward spread ({process} process)")
        report["gpu"][process] = run_worker(worker_argv("gpu", compiled=compiled), run=run)
    if progress:
        progress("per-call paths without autograd (fresh process)")
    report["calls"] = run_worker(worker_argv("calls"), run=run)
    report["targets"] = targets(report)
    return report


def _p50(report: dict, variant: str, process: str, shape: str) -> float | None:
    for r in report["host"]:
        if (r["variant"], r["process"], r["shape"]) == (variant, process, shape):
            return r["p50"]
    return None


def targets(report: dict) -> list[dict]:
    """The figures the targets name: op / plain Function (<= 1.25, each shape and process),
    op / direct kernels cold at 131072 tokens (<= 1.10), p90 / p10 of the op's backward in
    the compiled process (<= 1.5)."""
    out = []
    for shape in dict.fromkeys(r["shape"] for r in report["host"]):
        for process in ("fresh", "compiled"):
            op, base = (_p50(report, v, process, shape) for v in ("op", "function-over-api"))
            if op and base:
                out.append({"what": f"op / Function p50, {shape}, {process}",
                            "value": op / base, "limit": 1.25})
    for process, g in report["gpu"].items():
        for c in g["cold"]:
            out.append({"what": f"op / kernels cold, {c['shape']}, {process}",
                        "value": c["op_over_kernels"], "limit": 1.10})
        sp = g["spread"]["op_backward"]["event_spread"]
        out.append({"what": f"op backward p90/p10, {g['spread']['shape']}, {process}",
                    "value": sp, "limit": 1.5 if process == "compiled" else None})
    for t in out:
        t["ok"] = None if t["limit"] is None else t["value"] <= t["limit"]
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m csagate.perf.host_cost")
    ap.add_argument("--task", choices=("host", "gpu", "calls"), required=True)
    ap.add_argument("--variant", choices=tuple(VARIANTS), action="append", default=[])
    ap.add_argument("--compiled", action="store_true", help="run a torch.compile first")
    ap.add_argument("--shape", action="append", default=[], type=HostShape.parse)
    ap.add_argument("--calls", type=int, default=1000)
    a = ap.parse_args(argv)
    if a.compiled:
        run_a_compile()
    if a.task == "host":
        result = host_task(tuple(a.variant or VARIANTS), a.shape or HOST_SHAPES, calls=a.calls)
    elif a.task == "gpu":
        result = gpu_task()
    else:
        result = calls_task()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
