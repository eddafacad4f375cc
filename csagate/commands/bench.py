from __future__ import annotations

import dataclasses
import json

import click
from rich.table import Table

from csagate import console, options
from csagate.exitcodes import ExitCode
from csagate.kernels import schedule as S
from csagate.kernels.registry import SMALL_RATIOS, TABLE_RATIO, has_tables, parse_shape
from csagate.report_files import checked_file

TABLE = str(TABLE_RATIO)  # the --ratio choice of the table family


def _need_gpu() -> None:
    try:
        import torch
    except Exception as exc:  # pragma: no cover - torch is a dependency
        console.abort(f"torch is not importable ({exc})", ExitCode.COULD_NOT_EVALUATE)
    if not torch.cuda.is_available():
        console.abort("no CUDA GPU visible: the benchmark times the kernels on a GPU; run it "
                      "on a GPU runner", ExitCode.COULD_NOT_EVALUATE)
    from csagate.kernels._dsl import dsl_available

    ok, why = dsl_available()
    if not ok:
        console.abort(f"{why}; install it with `make setup`", ExitCode.COULD_NOT_EVALUATE)


def schedule_name(tag: str, config: str) -> str:
    """A kernel tag without the direction and config prefix the table already shows
    ('bwd_c1d128_v2t8x32_fastexp_regwin' -> 'v2t8x32_fastexp_regwin'), so the cell stays narrow."""
    for prefix in (f"fwd_{config}_", f"bwd_{config}_"):
        if tag.startswith(prefix):
            return tag[len(prefix):]
    return tag


def shape_tables(rows, copy_bw: float) -> tuple[Table, Table]:
    """The forward table and the backward (+ forward-and-backward totals) table."""
    note = (f"copy roofline {copy_bw / 1e12:.2f} TB/s; cold us = L2 flushed, events around one "
            "launch (headline: x, TB/s, % roof); graph us = warm graph replay per launch; "
            "% copy = a cold copy of the same bytes against the kernel")
    fwd_cols = ("config", "tokens", "kernel", "cold\nus", "graph\nus", "eager\nus", "x",
                "TB/s", "%\nroof", "%\ncopy")
    fwd = console.new_table(f"ratio=128 forward, fused vs eager fp32 ({note})", fwd_cols,
                            marks=fwd_cols[3:], right=(fwd_cols[1], *fwd_cols[3:]))
    bwd_cols = ("config", "tokens", "kernel", "cold\nus", "graph\nus", "TB/s", "%\nroof",
                "%\ncopy", "eager f+b\nus", "f+b\nx")
    bwd = console.new_table("ratio=128 backward, and forward+backward vs eager", bwd_cols,
                            marks=bwd_cols[3:], right=(bwd_cols[1], *bwd_cols[3:]))
    for r in rows:
        fwd.add_row(r.config, str(r.tokens), schedule_name(r.fwd_kernel, r.config),
                    f"{r.fused_fwd_cold_us:.1f}",
                    f"{r.fused_fwd_graph_us:.1f}", f"{r.eager_fwd_us:.1f}", f"{r.fwd_speedup:.1f}",
                    f"{r.bw('fwd') / 1e12:.2f}", f"{100 * r.roofline('fwd'):.0f}%",
                    f"{100 * r.vs_copy('fwd'):.0f}%")
        bwd.add_row(r.config, str(r.tokens), schedule_name(r.bwd_kernel, r.config),
                    f"{r.fused_bwd_cold_us:.1f}",
                    f"{r.fused_bwd_graph_us:.1f}", f"{r.bw('bwd') / 1e12:.2f}",
                    f"{100 * r.roofline('bwd'):.0f}%", f"{100 * r.vs_copy('bwd'):.0f}%",
                    f"{r.eager_total_us:.1f}",
                    f"{r.total_speedup:.1f}")
    return fwd, bwd


def small_table(rows, copy_bw: float) -> Table:
    """The small-ratio families: forward and backward per shape, cold headline first."""
    cols = ("ratio config", "tokens", "fwd\nkernel", "fwd cold\nus", "fwd\ngraph", "fwd\n%roof",
            "fwd\n%copy", "bwd\nkernel", "bwd cold\nus", "bwd\ngraph", "bwd\n%roof",
            "bwd\n%copy", "bwd det\nus")
    t = console.new_table(f"small ratios, cold (copy roofline {copy_bw / 1e12:.2f} TB/s; cold us "
                          "= L2 flushed, events around one launch; graph = warm graph replay "
                          "per launch; % copy = a cold copy of the same bytes against the "
                          "kernel)", cols, marks=cols[3:7] + cols[8:],
                          right=(cols[1], *cols[3:7], *cols[8:]))
    for r in rows:  # tags 'r2fwd_c1d128_v2': the schedule is what follows the config
        t.add_row(r.config, str(r.tokens), r.fwd_kernel.split("_", 2)[-1],
                  f"{r.fused_fwd_cold_us:.1f}", f"{r.fused_fwd_graph_us:.1f}",
                  f"{100 * r.roofline('fwd'):.0f}%", f"{100 * r.vs_copy('fwd'):.0f}%",
                  r.bwd_kernel.split("_", 2)[-1],
                  f"{r.fused_bwd_cold_us:.1f}", f"{r.fused_bwd_graph_us:.1f}",
                  f"{100 * r.roofline('bwd'):.0f}%", f"{100 * r.vs_copy('bwd'):.0f}%",
                  f"{r.fused_bwd_det_cold_us:.1f}")
    return t


def det_table(rows) -> Table:
    """The deterministic backward's cost (cold, both modes)."""
    cols = ("config", "tokens", "default\nus", "determ.\nus", "cost")
    t = console.new_table("ratio=128 backward: deterministic=True (per-CTA dAPE partials + "
                          "ordered reduction) vs the default atomics, cold us", cols,
                          marks=cols[2:], right=(cols[1], *cols[2:]))
    for r in rows:
        t.add_row(r.config, str(r.tokens), f"{r.fused_bwd_cold_us:.1f}",
                  f"{r.fused_bwd_det_cold_us:.1f}", f"{100 * r.det_cost:+.1f}%")
    return t


def shape_json(r) -> dict:
    """One shape's record: every timing, the bytes moved, and the derived figures (cold
    headline, warm graph second)."""
    out = dataclasses.asdict(r)
    for direction in ("fwd", "bwd"):
        for which in ("cold", "graph"):
            out[f"{direction}_{which}_Bps"] = r.bw(direction, which)
            out[f"{direction}_{which}_roofline"] = r.roofline(direction, which)
    return out | {"bwd_det_cost": r.det_cost,
                  "fwd_vs_copy": r.vs_copy("fwd"), "bwd_vs_copy": r.vs_copy("bwd"),
                  "fwd_roofline": r.roofline("fwd"), "bwd_roofline": r.roofline("bwd"),
                  "fwd_speedup": r.fwd_speedup, "total_speedup": r.total_speedup}


def _small_rows(ratios, picked, copy_bw, iters, warmup, flush) -> list[dict]:
    """Bench every small-ratio shape (``--shape`` narrows them), print the table, return the
    JSON records."""
    import torch

    from csagate.perf import small_bench

    rows = []
    for ratio in ratios:
        shapes = [(ratio, *p) for p in picked] if picked else small_bench.SHAPES[ratio]
        for r, coff, d, tokens in shapes:
            with console.err().status(f"r{r} c{coff}d{d} {tokens} tokens"):
                rows.append(small_bench.bench_shape(r, coff, d, tokens, copy_bw=copy_bw,
                                                    iters=iters, warmup=warmup, flush=flush))
            torch.cuda.empty_cache()
    console.print_table(small_table(rows, copy_bw))
    return [shape_json(r) for r in rows]


def _where(r) -> str:
    return f"{r.direction} {r.config} {r.bucket} @{r.tokens}"


def _orders_table(title: str, rows, cols: tuple[str, ...], other, extra) -> Table:
    """base -> other (us per launch) in both orders: the A/B and the sweep tables.
    ``other(r)`` is ``(name, (us order 1, us order 2))``, ``extra(r)`` the last mark column."""
    t = console.new_table(title, cols, marks=(cols[-2],), right=(cols[-2],))
    for r in rows:
        name, us = other(r)
        t.add_row(_where(r), r.base, name, f"{r.base_us[0]:.2f} -> {us[0]:.2f}",
                  f"{r.base_us[1]:.2f} -> {us[1]:.2f}",
                  f"{100 * r.delta(0):+.1f}% / {100 * r.delta(1):+.1f}%", extra(r), r.decision)
    return t


def ab_table(rows) -> Table:
    return _orders_table(
        "A/B: base -> variant, cold us per launch (L2 flushed, events around one launch), "
        "interleaved, order 1 base first, order 2 variant first", rows,
        ("bucket", "base", "variant", "order 1 us", "order 2 us", "delta\n1 / 2", "noise",
         "decision"),
        lambda r: (r.variant, r.variant_us), lambda r: f"{100 * r.noise:.1f}%")


def sweep_table(rows) -> Table:
    return _orders_table(
        "schedule sweep per bucket: fastest candidate passing G2, then an interleaved A/B (both "
        "orders) against the shipped table entry; cold us/launch (L2 flushed)", rows,
        ("bucket", "table entry", "best", "order 1 us", "order 2 us", "delta\n1 / 2", "tried",
         "decision"),
        lambda r: (r.best, r.best_us),
        lambda r: f"{sum(1 for c in r.candidates if c.ok)}/{len(r.candidates)}")


def _sweep_json(rows) -> list[dict]:
    out = []
    for r in rows:
        out.append({
            "direction": r.direction, "config": r.config, "bucket": r.bucket, "tokens": r.tokens,
            "base": r.base, "best": r.best, "best_sched": dataclasses.asdict(r.best_sched),
            "base_us": r.base_us, "best_us": r.best_us, "decision": r.decision,
            "candidates": [{"tag": c.tag, "sched": dataclasses.asdict(c.sched), "us": c.us,
                            "ok": c.ok, "note": c.note} for c in r.candidates],
        })
    return out


def _host_report(err) -> dict:
    """Every host measurement (perf/host_cost.py), each in a process of its own."""
    from csagate.perf import host_cost

    # no spinner: its refresh thread would take the GIL from the timed loops
    try:
        return host_cost.measure_all(progress=lambda what: err.print(f"measuring {what} ..."))
    except RuntimeError as exc:
        console.abort(f"host measurement failed: {exc}", ExitCode.COULD_NOT_EVALUATE)


def _training_table(rows, process: str) -> Table:
    from csagate.perf.host_cost import VARIANTS

    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    cols = ("variant", *(c for s in shapes for c in (f"{s}\np50 us", "p10-p90")))
    t = console.new_table(f"forward + .backward() through autograd, host us per call ({process} "
                          "process; p10/p50/p90 of back-to-back calls)", cols, marks=cols[1:],
                          right=cols[1:])
    for variant in dict.fromkeys(r["variant"] for r in rows):
        cells = []
        for s in shapes:
            r = next((r for r in rows if (r["variant"], r["shape"]) == (variant, s)), None)
            cells += ([f"{r['p50']:.1f}", f"{r['p10']:.0f}-{r['p90']:.0f}"] if r
                      else ["-", "-"])
        t.add_row(VARIANTS.get(variant, variant), *cells)
    return t


def _cold_table(gpu: dict) -> Table:
    cols = ("process", "shape", "op us", "api us", "kernels\nus", "op /\nkernels")
    t = console.new_table("cold forward + backward (L2 flushed; events around one step): the "
                          "op through autograd, api.forward + api.backward, the kernels into "
                          "buffers", cols, marks=cols[2:], right=cols[2:])
    for process, g in gpu.items():
        for c in g["cold"]:
            t.add_row(process, c["shape"], f"{c['op_us']:.1f}", f"{c['api_us']:.1f}",
                      f"{c['kernels_us']:.1f}", f"{c['op_over_kernels']:.2f}")
    return t


def _spread_table(gpu: dict) -> Table:
    cols = ("process", "backward", "p10 us", "p50 us", "p90 us", "p90 /\np10", "host\np50 us")
    t = console.new_table("backward spread (events around the call, GPU idle before it)", cols,
                          marks=cols[2:], right=cols[2:])
    for process, g in gpu.items():
        sp = g["spread"]
        for name in ("op_backward", "api_backward"):
            e = sp[name]["event_us"]
            t.add_row(process, f"{name.replace('_', ' ')} {sp['shape']}", f"{e['p10']:.1f}",
                      f"{e['p50']:.1f}", f"{e['p90']:.1f}", f"{sp[name]['event_spread']:.2f}",
                      f"{sp[name]['host_us']['p50']:.1f}")
    return t


def host_tables(host: dict) -> list[Table]:
    """The training tables (one per process), the cold comparison, the backward spread, the
    per-call paths without autograd, and the targets."""
    tables = [_training_table([r for r in host["host"] if r["process"] == p], p)
              for p in dict.fromkeys(r["process"] for r in host["host"])]
    tables += [_cold_table(host["gpu"]), _spread_table(host["gpu"])]
    calls = console.new_table("one call, no autograd (CPU wall, 1000 back-to-back calls, "
                              "median of 5; r128 c1d128, 1024 tokens)",
                              ("path", "us/call", "sync tail us"),
                              marks=("us/call", "sync tail us"),
                              right=("us/call", "sync tail us"))
    for r in host["calls"] or ():
        calls.add_row(r["path"], f"{r['us']:.1f}", f"{r['sync_tail_us']:.1f}")
    goals = console.new_table("targets", ("figure", "value", "limit", "met"),
                              marks=("value", "limit", "met"), right=("value", "limit"))
    for g in host["targets"]:
        goals.add_row(g["what"], f"{g['value']:.2f}",
                      "-" if g["limit"] is None else f"{g['limit']:.2f}",
                      {True: "yes", False: "NO", None: "-"}[g["ok"]])
    return [*tables, calls, goals]


PEERS = ("cudnn",)  # --peer: the released implementations timed beside ours


def peer_table(rows, peer_text: str) -> Table:
    """Ours against the peer per shape: cold us (the mean of both orders) and peer / ours."""
    cols = ("ratio config", "tokens", "fwd\nours", "fwd\ncuDNN", "fwd\nx", "bwd\nours",
            "bwd\ncuDNN", "bwd\nx", "same\nbits")
    t = console.new_table(f"vs cuDNN ({peer_text}): cold us (L2 flushed, events around one "
                          "launch behind a GPU sleep that hides either side's host work; "
                          "interleaved, the mean of both orders); x = cuDNN us / ours; same "
                          "bits: dKV and dScore bitwise equal", cols, marks=cols[2:],
                          right=(cols[1], *cols[2:8]))
    for r in rows:
        t.add_row(r.config, str(r.tokens), f"{r.us('ours', 'fwd'):.1f}",
                  f"{r.us('peer', 'fwd'):.1f}", f"{r.speedup('fwd'):.2f}",
                  f"{r.us('ours', 'bwd'):.1f}", f"{r.us('peer', 'bwd'):.1f}",
                  f"{r.speedup('bwd'):.2f}", "yes" if r.bits_equal else "no")
    return t


def peer_json(r) -> dict:
    """One peer row: the per-order times, the bytes, the comparison, and the derived figures."""
    out = dataclasses.asdict(r) | {"bits_equal": r.bits_equal}
    for d in ("fwd", "bwd"):
        out |= {f"ours_{d}_mean_us": r.us("ours", d), f"peer_{d}_mean_us": r.us("peer", d),
                f"{d}_speedup": r.speedup(d), f"ours_{d}_roofline": r.roofline("ours", d),
                f"peer_{d}_roofline": r.roofline("peer", d)}
    return out


def _peer_ratios(ratio: str, small: list[int]) -> list[int]:
    """The ratios the peer runs: those benched that it supports (a usage error when the one
    asked for is not among them)."""
    from csagate.gates.builtin_impls import Cudnn

    supported = Cudnn.supports.ratios
    benched = [*small, TABLE_RATIO] if ratio in (TABLE, "all") else small
    picked = [r for r in benched if r in supported]
    if not picked:
        raise click.UsageError(f"--peer supports --ratio {'|'.join(map(str, supported))}|all, "
                               f"got --ratio {ratio}")
    return picked


def _available_peer(name: str):
    """The peer implementation, or exit 3 with its one-line refusal (before any timing)."""
    import torch

    from csagate.gates.builtin_impls import CUDNN_MEASURE_ENV, Cudnn

    peer = Cudnn()
    why = peer.unavailable(torch.device("cuda"))
    if why:
        cc = peer.supports.min_compute_capability[0]
        console.abort(f"--peer {name} cannot run: {why} (below compute capability {cc}, "
                      f"{CUDNN_MEASURE_ENV}=<major> lowers its check, measurement only)",
                      ExitCode.COULD_NOT_EVALUATE)
    return peer


def _peer_rows(peer, ratios, picked, copy_bw, iters, warmup, flush) -> list[dict]:
    """Ours against the peer on every shape of ``ratios`` (``--shape`` narrows them), print
    the table, return the JSON records."""
    import torch

    from csagate.perf import bench, small_bench
    from csagate.perf.peer import compare_shape

    rows = []
    for ratio in ratios:
        shapes = (bench.SHAPES if has_tables(ratio)
                  else [(c, d, t) for _, c, d, t in small_bench.SHAPES[ratio]])
        for coff, d, tokens in picked or shapes:
            with console.err().status(f"vs {peer.name}: r{ratio} c{coff}d{d} {tokens} tokens"):
                rows.append(compare_shape(peer, ratio, coff, d, tokens, copy_bw=copy_bw,
                                          iters=iters, warmup=warmup, flush=flush))
            torch.cuda.empty_cache()
    console.print_table(peer_table(rows, f"{peer.label}, nvidia-cudnn-frontend "
                                         f"{peer.version()}"))
    return [peer_json(r) for r in rows]


def _parse_shapes(shapes, ratio: str) -> list[tuple[int, int, int]]:
    """``--shape cCdD:TOKENS`` values as (coff, d, tokens); a usage error when malformed."""
    picked = []
    least = TABLE_RATIO if ratio == TABLE else max(SMALL_RATIOS)  # tokens: a block at least
    for spec in shapes:
        try:
            coff, d, tokens = parse_shape(spec)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--shape") from None
        picked.append((coff, d, tokens))
        if (coff, d) not in S.CONFIGS or tokens < least:
            raise click.BadParameter(f"{spec!r}: config must be one of "
                                     f"{[S.config_name(*c) for c in S.CONFIGS]}, tokens >= 128",
                                     param_hint="--shape")
    return picked


@click.command("bench", help="Benchmark the fused kernels: time, speedup over eager, % of the "
                             "measured copy bandwidth; --ab FIELD for measured schedule choices.",
               epilog=ExitCode.listing(pass_="measured", usage="usage error",
                                       could_not_evaluate="could not measure (no GPU, no DSL)"))
@options.ratio_option(TABLE, "The family: 128 (its shape table, A/B and sweep), a small ratio "
                            "(every config at 8192 and 131072 tokens), or all.")
@click.option("--ab", "ab_fields", multiple=True,
              type=click.Choice(sorted({*S.option_names("fwd"), *S.option_names("bwd"),
                                        "regwin"})),
              help="A/B a schedule field per bucket (repeatable) instead of the shape table.")
@click.option("--sweep", "sweep_dirs", type=click.Choice(["fwd", "bwd", "all"]), default=None,
              help="Search each bucket's schedule space and A/B the winner against the table.")
@click.option("--host", "host", is_flag=True,
              help="Host time instead: forward + backward through autograd per variant (the "
                   "op, a plain autograd.Function, a do-nothing op, the api), p10/p50/p90, in "
                   "a fresh process and one that ran torch.compile; the cold 131072-token "
                   "op-vs-kernels comparison; the op backward's spread.")
@click.option("--shape", "shapes", multiple=True, metavar="cCdD:TOKENS",
              help="Only these shapes, e.g. c1d128:8192 (repeatable).")
@click.option("--iters", default=100, show_default=True, type=click.IntRange(1),
              help="Timed launches per figure (cold figures use at least 60).")
@click.option("--warmup", default=30, show_default=True, type=click.IntRange(0),
              help="Untimed launches before each timed series.")
@click.option("--peer", "peer_name", type=click.Choice(PEERS), default=None,
              help="Also time a released implementation's kernels against ours on the same "
                   "inputs, cold, in both orders (cudnn: nvidia-cudnn-frontend; ratios 2, 4, "
                   "128).")
@options.json_option("Also write every number to this JSON file (checked before anything "
                     "runs; '-' is not taken).", callback=checked_file)
def command(ratio, ab_fields, sweep_dirs, host, shapes, iters, warmup, peer_name,
            json_path) -> None:
    from csagate.perf import bench

    small = [] if ratio == TABLE else (list(SMALL_RATIOS) if ratio == "all" else [int(ratio)])
    if small and (ab_fields or sweep_dirs or host):
        if ratio != "all":
            raise click.UsageError("--ab, --sweep and --host are ratio=128 options")
        small = []
    picked = _parse_shapes(shapes, ratio)
    if peer_name and (ab_fields or sweep_dirs or host):
        raise click.UsageError("--peer times the shape tables; it does not go with --ab, "
                               "--sweep or --host")
    peer_ratios = _peer_ratios(ratio, small) if peer_name else []
    _need_gpu()
    peer = _available_peer(peer_name) if peer_name else None
    import torch

    err = console.err()
    report = {"gpu": torch.cuda.get_device_name(), "cc": list(torch.cuda.get_device_capability()),
              "iters": iters, "warmup": warmup}
    if host:
        report["host"] = _host_report(err)
        for table in host_tables(report["host"]):
            console.print_table(table)
        if json_path:
            from pathlib import Path

            Path(json_path).write_text(json.dumps(report, indent=2) + "\n")
        return
    with err.status("measuring the copy bandwidth"):
        copy_bw = bench.copy_bandwidth()
    flush = bench.L2Flush()
    report["copy_bw_Bps"] = copy_bw
    report["method"] = bench.method(flush.l2_bytes, flush.nbytes, iters=iters, warmup=warmup)
    if sweep_dirs:
        dirs = ("fwd", "bwd") if sweep_dirs == "all" else (sweep_dirs,)
        with err.status("sweeping") as status:
            rows = bench.sweep(dirs, iters=iters, warmup=min(warmup, 10), flush=flush,
                               progress=lambda what: status.update(f"sweep {what}"))
        console.print_table(sweep_table(rows))
        report["sweep"] = _sweep_json(rows)
    elif ab_fields:
        rows = []
        for name in ab_fields:
            with err.status(f"A/B {name}"):
                rows += bench.ab_field(name, iters=iters, warmup=warmup, flush=flush)
        console.print_table(ab_table(rows))
        report["ab"] = [dataclasses.asdict(r) | {"decision": r.decision} for r in rows]
    elif ratio not in (TABLE, "all"):
        report["small"] = _small_rows(small, picked, copy_bw, iters, warmup, flush)
    else:
        if small:
            report["small"] = _small_rows(small, picked, copy_bw, iters, warmup, flush)
        rows = []
        for coff, d, tokens in picked or bench.SHAPES:
            with err.status(f"c{coff}d{d} {tokens} tokens"):
                rows.append(bench.bench_shape(coff, d, tokens, copy_bw=copy_bw, iters=iters,
                                              warmup=warmup, flush=flush))
            torch.cuda.empty_cache()
        for table in (*shape_tables(rows, copy_bw), det_table(rows)):
            console.print_table(table)
        report["shapes"] = [shape_json(r) for r in rows]
    if peer is not None:
        report["peer"] = _peer_rows(peer, peer_ratios, picked, copy_bw, iters, warmup, flush)
    if json_path:
        with open(json_path, "w") as fh:
            json.dump(report, fh, indent=1)
