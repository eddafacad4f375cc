"""Timing the fused kernels against the eager reference and the copy roofline (GPU only).

Method (docs/PERF_NOTES.md section 1): the headline kernel time is COLD: before each timed
launch a buffer of at least twice the L2 size (and at least 256 MB) is written, outside the
timed region, so no operand is L2-resident; CUDA events bracket ONE launch; the median of at
least 60 such launches after warm-ups. A second, warm figure replays a CUDA graph of many
back-to-back launches (host launch overhead out, operands partly L2-resident). A/B variants and
sweep finalists are timed cold, interleaved in one process on the same inputs and repeated in
swapped order. The roofline is this device's own device-to-device copy bandwidth (a 1 GiB copy,
far larger than L2), measured in the same process.
Nothing here prints: functions return records that ``csagate bench`` renders.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch
from csagate.kernels import schedule as S

# The gate's long shapes plus the short ones the targets name (docs/KERNELS.md section 6.2).
SHAPES: tuple[tuple[int, int, int], ...] = (
    # (coff, d, tokens in one segment)
    (1, 128, 8192), (1, 128, 131072),
    (2, 128, 8192), (2, 128, 65536),
    (1, 512, 65536),
    (2, 512, 65536), (2, 512, 131072),
)

# One shape per backward / forward bucket for A/B decisions: N = tokens / 128.
AB_SHAPES: dict[tuple[str, int, int, str], int] = {
    ("bwd", 1, 128, "small"): 8192, ("bwd", 1, 128, "default"): 131072,
    ("bwd", 2, 128, "small"): 8192, ("bwd", 2, 128, "default"): 65536,
    ("bwd", 1, 512, "default"): 65536, ("bwd", 2, 512, "default"): 65536,
    ("fwd", 1, 128, "small"): 8192, ("fwd", 1, 128, "default"): 65536,
    ("fwd", 1, 128, "large"): 131072, ("fwd", 2, 128, "small"): 8192,
    ("fwd", 2, 128, "default"): 65536, ("fwd", 1, 512, "default"): 65536,
    ("fwd", 1, 512, "large"): 131072, ("fwd", 2, 512, "small"): 8192,
    ("fwd", 2, 512, "default"): 65536, ("fwd", 2, 512, "large"): 131072,
}


# Decision floors, relative: a change is adopted only when it wins in both orders by more than
# the measured order-to-order noise and by at least this much. A single field flip (--ab) needs
# 0.5%: graph-replay medians of one kernel repeat within about that across orders on the H200
# (docs/PERF_NOTES.md section 1, noise 0.6-1.1%). A sweep's new geometry needs 1%: a winner
# within the A/B noise (< 1%) keeps the table entry (docs/PERF_NOTES.md section 3.1).
AB_FLOOR = 0.005
SWEEP_FLOOR = 0.01


# The cold method's constants.
COLD_MIN_ITERS = 60
FLUSH_MIN_BYTES = 256 << 20
COPY_BYTES = 1 << 30


def flush_bytes(l2_bytes: int) -> int:
    """Size of the L2 flush buffer: at least twice the L2 and at least 256 MB."""
    return max(2 * int(l2_bytes), FLUSH_MIN_BYTES)


def cold_iters(iters: int) -> int:
    """Timed cold launches: what was asked, but never fewer than COLD_MIN_ITERS."""
    return max(int(iters), COLD_MIN_ITERS)


def method(l2_bytes: int, flush: int, *, iters: int, warmup: int, launches: int = 20) -> dict:
    """The measuring method, recorded in the JSON next to the numbers."""
    return {
        "headline": "cold",
        "cold": (f"L2 flushed before each timed launch by writing {flush} bytes "
                 f"(>= 2x L2 = {l2_bytes} bytes, >= {FLUSH_MIN_BYTES}) outside the timed "
                 f"region; CUDA events around one launch; median of {cold_iters(iters)} "
                 f"after {warmup} warm-ups"),
        "graph": (f"warm: CUDA graph of {launches} back-to-back launches, per-launch time, "
                  f"median of {iters} replays after {warmup}; the backward's launch zeroes "
                  "dAPE first (a second kernel, as api.backward and the op launch it)"),
        "cold_bwd": "the backward kernel alone: dAPE zeroed before the flush, untimed",
        "cold_bwd_det": (f"the deterministic launch (kernel and reduction) behind a "
                         f"{DET_SLEEP_US} us GPU sleep that keeps its host work untimed"),
        "copy_ceiling": f"device-to-device copy of {COPY_BYTES} bytes, read + written bytes",
        "vs_copy": ("a device-to-device copy moving the op's bytes (half read, half written), "
                    "timed cold like the kernel: copy us / kernel us"),
        "bytes": "op_bytes: every consumed input read once, every output written once",
        "l2_bytes": l2_bytes, "flush_bytes": flush, "cold_iters": cold_iters(iters),
        "warmup": warmup,
    }


def percent_of(bw: float, ceiling: float) -> float:
    """Fraction of the copy ceiling reached (0 when either is unknown)."""
    return bw / ceiling if bw > 0 and ceiling > 0 else 0.0


def bandwidth(nbytes: int, us: float) -> float:
    """Bytes per second for ``nbytes`` moved in ``us`` microseconds (0 for no time)."""
    return nbytes / (us * 1e-6) if us > 0 else 0.0


def deterministic_cost(default_us: float, det_us: float) -> float:
    """(det - default) / default; 0 when either time is missing."""
    return (det_us - default_us) / default_us if default_us > 0 and det_us > 0 else 0.0


class L2Flush:
    """Evicts the L2: writes a buffer of ``flush_bytes(L2 size)`` on the current stream."""

    def __init__(self, device: int | None = None):
        props = torch.cuda.get_device_properties(
            torch.cuda.current_device() if device is None else device)
        self.l2_bytes = int(props.L2_cache_size)
        self.nbytes = flush_bytes(self.l2_bytes)
        self.buf = torch.empty(self.nbytes, dtype=torch.uint8, device="cuda")

    def __call__(self) -> None:
        self.buf.fill_(1)


@dataclass(frozen=True)
class Timing:
    median_us: float
    samples: int


def _events_median(fn: Callable[[], None], iters: int, warmup: int) -> Timing:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return Timing(statistics.median(times), iters)


# torch.cuda._sleep spins for a number of SM clock cycles; counted at 2 GHz (above the H200's
# 1.98 GHz boost clock) a sleep lasts at least the microseconds asked for.
SLEEP_CYCLES_PER_US = 2000


# The GPU sleep before each timed deterministic launch (three launches of host work, the last
# two PDL dependents): without it their host time could reach the timed region at short packs
# (r4 c1d128 8192: 17.0 against 12.6 µs with it and in graph replay; docs/PERF_NOTES.md 10.5).
DET_SLEEP_US = 300


def sleep_cycles(us: float) -> int:
    """Cycles of ``torch.cuda._sleep`` that keep the GPU busy for at least ``us``."""
    return max(0, int(us * SLEEP_CYCLES_PER_US))


def _cold_once(fn: Callable[[], None], flush: Callable[[], None],
               before: Callable[[], None] | None, hide_host_us: float = 0.0) -> float:
    """One cold sample. ``hide_host_us``: a GPU sleep queued after the flush, for a launcher
    whose host work per call (Python validation) could outlast the flush and leak into the
    timed region."""
    if before is not None:
        before()
    flush()
    if hide_host_us > 0:
        torch.cuda._sleep(sleep_cycles(hide_host_us))
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()          # queued behind the flush: the host launch cost hides under it
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3


def cold_median(fn: Callable[[], None], flush: Callable[[], None], *, iters: int = 100,
                warmup: int = 30, before: Callable[[], None] | None = None,
                hide_host_us: float = 0.0) -> Timing:
    """COLD time of one launch: L2 flushed (and ``before`` run) outside the timed region,
    CUDA events around one launch, median of ``cold_iters(iters)`` after ``warmup``;
    ``hide_host_us``: a GPU sleep before the timed region (``_cold_once``)."""
    for _ in range(warmup):
        if before is not None:
            before()
        fn()
    torch.cuda.synchronize()
    n = cold_iters(iters)
    times = [_cold_once(fn, flush, before, hide_host_us) for _ in range(n)]
    return Timing(statistics.median(times), n)


def _graph(fn: Callable[[], None], launches: int) -> torch.cuda.CUDAGraph:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(launches):
            fn()
    torch.cuda.synchronize()
    return graph


def _graph_replay_us(graph: torch.cuda.CUDAGraph, launches: int) -> float:
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / launches


def graph_median(fn: Callable[[], None], *, launches: int = 20, iters: int = 100,
                 warmup: int = 30) -> Timing:
    """Per-launch time from replays of a graph of ``launches`` back-to-back launches."""
    graph = _graph(fn, launches)
    for _ in range(warmup):
        graph.replay()
    torch.cuda.synchronize()
    times = [_graph_replay_us(graph, launches) for _ in range(iters)]
    return Timing(statistics.median(times), iters)


def copy_bandwidth(nbytes: int = COPY_BYTES, iters: int = 50, warmup: int = 10) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus bytes written."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    t = _events_median(lambda: dst.copy_(src), iters, warmup)
    return 2 * nbytes / (t.median_us * 1e-6)


def cold_copy_us(nbytes: int, flush: Callable[[], None], *, iters: int = 100,
                 warmup: int = 30) -> float:
    """COLD time of a device-to-device copy that moves ``nbytes`` (half read, half written),
    timed exactly like a kernel (``cold_median``): the same-size ceiling of an op. A single
    cold launch pays a fixed start (TLB and DRAM pages cold, the launch) that a 1 GiB copy
    hides, so at tens of MB even a copy stays well below the copy ceiling."""
    half = max(16, nbytes // 2 // 16 * 16)
    src = torch.empty(half, dtype=torch.uint8, device="cuda").fill_(1)
    dst = torch.empty_like(src)
    return cold_median(lambda: dst.copy_(src), flush, iters=iters, warmup=warmup).median_us


def op_bytes(direction: str, *, coff: int, d: int, n_tokens: int, n_rows: int,
             ratio: int = 128) -> int:
    """Bytes the op must move at least: every consumed input read once, every output written."""
    width = coff * d
    tokens = n_tokens * width * 2                 # one bf16 (T, coff*d) tensor
    ape = ratio * width * 4
    rows = n_rows * d * 2
    if direction == "fwd":
        return 2 * tokens + ape + rows            # kv, score in; out written
    return 4 * tokens + 2 * ape + rows            # kv, score, grad_out in; dkv, dscore out; dape


@dataclass
class ShapeRow:
    config: str
    tokens: int
    rows: int
    fwd_kernel: str
    bwd_kernel: str
    fused_fwd_cold_us: float = 0.0   # HEADLINE: L2 flushed, events around one launch
    fused_fwd_graph_us: float = 0.0  # warm: per launch, graph of back-to-back launches
    fused_fwd_us: float = 0.0        # warm: events around one call (includes host launch cost)
    fused_bwd_cold_us: float = 0.0
    fused_bwd_graph_us: float = 0.0
    fused_bwd_us: float = 0.0
    fused_bwd_det_cold_us: float = 0.0  # deterministic=True (partials + reduction), cold
    eager_fwd_us: float = 0.0
    eager_total_us: float = 0.0      # eager forward + autograd backward
    fwd_bytes: int = 0
    bwd_bytes: int = 0
    copy_bw: float = 0.0
    copy_fwd_cold_us: float = 0.0    # a copy of fwd_bytes, timed cold like the kernel
    copy_bwd_cold_us: float = 0.0
    extra: dict = field(default_factory=dict)

    def us(self, direction: str, which: str = "cold") -> float:
        return getattr(self, f"fused_{direction}_{which}_us")

    @property
    def fwd_speedup(self) -> float:
        us = self.us("fwd")
        return self.eager_fwd_us / us if us else 0.0

    @property
    def total_speedup(self) -> float:
        fused = self.us("fwd") + self.us("bwd")
        return self.eager_total_us / fused if fused else 0.0

    @property
    def det_cost(self) -> float:
        """Relative cost of the deterministic backward over the default one (cold)."""
        return deterministic_cost(self.fused_bwd_cold_us, self.fused_bwd_det_cold_us)

    def bw(self, direction: str, which: str = "cold") -> float:
        nbytes = self.fwd_bytes if direction == "fwd" else self.bwd_bytes
        return bandwidth(nbytes, self.us(direction, which))

    def roofline(self, direction: str, which: str = "cold") -> float:
        return percent_of(self.bw(direction, which), self.copy_bw)

    def vs_copy(self, direction: str) -> float:
        """The cold kernel against a cold copy of the same bytes: copy time / kernel time (1.0:
        as fast as moving its bytes can be from a cold start; 0 when either is missing)."""
        copy = self.copy_fwd_cold_us if direction == "fwd" else self.copy_bwd_cold_us
        us = self.us(direction)
        return copy / us if copy > 0 and us > 0 else 0.0


def shape_buffers(ratio: int, coff: int, d: int, tokens: int, seed: int = 1234):
    """One bench shape on the GPU: its pack (one segment of ``tokens``), grad_out and the
    output buffers, ``(pack, go, out, dkv, dscore, dape)``."""
    from csagate.reference import make_grad_out, make_pack

    pack = make_pack((tokens,), ratio=ratio, coff=coff, d=d, seed=seed, device="cuda")
    go = make_grad_out(pack.n_rows, d, device="cuda")
    out = torch.empty(pack.n_rows, d, dtype=torch.bfloat16, device="cuda")
    return (pack, go, out, torch.empty_like(pack.kv), torch.empty_like(pack.score),
            torch.zeros_like(pack.ape))


def bench_shape(coff: int, d: int, tokens: int, *, copy_bw: float, iters: int = 100,
                warmup: int = 30, eager_iters: int = 20, seed: int = 1234,
                flush: L2Flush | None = None) -> ShapeRow:
    from csagate.kernels import api
    from csagate.reference import backward as ref_backward
    from csagate.reference import forward as ref_forward

    flush = flush or L2Flush()
    pack, go, out, dkv, dscore, dape = shape_buffers(128, coff, d, tokens, seed)
    n = pack.n_rows
    args = pack.inputs()
    fwd = lambda: api.run_forward(*args, out, ratio=128, coff=coff)
    bwd_only = lambda: api.run_backward(*args, go, dkv, dscore, dape, ratio=128, coff=coff)

    def bwd():  # what api.backward and the op launch: dAPE zeroed inside the launch
        api.run_backward(*args, go, dkv, dscore, dape, ratio=128, coff=coff, zero_dape=True)

    fkey = fwd()
    bkey = api.run_backward(*args, go, dkv, dscore, dape.zero_(), ratio=128, coff=coff)
    row = ShapeRow(S.config_name(coff, d), tokens, n, fkey.tag, bkey.tag,
                   fwd_bytes=op_bytes("fwd", coff=coff, d=d, n_tokens=tokens, n_rows=n),
                   bwd_bytes=op_bytes("bwd", coff=coff, d=d, n_tokens=tokens, n_rows=n),
                   copy_bw=copy_bw)
    row.fused_fwd_cold_us = cold_median(fwd, flush, iters=iters, warmup=warmup).median_us
    row.fused_fwd_us = _events_median(fwd, iters, warmup).median_us
    row.fused_fwd_graph_us = graph_median(fwd, iters=iters, warmup=warmup).median_us
    # the dAPE zeroing runs before the flush, outside the timed region
    row.fused_bwd_cold_us = cold_median(bwd_only, flush, iters=iters, warmup=warmup,
                                        before=dape.zero_).median_us
    row.fused_bwd_det_cold_us = cold_median(
        lambda: api.run_backward(*args, go, dkv, dscore, dape, ratio=128, coff=coff,
                                 deterministic=True),
        flush, iters=iters, warmup=warmup, before=dape.zero_,
        hide_host_us=DET_SLEEP_US).median_us
    row.fused_bwd_us = _events_median(bwd, iters, warmup).median_us
    row.fused_bwd_graph_us = graph_median(bwd, iters=iters, warmup=warmup).median_us
    row.copy_fwd_cold_us = cold_copy_us(row.fwd_bytes, flush, iters=iters, warmup=warmup)
    row.copy_bwd_cold_us = cold_copy_us(row.bwd_bytes, flush, iters=iters, warmup=warmup)
    row.eager_fwd_us = _events_median(
        lambda: ref_forward(*args, ratio=128, coff=coff), eager_iters, 3).median_us
    row.eager_total_us = _events_median(
        lambda: ref_backward(*args, go, ratio=128, coff=coff), eager_iters, 3).median_us
    return row


@dataclass(frozen=True)
class ABRow:
    direction: str
    config: str
    bucket: str
    tokens: int
    field: str
    base: str
    variant: str
    base_us: tuple[float, float]       # order 1 (base first), order 2 (variant first)
    variant_us: tuple[float, float]
    noise: float                       # relative spread of the base across the two orders

    def delta(self, order: int) -> float:
        """Relative gain of the variant in one order (positive: the variant is faster)."""
        return (self.base_us[order] - self.variant_us[order]) / self.base_us[order]

    @property
    def decision(self) -> str:
        threshold = max(self.noise, AB_FLOOR)
        if self.delta(0) > threshold and self.delta(1) > threshold:
            return "adopt variant"
        if self.delta(0) < -threshold and self.delta(1) < -threshold:
            return "keep base"
        return "tie: keep base"


def _other_values(sched, name: str) -> list:
    """The values of field ``name`` in the schedule space other than ``sched``'s."""
    space = S.FWD_SPACE if isinstance(sched, S.FwdSchedule) else S.BWD_SPACE
    return [v for v in space[name] if v != getattr(sched, name)]


def interleaved(launchers, *, iters: int, warmup: int, flush: Callable[[], None],
                before=None, hide_host_us: float = 0.0):
    """COLD medians of two (or more) launchers, interleaved, in both orders.

    Each sample: ``before`` (one callable for every launcher, or one per launcher) and the L2
    flush outside the timed region, then (``hide_host_us`` > 0) a GPU sleep that long, CUDA
    events around one launch. Returns one (order 1, order 2) pair per launcher, in us per
    launch: ((a_order1, a_order2), (b_order1, b_order2), ...); order 1 times the launchers as
    given each round, order 2 in reverse; ``cold_iters(iters)`` rounds per order.
    """
    n = len(launchers)
    befores = list(before) if isinstance(before, list | tuple) else [before] * n
    medians = []
    for order in (tuple(range(n)), tuple(reversed(range(n)))):
        for fn, pre in zip(launchers, befores, strict=True):
            for _ in range(warmup):
                if pre is not None:
                    pre()
                fn()
        torch.cuda.synchronize()
        samples: list[list[float]] = [[] for _ in range(n)]
        for _ in range(cold_iters(iters)):
            for which in order:
                samples[which].append(_cold_once(launchers[which], flush, befores[which],
                                                 hide_host_us))
        medians.append([statistics.median(x) for x in samples])
    return tuple((medians[0][i], medians[1][i]) for i in range(n))


def _bucket_inputs(direction: str, coff: int, d: int, bucket: str, tokens: int):
    from csagate.reference import make_grad_out, make_pack

    n_rows = tokens // 128
    if (S.fwd_bucket if direction == "fwd" else S.bwd_bucket)(coff, d, n_rows) != bucket:
        raise AssertionError(f"shape {tokens} does not land in {direction} {bucket}")
    pack = make_pack((tokens,), ratio=128, coff=coff, d=d, device="cuda")
    go = make_grad_out(n_rows, d, device="cuda")
    return pack, go


def ab_field(name: str, *, iters: int = 100, warmup: int = 30,
             flush: L2Flush | None = None) -> list[ABRow]:
    """For every bucket whose schedule has field ``name``: the kernel against each valid
    other value of that field (a flag: flipped), timed cold (``interleaved``)."""
    from csagate.kernels._dsl import device_arch

    flush = flush or L2Flush()
    rows = []
    for (direction, coff, d, bucket), tokens in AB_SHAPES.items():
        select = S.select_fwd if direction == "fwd" else S.select_bwd
        base = select(coff, d, tokens // 128, device_arch())
        if not hasattr(base, name):
            continue
        for value in _other_values(base, name):
            variant = replace(base, **{name: value})
            if S.config_problems(coff, d, variant):
                continue
            pack, go = _bucket_inputs(direction, coff, d, bucket, tokens)
            launchers = [schedule_launcher(direction, pack, go, sched)
                         for sched in (base, variant)]
            base_us, var_us = interleaved(launchers, iters=iters, warmup=warmup, flush=flush)
            noise = abs(base_us[0] - base_us[1]) / min(base_us)
            rows.append(ABRow(direction, S.config_name(coff, d), bucket, tokens, name,
                              base.tag, variant.tag, base_us, var_us, noise))
            del pack, go, launchers
            torch.cuda.empty_cache()
    return rows


def schedule_launcher(direction: str, pack, grad_out, sched):
    """A zero-argument launcher of one ratio=128 schedule on ``pack``, bypassing dispatch.

    For A/B benchmarks of schedule fields: validates and compiles now (eagerly, so the
    launcher can be captured), allocates the output buffers once, and launches on the
    current stream at each call. The backward keeps accumulating into its dape buffer.
    The buffers are on the launcher as ``.buffers``: ``(out,)`` or ``(dkv, dscore, dape)``.
    """
    from csagate.kernels import api, registry, validate
    from csagate.kernels.cache import CACHE

    family = registry.family(pack.ratio, direction)
    if pack.ratio != S.RATIO:
        raise ValueError(f"schedule_launcher runs ratio=128 schedules, got ratio={pack.ratio}")
    problems = S.config_problems(pack.coff, pack.d, sched)
    if problems:
        raise ValueError(f"schedule {sched} cannot serve c{pack.coff}d{pack.d}: "
                         + "; ".join(problems))
    validate.require_cuda()
    kv, score, ape, cu, cuc = pack.inputs()
    api.check_support(kv, score, ape, cu, cuc, grad_out, ratio=pack.ratio, coff=pack.coff,
                      out_name="grad_out")
    device = validate.check_launchable({"kv": kv, "grad_out": grad_out}, None)
    key = registry.make_key(direction, pack.ratio, pack.coff, pack.d, sched,
                            validate.device_arch(device.index))
    with torch.cuda.device(device):
        fn = CACHE.executor(key, device.index)
    inputs = dict(kv=kv, score=score, ape=ape, cu=cu, cuc=cuc)
    if direction == "fwd":
        outputs = dict(out=torch.empty_like(grad_out))
    else:  # rows_per_cta None: derived per launch from N and the device's SMs
        outputs = dict(grad_out=grad_out, dkv=torch.empty_like(kv),
                       dscore=torch.empty_like(score), dape=torch.zeros_like(ape))

    def launch() -> None:
        with torch.cuda.device(device):
            family.launch(fn, key, **inputs, **outputs)
    launch.buffers = tuple(t for name, t in outputs.items() if name != "grad_out")
    return launch


# --- schedule sweep -----------------------------------------------------------------------

def _geometries(direction: str, coff: int, d: int, base):
    """Stage 1: the base's options on every geometry (vec, tchunks[, regwin]) of the space,
    each option kept where the geometry can take it (``schedule.restrict``), valid ones only."""
    space = S.FWD_SPACE if direction == "fwd" else S.BWD_SPACE
    layouts = [dict(vec=v, tchunks=t) for v in space["vec"] for t in space["tchunks"]]
    if "regwin" in space:
        layouts = [dict(lay, regwin=rw) for lay in layouts for rw in space["regwin"]]
    out = [S.restrict(replace(base, threads_x=S.threads_x_for(d, lay["vec"]), **lay))
           for lay in layouts]
    return [c for c in dict.fromkeys(out) if not S.config_problems(coff, d, c)]


# Stage 2's pairs changed together (each alone may lose what the pair wins: on the H200 the
# backward's fast exp and goreuse, the forward's form and fast exp).
_PAIRS = {"fwd": (("form", "fastexp"),), "bwd": (("fastexp", "goreuse"),)}


def _flag_variants(direction: str, coff: int, d: int, sched):
    """Stage 2: every option of the space set to each of its other values, and the pairs of
    ``_PAIRS`` changed together; valid ones only."""
    out = [replace(sched, **{n: v}) for n in S.option_names(direction)
           for v in _other_values(sched, n)]
    out += [replace(sched, **{a: va, b: vb}) for a, b in _PAIRS[direction]
            for va in _other_values(sched, a) for vb in _other_values(sched, b)]
    return [c for c in dict.fromkeys(out) if not S.config_problems(coff, d, c)]


@dataclass
class SweepCandidate:
    tag: str
    sched: object
    us: float = float("nan")
    ok: bool = False
    note: str = ""


@dataclass
class SweepRow:
    direction: str
    config: str
    bucket: str
    tokens: int
    base: str
    best: str
    best_sched: object
    base_us: tuple[float, float] = (float("nan"), float("nan"))
    best_us: tuple[float, float] = (float("nan"), float("nan"))
    candidates: list = field(default_factory=list)

    def delta(self, order: int) -> float:
        return (self.base_us[order] - self.best_us[order]) / self.base_us[order]

    @property
    def decision(self) -> str:
        if self.best == self.base:
            return "keep base (fastest)"
        noise = abs(self.base_us[0] - self.base_us[1]) / min(self.base_us)
        threshold = max(noise, SWEEP_FLOOR)
        if self.delta(0) > threshold and self.delta(1) > threshold:
            return "adopt best"
        return "keep base (within noise)"


def _tolerance_ok(got: torch.Tensor, ref: torch.Tensor) -> bool:
    """G2's tolerance (out, dKV, dScore at scale 1): the gate's own check and numbers."""
    from csagate.gates import comparators, limits

    return comparators.tolerance(got, ref, bound=limits.MAX_ABS,
                            allowed=limits.count_allowance(got.numel())).ok


def probe_problem(direction: str, coff: int, d: int, sched, arch: str, ptx_dir, ptxas: str
                  ) -> str:
    """Why ptxas refuses a sweep candidate ("" when it is clean: 0 spill, 0 stack). A backward
    entry ships its deterministic form too (the api derives it from the table's entry), so that
    form must be clean as well."""
    from csagate.kernels.registry import make_key
    from csagate.perf import probe

    row = probe.probe_one(make_key(direction, 128, coff, d, sched, arch), ptx_dir, ptxas)
    if not row.clean:
        return f"probe: {row.note}"
    if direction == "bwd":
        det = make_key(direction, 128, coff, d, sched, arch, deterministic=True)
        row = probe.probe_one(det, ptx_dir, ptxas)
        if not row.clean:
            return f"probe (deterministic form): {row.note}"
    return ""


def sweep_bucket(direction: str, coff: int, d: int, bucket: str, tokens: int, *,
                 quick_iters: int = 15, iters: int = 60, warmup: int = 10,
                 flush: L2Flush | None = None,
                 progress: Callable[[str], None] | None = None) -> SweepRow:
    """Search this bucket's schedule space on the device; A/B the winner against the table.

    Every candidate and the final A/B are timed cold (``cold_median``, ``interleaved``): at
    least COLD_MIN_ITERS flushed launches each."""
    import tempfile
    from pathlib import Path

    from csagate.kernels._dsl import device_arch
    from csagate.perf import probe
    from csagate.reference import backward as ref_backward

    flush = flush or L2Flush()
    ptxas = probe.find_ptxas()
    arch = device_arch()
    ptx_dir = Path(tempfile.mkdtemp(prefix="csagate-sweep-"))
    pack, go = _bucket_inputs(direction, coff, d, bucket, tokens)
    ref = ref_backward(*pack.inputs(), go, ratio=128, coff=coff)
    select = S.select_fwd if direction == "fwd" else S.select_bwd
    base = select(coff, d, tokens // 128, arch)
    seen: dict[object, SweepCandidate] = {}

    def measure(sched) -> SweepCandidate:
        if sched in seen:
            return seen[sched]
        cand = seen[sched] = SweepCandidate(sched.tag, sched)
        if progress:
            progress(f"{direction} c{coff}d{d} {bucket}: {sched.tag}")
        try:
            launch = schedule_launcher(direction, pack, go, sched)
            problem = probe_problem(direction, coff, d, sched, arch, ptx_dir, ptxas)
            if problem:
                cand.note = problem
                return cand
            if direction == "bwd":
                launch.buffers[2].zero_()
            launch()
            torch.cuda.synchronize()
            if direction == "fwd":
                cand.ok = _tolerance_ok(launch.buffers[0], ref.out)
            else:
                cand.ok = (_tolerance_ok(launch.buffers[0], ref.dkv)
                           and _tolerance_ok(launch.buffers[1], ref.dscore))
            if not cand.ok:
                cand.note = "fails G2 tolerance"
                return cand
            before = launch.buffers[2].zero_ if direction == "bwd" else None
            cand.us = cold_median(launch, flush, iters=quick_iters, warmup=warmup,
                                  before=before).median_us
        except Exception as exc:  # a candidate that fails to build or run is recorded
            cand.note = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return cand

    def ranked():
        good = [c for c in seen.values() if c.ok and c.us == c.us]
        return sorted(good, key=lambda c: c.us)

    measure(base)
    for sched in _geometries(direction, coff, d, base):
        measure(sched)
    for top in ranked()[:2]:
        for sched in _flag_variants(direction, coff, d, top.sched):
            measure(sched)
    best = ranked()[0] if ranked() else seen[base]
    row = SweepRow(direction, S.config_name(coff, d), bucket, tokens, base.tag, best.tag,
                   best.sched, candidates=list(seen.values()))
    if best.sched != base and seen[base].ok:
        launchers = [schedule_launcher(direction, pack, go, s) for s in (base, best.sched)]
        row.base_us, row.best_us = interleaved(launchers, iters=iters, warmup=warmup,
                                               flush=flush)
    else:
        row.base_us = row.best_us = (seen[base].us, seen[base].us)
    return row


def sweep(directions=("fwd", "bwd"), **kwargs) -> list[SweepRow]:
    if kwargs.get("flush") is None:
        kwargs["flush"] = L2Flush()
    rows = []
    for (direction, coff, d, bucket), tokens in AB_SHAPES.items():
        if direction in directions:
            rows.append(sweep_bucket(direction, coff, d, bucket, tokens, **kwargs))
            torch.cuda.empty_cache()
    return rows
