"""Timing the small-ratio kernels (ratio 2, 4, ..., 32; GPU only), by perf/bench.py's method.

The headline is COLD (``bench.cold_median``: L2 flushed before each launch, events around one
launch); the same-size reference is a cold copy of the op's bytes (``bench.cold_copy_us``);
the warm figure is a CUDA-graph replay of back-to-back launches as the api makes them (the
backward's launch zeroes dAPE first). The rows are ``bench.ShapeRow`` records without the eager
columns (the fp32 eager path of a ratio-2 pack is not a peer worth timing). Nothing here
prints.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import dataclass

import torch
from csagate.kernels import schedule as S
from csagate.kernels import small_schedule as SS
from csagate.kernels.registry import SMALL_RATIOS
from csagate.perf import bench

CONFIGS = S.CONFIGS  # c1d128, c2d128, c1d512, c2d512
TOKENS = (8192, 131072)
# (ratio, coff, d, tokens in one segment): every config the ratio serves at a short and a long
# pack.
SHAPES: dict[int, tuple[tuple[int, int, int, int], ...]] = {
    ratio: tuple((ratio, coff, d, t) for coff, d in CONFIGS
                 if not SS.config_problems(ratio, coff, d) for t in TOKENS)
    for ratio in SMALL_RATIOS}


def bench_shape(ratio: int, coff: int, d: int, tokens: int, *, copy_bw: float,
                iters: int = 100, warmup: int = 30, seed: int = 1234,
                flush: bench.L2Flush | None = None) -> bench.ShapeRow:
    """One small-ratio shape: forward and backward cold and in graph replay, the deterministic
    backward cold, and cold copies of the same bytes."""
    from csagate.kernels import api

    flush = flush or bench.L2Flush()
    pack, go, out, dkv, dscore, dape = bench.shape_buffers(ratio, coff, d, tokens, seed)
    n = pack.n_rows
    args = pack.inputs()
    kw = {"ratio": ratio, "coff": coff}

    def fwd():
        api.run_forward(*args, out, **kw)

    def bwd_only():  # dAPE zeroed outside the timed region (``before``)
        api.run_backward(*args, go, dkv, dscore, dape, **kw)

    def bwd():  # what api.backward and the op launch: dAPE zeroed inside the launch
        api.run_backward(*args, go, dkv, dscore, dape, zero_dape=True, **kw)

    def bwd_det():
        api.run_backward(*args, go, dkv, dscore, dape, deterministic=True, **kw)

    fkey = api.run_forward(*args, out, **kw)
    bkey = api.run_backward(*args, go, dkv, dscore, dape.zero_(), **kw)
    bwd_det()
    row = bench.ShapeRow(f"r{ratio} {S.config_name(coff, d)}", tokens, n, fkey.tag, bkey.tag,
                         fwd_bytes=bench.op_bytes("fwd", coff=coff, d=d, n_tokens=tokens,
                                                  n_rows=n, ratio=ratio),
                         bwd_bytes=bench.op_bytes("bwd", coff=coff, d=d, n_tokens=tokens,
                                                  n_rows=n, ratio=ratio),
                         copy_bw=copy_bw)
    cold = {"iters": iters, "warmup": warmup}
    row.fused_fwd_cold_us = bench.cold_median(fwd, flush, **cold).median_us
    row.fused_fwd_graph_us = bench.graph_median(fwd, **cold).median_us
    row.fused_bwd_cold_us = bench.cold_median(bwd_only, flush, before=dape.zero_,
                                              **cold).median_us
    row.fused_bwd_det_cold_us = bench.cold_median(bwd_det, flush, before=dape.zero_,
                                                  hide_host_us=bench.DET_SLEEP_US,
                                                  **cold).median_us
    row.fused_bwd_graph_us = bench.graph_median(bwd, **cold).median_us
    row.copy_fwd_cold_us = bench.cold_copy_us(row.fwd_bytes, flush, **cold)
    row.copy_bwd_cold_us = bench.cold_copy_us(row.bwd_bytes, flush, **cold)
    row.extra["ratio"] = ratio
    return row


# --- the table's form against the other forms of a direction, cold -----------------------

AB_RATIOS = (2, 4)


def ab_shapes(ratios=AB_RATIOS, tokens=None) -> tuple[tuple[int, int, int, int], ...]:
    """(ratio, coff, d, tokens in one segment): every config the ratio serves, long (131072
    tokens; 65536 at d=512) and short (8192), or at each of ``tokens``."""
    return tuple((ratio, coff, d, t) for ratio in ratios for coff, d in CONFIGS
                 if not SS.config_problems(ratio, coff, d)
                 for t in (tokens or (131072 if d == 128 else 65536, 8192)))


AB_SHAPES = ab_shapes()


@dataclass(frozen=True)
class FormABRow:
    """One shape and direction: the table's form first, then each other form, every one
    timed cold in both orders (``bench.interleaved``) after its outputs were checked bitwise
    against the table form's (a form whose bits differ is not timed: its times are 0)."""

    direction: str
    config: str
    tokens: int
    nbytes: int
    copy_bw: float
    tags: tuple[str, ...]
    us: tuple[tuple[float, float], ...]  # per form: (order 1, order 2)
    bits_equal: tuple[bool, ...]

    def mean_us(self, i: int) -> float:
        return sum(self.us[i]) / 2

    @property
    def noise(self) -> float:
        """The table form's relative spread across the two orders."""
        a, b = self.us[0]
        return abs(a - b) / min(a, b) if min(a, b) > 0 else 0.0

    def wins(self, i: int) -> bool:
        """Form i beats the table's in both orders by more than the noise and the floor."""
        floor = max(self.noise, bench.AB_FLOOR)
        return self.bits_equal[i] and all(
            (self.us[0][o] - self.us[i][o]) / self.us[0][o] > floor for o in (0, 1))

    @property
    def fastest(self) -> str:
        timed = [i for i in range(len(self.tags)) if self.bits_equal[i]]
        best = min(timed, key=self.mean_us)
        return self.tags[best] if best == 0 or self.wins(best) else f"{self.tags[0]} (tie)"

    def line(self) -> str:
        cells = []
        for i, tag in enumerate(self.tags):
            if not self.bits_equal[i]:
                cells.append(f"{tag} BITS DIFFER")
                continue
            us = self.mean_us(i)
            pct = bench.percent_of(bench.bandwidth(self.nbytes, us), self.copy_bw)
            cells.append(f"{tag} {us:6.1f} ({self.us[i][0]:.1f}/{self.us[i][1]:.1f}) {pct:4.0%}")
        return (f"{self.direction} {self.config:>9} {self.tokens:>6}: " + " | ".join(cells)
                + f" | noise {self.noise:.1%} | fastest {self.fastest}")


def launcher(direction: str, pack, grad_out, sched, rows: int | None = None):
    """A zero-argument launcher of one small-ratio schedule on ``pack``, bypassing the table
    (the backward in the default mode, dAPE accumulated, ``rows`` per CTA); its outputs are
    ``.buffers``."""
    from csagate.kernels import registry, small
    from csagate.kernels._dsl import device_arch
    from csagate.kernels.cache import CACHE

    key = registry.make_key(direction, pack.ratio, pack.coff, pack.d, sched, device_arch())
    fn = CACHE.executor(key, torch.cuda.current_device())
    kv, score, ape, cu, cuc = pack.inputs()
    io = dict(kv=kv, score=score, ape=ape, cu=cu, cuc=cuc)
    if direction == "fwd":
        out = torch.empty(pack.n_rows, pack.d, dtype=torch.bfloat16, device=kv.device)

        def launch(zero_dape: bool = False) -> None:
            small.launch_fwd(fn, **io, out=out)
        launch.buffers = (out,)
        return launch
    dkv, dscore, dape = torch.empty_like(kv), torch.empty_like(score), torch.zeros_like(ape)
    io.update(grad_out=grad_out, dkv=dkv, dscore=dscore, dape=dape, rows_per_cta=rows)

    def launch(zero_dape: bool = False) -> None:
        small.launch_bwd(fn, **io, zero_dape=zero_dape)
    launch.buffers = (dkv, dscore, dape)
    return launch


def _same_bits(a, b) -> bool:
    """The bf16 outputs (out; dKV and dScore) bitwise equal; dAPE within the fp32 atomics'
    order noise."""
    if not all(torch.equal(x.view(torch.int16), y.view(torch.int16))
               for x, y in zip(a[:2], b[:2], strict=False)):
        return False
    if len(a) < 3:
        return True
    tol = 1e-5 * max(1.0, b[2].abs().max().item())
    return (a[2] - b[2]).abs().max().item() <= tol


AB_BWD_ROWS = (2, 4, 8, 16, 32)  # the fixed rows per lane each backward form is timed at


def forms_of(direction: str, ratio: int, coff: int, d: int, n_rows: int = 1,
             arch: str | None = None, sm_count: int = 0, ctas_per_sm: int = 0) -> dict:
    """tag -> (schedule, rows per CTA or None): the table's first (the backward: at the rows
    ``bwd_rows_per_cta`` picks for ``n_rows`` on ``sm_count`` SMs at ``ctas_per_sm``), the
    table's with an IEEE division per element (``ieee_div``) second, then every other forward
    form, or the table's at the rule's aim (where the waves moved it) and every backward form
    (the table's included) at each other fixed rows per lane."""
    table = SS.small_schedule(direction, d, ratio=ratio, coff=coff, arch=arch)
    ieee = dataclasses.replace(table, ieee_div=True)  # the table's form, one division each
    if direction == "fwd":
        forms = (table, ieee, *SS.fwd_forms(ratio, coff, d, arch))
        return {s.tag: (s, None) for s in forms}
    rule = SS.bwd_rows_per_cta(n_rows, d, coff, table, sm_count, ctas_per_sm)
    aim = SS.bwd_rows_per_cta(n_rows, d, coff, table)
    out = {f"{table.tag} rule {rule}": (table, rule), f"{ieee.tag} rule {rule}": (ieee, rule)}
    if aim != rule:
        out[f"{table.tag} aim {aim}"] = (table, aim)
    for sched in (table, *SS.bwd_forms(ratio, coff, d, arch)):
        picks = {r * sched.lanes for r in AB_BWD_ROWS} | {
            SS.bwd_rows_per_cta(n_rows, d, coff, sched)}
        label = (f"v{sched.vec}l{sched.lanes}" + ("p" if sched.prefetch else "")
                 + (f"s{sched.stages}" if sched.stages else ""))
        out.update({f"{label} {r}": (sched, r) for r in sorted(picks)
                    if r <= sched.rows_per_cta and (sched, r) not in out.values()})
    return out


def stage_twins(ratio: int, coff: int, d: int, table, rule: int) -> dict:
    """tag -> (schedule, rows per CTA): the table's backward as each staged form it can build
    (``SS.BWD_STAGES``, as ``SS.bwd_form`` makes them at the table's most rows), at the rule's
    rows per CTA and at twice them (a deeper pipeline per lane), at most the schedule's."""
    out = {}
    for stages in SS.BWD_STAGES:
        twin = dataclasses.replace(SS.bwd_form(table.vec, d, ratio * coff, stages=stages),
                                   rows_per_cta=table.rows_per_cta)
        if SS.bwd_schedule_problems(ratio, coff, d, twin):
            continue
        for rows in sorted({rule, min(2 * rule, twin.rows_per_cta)}):
            out[f"{twin.tag} {rows}"] = (twin, rows)
    return out


def resident_ctas(direction: str, ratio: int, coff: int, d: int, sched) -> tuple[int, int]:
    """(SMs, resident CTAs per SM) of ``sched``'s kernel on the current GPU (loaded here)."""
    from csagate.kernels import registry
    from csagate.kernels._dsl import device_arch, sm_count
    from csagate.kernels.cache import CACHE

    dev = torch.cuda.current_device()
    key = registry.make_key(direction, ratio, coff, d, sched, device_arch())
    CACHE.executor(key, dev)
    return sm_count(dev), CACHE.resident_ctas(key, dev)


def ab_shape(direction: str, ratio: int, coff: int, d: int, tokens: int, *, copy_bw: float,
             flush: bench.L2Flush, iters: int = 60, warmup: int = 10,
             seed: int = 1234, division: bool = False, staged: bool = False) -> FormABRow:
    """One shape of ``ab_forms``: bits first, then the cold interleaved timing; ``division``:
    the table's form and its IEEE-division twin only; ``staged`` (backward): the table's form
    against its staged twins (``stage_twins``)."""
    from csagate.reference import make_grad_out, make_pack

    pack = make_pack((tokens,), ratio=ratio, coff=coff, d=d, seed=seed, device="cuda")
    go = make_grad_out(pack.n_rows, d, device="cuda")
    from csagate.kernels._dsl import device_arch

    arch = device_arch()
    table = SS.small_schedule(direction, d, ratio=ratio, coff=coff, arch=arch)
    occupancy = resident_ctas(direction, ratio, coff, d, table) if direction == "bwd" else ()
    forms = forms_of(direction, ratio, coff, d, pack.n_rows, arch, *occupancy)
    if division:
        forms = dict(list(forms.items())[:2])
    if staged and direction == "bwd":
        first = next(iter(forms.items()))
        forms = dict([first]) | stage_twins(ratio, coff, d, table, first[1][1])
    launchers = [launcher(direction, pack, go, *form) for form in forms.values()]
    for launch in launchers:
        launch(zero_dape=True)
    torch.cuda.synchronize()
    equal = tuple(_same_bits(x.buffers, launchers[0].buffers) for x in launchers)
    timed = [x for x, ok in zip(launchers, equal, strict=True) if ok]
    times = iter(bench.interleaved(timed, iters=iters, warmup=warmup, flush=flush))
    us = tuple(next(times) if ok else (0.0, 0.0) for ok in equal)
    nbytes = bench.op_bytes(direction, coff=coff, d=d, n_tokens=tokens, n_rows=pack.n_rows,
                            ratio=ratio)
    return FormABRow(direction, f"r{ratio} {S.config_name(coff, d)}", tokens, nbytes, copy_bw,
                     tuple(forms), us, equal)


def ab_forms(directions=("fwd", "bwd"), shapes=AB_SHAPES, *, iters: int = 60,
             warmup: int = 10, progress=None, division: bool = False,
             staged: bool = False) -> list[FormABRow]:
    """The table's form against every other form of each direction on every shape, cold."""
    flush = bench.L2Flush()
    copy_bw = bench.copy_bandwidth()
    rows = []
    for shape in shapes:
        for direction in directions:
            rows.append(ab_shape(direction, *shape, copy_bw=copy_bw, flush=flush, iters=iters,
                                 warmup=warmup, division=division, staged=staged))
            if progress:
                progress(rows[-1])
        torch.cuda.empty_cache()
    return rows


# --- the backward's rows per CTA: the rule against every count, cold ----------------------

@dataclass(frozen=True)
class RowsSweepRow:
    """One shape: the table's backward at every rows per CTA of ``rows``, cold, both orders."""

    config: str
    tokens: int
    wave: int                 # CTAs of one wave as the rule counts them (0: unknown)
    slices: int
    n_rows: int
    aim: int                  # the rule without the waves
    rule: int                 # the rule's pick
    rows: tuple[int, ...]
    us: tuple[tuple[float, float], ...]

    def mean_us(self, rows: int) -> float:
        return sum(self.us[self.rows.index(rows)]) / 2

    @property
    def best(self) -> int:
        return min(self.rows, key=self.mean_us)

    def line(self) -> str:
        def cell(r):
            ctas = -(-self.n_rows // r) * self.slices
            return f"{r}:{ctas} {self.mean_us(r):.1f}"
        return (f"{self.config:>9} {self.tokens:>6} wave {self.wave}: aim {self.aim} "
                f"{self.mean_us(self.aim):.1f} | rule {self.rule} {self.mean_us(self.rule):.1f} "
                f"({self.mean_us(self.rule) / self.mean_us(self.aim) - 1:+.1%}) | best "
                f"{self.best} {self.mean_us(self.best):.1f} | "
                + " ".join(cell(r) for r in self.rows))


def sweep_rows_shape(ratio: int, coff: int, d: int, tokens: int, *, flush: bench.L2Flush,
                     iters: int = 20, seed: int = 1234) -> RowsSweepRow:
    """The table's backward at every rows per CTA from a third of the aim to 32 or the
    schedule's most (every second count above 32; the kernel is the same code at any count),
    the rule's pick and the aim among them."""
    from csagate.kernels._dsl import device_arch
    from csagate.reference import make_grad_out, make_pack

    pack = make_pack((tokens,), ratio=ratio, coff=coff, d=d, seed=seed, device="cuda")
    go = make_grad_out(pack.n_rows, d, device="cuda")
    table = SS.small_schedule("bwd", d, ratio=ratio, coff=coff, arch=device_arch())
    sms, per_sm = resident_ctas("bwd", ratio, coff, d, table)
    aim = SS.bwd_rows_per_cta(pack.n_rows, d, coff, table)
    rule = SS.bwd_rows_per_cta(pack.n_rows, d, coff, table, sms, per_sm)
    lo, hi = max(table.lanes, aim // 3), max(table.rows_per_cta, 32)
    rows = tuple(sorted({aim, rule, *range(lo, 33), *range(34, hi + 1, 2)}))
    launchers = [launcher("bwd", pack, go, table, r) for r in rows]
    for launch in launchers:
        launch(zero_dape=True)
    torch.cuda.synchronize()
    us = bench.interleaved(launchers, iters=iters, warmup=3, flush=flush)
    return RowsSweepRow(f"r{ratio} {S.config_name(coff, d)}", tokens,
                        int(SS.BWD_WAVE_FILL * sms * per_sm),
                        SS.bwd_slices(d, table), pack.n_rows, aim, rule, rows, us)


# --- the deterministic dAPE reduction: the split form against the one-pass form, cold -------

# The GPU sleep before each full-path launch of ab_reduce, a wide margin over its host time (at
# 200 µs, readings of 4x the default appeared: docs/PERF_NOTES.md section 10.5).
FULL_PATH_SLEEP_US = 1000

@dataclass
class ReduceABRow:
    config: str
    tokens: int
    n_parts: int              # the backward's CTAs along the rows: the partial slices
    groups: int               # the split form's first-pass groups (reduce.groups)
    default_us: tuple[float, float]  # the default-mode backward, order 1 / order 2
    one_pass_us: tuple[float, float]
    split_us: tuple[float, float]
    dape_gap: float           # max |split - one pass| over dAPE (two fixed orders)

    def line(self) -> str:
        def mean(x):
            return sum(x) / 2
        base = mean(self.default_us)
        cells = [f"{name} {mean(us):6.1f} ({us[0]:.1f}/{us[1]:.1f}) {mean(us) / base - 1:+.1%}"
                 for name, us in (("one pass", self.one_pass_us), ("split", self.split_us))]
        return (f"{self.config:>9} {self.tokens:>6} gx {self.n_parts:>5} groups "
                f"{self.groups:>3}: default {base:6.1f} | " + " | ".join(cells)
                + f" | dAPE gap {self.dape_gap:.2g}")


def ab_reduce_shape(ratio: int, coff: int, d: int, tokens: int, *, flush: bench.L2Flush,
                    iters: int = 30, warmup: int = 5, seed: int = 1234) -> ReduceABRow:
    """One shape of ``ab_reduce``: the deterministic backward (the api's launch, the rule's rows
    per CTA) with the split reduction against the one-pass form (``reduce.groups`` forced to
    0), and the default backward, cold, interleaved in both orders; the full launch path each
    call, its host work (validation, dispatch, the patch: hundreds of µs) hidden under a GPU
    sleep of ``FULL_PATH_SLEEP_US``."""
    from unittest import mock

    from csagate.kernels import api
    from csagate.kernels import reduce as RD
    from csagate.kernels.launch import bwd_ctas

    pack, go, _, dkv, dscore, dape = bench.shape_buffers(ratio, coff, d, tokens, seed)
    args, kw = pack.inputs(), {"ratio": ratio, "coff": coff}
    key = api.run_backward(*args, go, dkv, dscore, dape.zero_(), **kw)
    gx, rpc = bwd_ctas(key, pack.n_rows, None, torch.cuda.current_device())
    kw["rows_per_cta"] = rpc  # the full path on every call, as both forms need

    def default():
        api.run_backward(*args, go, dkv, dscore, dape, **kw)

    def split():
        api.run_backward(*args, go, dkv, dscore, dape, deterministic=True, **kw)

    def one_pass():
        with mock.patch.object(RD, "groups", lambda n_parts, n: 0):
            split()
    outs = []
    for fn in (one_pass, split):
        dape.zero_()
        fn()
        outs.append(dape.clone())
    gap = (outs[0].double() - outs[1].double()).abs().max().item()
    us = bench.interleaved([default, one_pass, split], iters=iters, warmup=warmup, flush=flush,
                           before=dape.zero_, hide_host_us=FULL_PATH_SLEEP_US)
    return ReduceABRow(f"r{ratio} {S.config_name(coff, d)}", tokens, gx,
                       RD.groups(gx, dape.numel()), *us, gap)


def ab_reduce(shapes, *, iters: int = 30, progress=None) -> list[ReduceABRow]:
    """``ab_reduce_shape`` on every shape."""
    flush = bench.L2Flush()
    rows = []
    for shape in shapes:
        rows.append(ab_reduce_shape(*shape, flush=flush, iters=iters))
        if progress:
            progress(rows[-1])
        torch.cuda.empty_cache()
    return rows


DET_PARTS = ("default", "deterministic", "det. backward", "reduction", "det. graph",
             "default graph")


def det_parts_shape(ratio: int, coff: int, d: int, tokens: int, *, flush: bench.L2Flush,
                    iters: int = 20, seed: int = 1234) -> list[tuple[float, tuple]]:
    """Where the deterministic backward's time goes on one shape, cold, in one process: the
    default and the deterministic api launch (fast path), the deterministic backward kernel and
    its dAPE reduction each alone, and both modes as one-launch CUDA graphs (no host work);
    each without and behind the bench's GPU sleep (``bench.DET_SLEEP_US``; a leak of host time
    into the timed region shows as a difference). Returns [(sleep us, (order 1, order 2) per
    part of DET_PARTS)]."""
    from csagate.kernels import api
    from csagate.kernels.launch import FAST

    pack, go, _, dkv, dscore, dape = bench.shape_buffers(ratio, coff, d, tokens, seed)
    args, kw = pack.inputs(), {"ratio": ratio, "coff": coff}

    def default():
        api.run_backward(*args, go, dkv, dscore, dape, **kw)

    def det():
        api.run_backward(*args, go, dkv, dscore, dape, deterministic=True, **kw)
    for fn in (default, det, default, det):  # the second call of each takes the fast path
        fn()
    e = FAST[("bwd", True, ratio, coff, pack.kv.shape[1], pack.kv.get_device(), pack.n_rows)]
    reduce, n_parts, n_groups = e.reduce
    tail = e.launch_tail(args[3])
    partials = torch.empty_like(e.template)

    def kernel():
        e.call(*args, go, dkv, dscore, partials[0], *tail, 0)

    def reduction():
        reduce(partials.view(-1), dape.view(-1), n_parts, n_groups, 0)
    graphs = [bench._graph(fn, 1) for fn in (det, default)]
    fns = [default, det, kernel, reduction, graphs[0].replay, graphs[1].replay]
    return [(hide, bench.interleaved(fns, iters=iters, warmup=5, flush=flush, before=dape.zero_,
                                     hide_host_us=hide)) for hide in (0.0, bench.DET_SLEEP_US)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m csagate.perf.small_bench")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--ab-forms", choices=("fwd", "bwd", "all"),
                      help="the table's form against the other forward forms (vec, rows) "
                      "and the backward's rows-per-CTA rule against fixed rows, cold")
    what.add_argument("--sweep-rows", action="store_true",
                      help="the table's backward at every rows per CTA around the rule's "
                      "aim, cold: the rule's pick against the best")
    what.add_argument("--det-parts", action="store_true",
                      help="where the deterministic backward's time goes: each launch, its "
                      "kernel and reduction alone, graph replays, cold")
    what.add_argument("--ab-reduce", action="store_true",
                      help="the deterministic backward's split dAPE reduction against the "
                      "one-pass form, cold")
    parser.add_argument("--ratio", type=int, action="append", choices=SMALL_RATIOS,
                        help=f"a ratio to time (repeat it; default {AB_RATIOS})")
    parser.add_argument("--tokens", type=int, action="append",
                        help="--ab-forms: a pack length to time (repeat it; default 131072 "
                        "at d=128, 65536 at d=512, and 8192)")
    parser.add_argument("--d", type=int, choices=(128, 512),
                        help="--ab-forms: only the configs of this head dim")
    parser.add_argument("--division", action="store_true",
                        help="--ab-forms: only the table's form against the same form with an "
                        "IEEE division per element (no shared reciprocal)")
    parser.add_argument("--stages", action="store_true",
                        help="--ab-forms bwd: only the table's form against its staged twins "
                        "(rows copied into shared memory by cp.async)")
    parser.add_argument("--iters", type=int, default=60)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("small_bench: needs a CUDA GPU", file=sys.stderr)
        return 3
    shapes = tuple(x for x in ab_shapes(tuple(args.ratio or AB_RATIOS), args.tokens)
                   if args.d in (None, x[2]))
    if args.sweep_rows:
        print("shape tokens: backward us at rows per CTA (rows:CTAs us), cold")
        flush = bench.L2Flush()
        for ratio, coff, d, tokens in shapes:
            if SS.small_schedule("bwd", d, ratio=ratio, coff=coff).rows_per_cta > 1:
                print(sweep_rows_shape(ratio, coff, d, tokens, flush=flush,
                                       iters=args.iters).line(), flush=True)
                torch.cuda.empty_cache()
        return 0
    if args.det_parts:
        print("shape tokens, GPU sleep before the launch: us (order 1/order 2) per part, cold")
        flush = bench.L2Flush()
        for shape in (s for r in args.ratio or AB_RATIOS for s in SHAPES[r]
                      if args.d in (None, s[2])):
            for hide, us in det_parts_shape(*shape, flush=flush, iters=args.iters):
                cells = " | ".join(f"{name} {sum(u) / 2:.1f} ({u[0]:.1f}/{u[1]:.1f})"
                                   for name, u in zip(DET_PARTS, us, strict=True))
                print(f"r{shape[0]} {S.config_name(shape[1], shape[2])} {shape[3]} sleep "
                      f"{hide:.0f}: {cells}", flush=True)
            torch.cuda.empty_cache()
        return 0
    if args.ab_reduce:
        print("shape tokens: deterministic backward us (order 1/order 2) cost over the default")
        rows = ab_reduce([s for r in args.ratio or AB_RATIOS for s in SHAPES[r]],
                         iters=args.iters,
                         progress=lambda row: print(row.line(), flush=True))
        worst = max(r.dape_gap for r in rows)
        print(f"summary: {len(rows)} rows, largest dAPE gap between the forms {worst:.2g}")
        return 1 if worst > 1e-3 else 0
    dirs = ("fwd", "bwd") if args.ab_forms == "all" else (args.ab_forms,)
    print("direction shape tokens: form us (order 1/order 2) % of the copy ceiling (cold)")
    rows = ab_forms(dirs, shapes, iters=args.iters, division=args.division, staged=args.stages,
                    progress=lambda row: print(row.line(), flush=True))
    bad = [r for r in rows if not all(r.bits_equal)]
    won = [r for r in rows if r.fastest != r.tags[0] and "tie" not in r.fastest]
    print(f"summary: {len(rows)} rows, bits equal on {len(rows) - len(bad)}; another form "
          f"faster in both orders on {len(won)}: "
          + (", ".join(f"{r.direction} {r.config} {r.tokens} {r.fastest}" for r in won)
             or "none"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
