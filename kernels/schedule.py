"""Schedules of the kernels: the target arches and their tables, the ratio=128 dispatch tables
(schedules, buckets, the validity predicate); the small-ratio schedules (ratio=4 among
them) are kernels/small_schedule.py's.

Pure Python (no cutlass, no torch): the gate's coverage check, ``csagate schedules`` and the
CPU tests read these tables on any machine.

Every schedule field is compile-time and part of the JIT key. A bucket is chosen from N,
the row count of ``out``/``grad_out`` including capacity padding rows:

* forward:  small if N <= SMALL_NB_MAX and the config has a small entry, else large if
  N >= LARGE_NB_MIN and the config has a large entry, else the config's default;
* backward: small if N <= BWD_SMALL_NB_MAX and the config has a bwd-small entry, else default.

N == 0 launches nothing, so it selects no kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

RATIO = 128
HEAD_DIMS = (128, 512)
COFFS = (1, 2)
CONFIGS = tuple((coff, d) for d in HEAD_DIMS for coff in COFFS)  # c1d128, c2d128, c1d512, c2d512

SMALL_NB_MAX = 128
LARGE_NB_MIN = 1024
BWD_SMALL_NB_MAX = 192

MAX_THREADS = 1024
SMEM_LIMIT = 227 * 1024
SM_SMEM = 228 * 1024  # shared memory per SM (sm_90a, sm_100a), 1 KB of it reserved per CTA
# regwin: resident threads per SM that its register cap (.maxntid: 65536 / 512 = 128 registers
# per thread) and rows_per_cta assume, by default; a schedule may target 1024 instead
# (BwdSchedule.sm_threads: 64 registers per thread, twice the warps in flight).
REGWIN_THREADS_PER_SM = 512
REGWIN_SM_THREADS = (512, 1024)  # the register-window occupancy targets a schedule can take
# regwin: the longest window chunk C (positions per thread): 4 registers per position (see
# config_problems); C <= 16 compiles to <= 128 registers with 0 spill on sm_90a and sm_100a.
REGWIN_MAX_CHUNK = 16
# Largest forward prefetch ring, in slots x columns: ptxas keeps up to two groups of raw loads
# live (about 4 registers per column-slot). 16 (v2u8, v4u4, v8u2) stays near 128 registers; 32
# (v4u8, v8u4) takes 150-200 and ptxas spills to reach an occupancy step (v8u8: 255 + spills).
PREFETCH_RING_MAX = 16
# The backward's L2 prefetch distances, in rows (0: none); BwdSchedule.l2pf.
BWD_L2PF = (0, 1, 2, 3)


def config_name(coff: int, d: int) -> str:
    return f"c{coff}d{d}"


@dataclass(frozen=True)
class FwdSchedule:
    """One r128 forward kernel: vec columns per thread, tchunks window chunks per row."""

    vec: int
    tchunks: int
    threads_x: int
    twophase: bool
    fastexp: bool
    unroll: int = 4          # runtime-loop unroll of the chunk loop (H200 tuning field)
    prefetch: bool = False   # software-pipelined loads: the next unroll group in flight
    oneexp: bool = False     # online form with one exp per slot (same bits, fewer instructions)

    @property
    def tag(self) -> str:
        return (f"v{self.vec}t{self.tchunks}x{self.threads_x}"
                + ("_2ph" if self.twophase else "") + ("_fexp" if self.fastexp else "")
                + (f"_u{self.unroll}" if self.unroll != 4 else "")
                + ("_pf" if self.prefetch else "") + ("_1e" if self.oneexp else ""))

    def astuple(self) -> tuple:
        """The upstream 5-tuple (vec, tchunks, threads_x, twophase, fastexp)."""
        return (self.vec, self.tchunks, self.threads_x, self.twophase, self.fastexp)


@dataclass(frozen=True)
class BwdSchedule:
    """One r128 backward kernel; ``goreuse`` keeps grad_out in registers across barriers."""

    vec: int
    tchunks: int
    threads_x: int
    fastexp: bool
    goreuse: bool
    regwin: bool = False     # window held in registers instead of staged in shared memory
    # Deterministic dAPE (issue 12.3): each CTA STORES its dAPE partial into its own slice of
    # a (gx*ratio, W) buffer instead of the fp32 atomic; kernels/reduce.py sums the slices in
    # ascending CTA order. Never in a dispatch table: the api sets it (``deterministic=``).
    deterministic: bool = False
    # regwin only: the resident threads per SM the kernel is built for (its register cap,
    # .maxntid = 65536 / sm_threads registers, and schedule.rows_per_cta's grid): 512 (128
    # registers, 16 warps per SM) or 1024 (64 registers, 32 warps: more latency hidden).
    sm_threads: int = REGWIN_THREADS_PER_SM
    # L2 prefetch distance in rows (0: off): at the start of its row r, a CTA requests the
    # window of its row r + l2pf (score and kv of its column slice) into L2
    # (cp.async.bulk.prefetch), so the row's loads, issued about l2pf rows later, hit L2.
    l2pf: int = 0
    # regwin only: the current row's s = f32(score) + APE kept in fp32 registers from the max
    # pass (then e, from the partials pass), instead of recomputing s (an APE load) in pass 2
    # and s and e in pass 3: C*vec more registers, about 10 fewer instructions per element.
    keeps: bool = False
    # keeps only: the per-row shared values (chunk max, den' and S' partials, 1/den and S)
    # moved as vec-wide vectors, one shared access for a thread's vec columns.
    vsm: bool = False
    # keeps only: dp = go * kv kept in fp32 from pass 1 instead of the raw kv word, so passes 2
    # and 3 neither unpack kv nor multiply by go again (C*vec registers instead of C).
    keepdp: bool = False
    # regwin only: each thread's C*vec APE values (the same for every row of the CTA) copied
    # once into thread-private shared memory at the CTA's start, so a row reads them from
    # shared memory instead of re-loading them from L1/L2 (win*cols*4 more bytes per CTA).
    apesm: bool = False
    # regwin only: the fetched grad_out kept as the loaded word (a packed bf16 pair at vec 2)
    # until used, instead of unpacked as loaded (the warp then waits on the load right after
    # issuing the fetch); with goreuse, that word is what the row holds for its gradient pass.
    gopack: bool = False
    # regwin, vec 2: the next row's grad_out fetched with cp.async into a thread-private shared
    # slot (two, by row parity) instead of a register; pass 1 unpacks it from there, and with
    # goreuse the gradient pass reads it there again (no reload, no register held).
    gosm: bool = False
    # apesm only: the APE copy by cp.async (nothing waits on its loads where they are issued;
    # waited for before the row loop) instead of loads and shared stores.
    apeasync: bool = False

    @property
    def tag(self) -> str:
        rw = "_rw" + ("" if self.sm_threads == REGWIN_THREADS_PER_SM else "1k")
        return (f"v{self.vec}t{self.tchunks}x{self.threads_x}"
                + ("_fexp" if self.fastexp else "") + ("_gor" if self.goreuse else "")
                + (rw if self.regwin else "") + ("_ks" if self.keeps else "")
                + ("_vsm" if self.vsm else "") + ("_kdp" if self.keepdp else "")
                + ("_as" if self.apesm else "") + ("a" if self.apeasync else "")
                + ("_gp" if self.gopack else "")
                + ("_gs" if self.gosm else "")
                + (f"_l2p{self.l2pf}" if self.l2pf else "")
                + ("_det" if self.deterministic else ""))

    def astuple(self) -> tuple:
        """The upstream 5-tuple (vec, tchunks, threads_x, fastexp, goreuse)."""
        return (self.vec, self.tchunks, self.threads_x, self.fastexp, self.goreuse)


def threads_x_for(d: int, vec: int) -> int:
    return 32 if d // vec >= 32 else d // vec


def window(coff: int, ratio: int = RATIO) -> int:
    return coff * ratio


class R128Geometry:
    """The static geometry of one ratio=128 kernel: (d, coff) and its schedule's thread layout
    (the kernel classes extend it; every field is compile-time)."""

    def __init__(self, d: int, coff: int, sched: FwdSchedule | BwdSchedule):
        self.d, self.coff, self.sched = d, coff, sched
        self.vec, self.tchunks, self.threads_x = sched.vec, sched.tchunks, sched.threads_x
        self.width = coff * d  # W: row width of kv, score, ape
        self.win = window(coff)
        self.chunk = self.win // sched.tchunks  # C: window slots per thread
        self.ncols = d // sched.vec  # column groups of a half row
        self.gy = -(-self.ncols // sched.threads_x)  # CTAs across the column groups


def bwd_smem_bytes(coff: int, sched: BwdSchedule, ratio: int = RATIO) -> int:
    """Shared memory of the backward: sE fp32 + sKV bf16 tiles, chunk partials, 64 B slack.

    regwin keeps the window in registers: shared memory holds the chunk partials, the
    per-column 1/den and S, and the thread-private fp32 dAPE sums (one per window slot);
    apesm adds the thread-private APE values (one per window slot).
    """
    cols = sched.threads_x * sched.vec
    win = window(coff, ratio)
    if sched.regwin:
        ape = win * cols * 4 if sched.apesm else 0
        go = 2 * sched.threads_x * sched.tchunks * 4 if sched.gosm else 0
        return win * cols * 4 + ape + go + 3 * sched.tchunks * cols * 4 + 2 * cols * 4 + 64
    return win * cols * 6 + 3 * sched.tchunks * cols * 4 + 2 * cols * 4 + 64


def fwd_smem_bytes(sched: FwdSchedule) -> int:
    """The forward's merge buffers: (m, den, acc) per chunk and column."""
    return 3 * sched.tchunks * sched.threads_x * sched.vec * 4


def config_problems(coff: int, d: int, sched: FwdSchedule | BwdSchedule,
                    ratio: int = RATIO) -> list[str]:
    """THE statement of the constraint set: why a schedule cannot serve (coff, d); [] if it can."""
    win = window(coff, ratio)
    out = []
    if sched.vec not in (1, 2, 4, 8) or d % sched.vec:
        out.append(f"vec={sched.vec} does not divide head_dim {d}")
    if sched.tchunks < 1 or win % sched.tchunks:
        out.append(f"tchunks={sched.tchunks} does not divide the window {win}")
    elif coff == 2 and ratio % (win // sched.tchunks):
        out.append(f"chunk {win // sched.tchunks} straddles the coff=2 half boundary")
    if sched.threads_x < 1 or sched.threads_x * sched.tchunks > MAX_THREADS:
        out.append(f"threads {sched.threads_x}x{sched.tchunks} exceed {MAX_THREADS}")
    if sched.threads_x != threads_x_for(d, sched.vec):
        out.append(f"threads_x={sched.threads_x} is not the derived {threads_x_for(d, sched.vec)}")
    if isinstance(sched, FwdSchedule):
        if sched.unroll not in (1, 2, 4, 8):
            out.append(f"unroll={sched.unroll} is not one of 1, 2, 4, 8")
        if sched.prefetch and win % max(sched.tchunks, 1) == 0 and (
                min(sched.unroll, win // sched.tchunks) * sched.vec > PREFETCH_RING_MAX):
            out.append(f"prefetch keeps min(unroll, C)*vec > {PREFETCH_RING_MAX} loads live: "
                       "it spills")
        if sched.oneexp and sched.twophase:
            out.append("oneexp is an online-form option; the two-phase form has one exp")
    if isinstance(sched, BwdSchedule):
        if sched.vec > 2:
            out.append(f"the backward has no vec={sched.vec} form")
        if (sched.vsm or sched.keepdp) and not sched.keeps:
            out.append("vsm and keepdp are options of keeps (the register window keeping s)")
        if sched.keeps and not sched.regwin:
            out.append("keeps is a register-window option (staged kernels keep s in shared "
                       "memory already)")
        if sched.l2pf not in BWD_L2PF:
            out.append(f"l2pf={sched.l2pf}: an L2 prefetch distance in rows, one of {BWD_L2PF}")
        if sched.sm_threads not in REGWIN_SM_THREADS or (
                not sched.regwin and sched.sm_threads != REGWIN_THREADS_PER_SM):
            out.append(f"sm_threads={sched.sm_threads}: a regwin target in "
                       f"{REGWIN_SM_THREADS} (staged kernels keep {REGWIN_THREADS_PER_SM})")
        elif sched.regwin:
            # regwin targets sm_threads resident threads per SM (512 by default), so a thread
            # gets 65536 / sm_threads registers (128 or 64). Its window chunk takes 4 per
            # window position: the score and kv of the current row and of the next row in
            # flight (a bf16 pair packs into one register). At 512, C <= REGWIN_MAX_CHUNK = 16
            # compiles to <= 128 registers with 0 spill on sm_90a and sm_100a; C = 32 does
            # not. At 1024 whether 64 registers suffice depends on C, vec and coff (the probe
            # and the build tests check every shipped one: 0 spill).
            threads = sched.threads_x * sched.tchunks
            if threads < 1 or sched.sm_threads % threads:
                out.append(f"regwin: {threads} threads per CTA do not divide "
                           f"{sched.sm_threads} per SM")
            if (sched.tchunks >= 1 and win % sched.tchunks == 0
                    and win // sched.tchunks > REGWIN_MAX_CHUNK):
                out.append(f"regwin: a chunk of C={win // sched.tchunks} window positions "
                           f"needs 4*C = {4 * (win // sched.tchunks)} registers > "
                           f"{4 * REGWIN_MAX_CHUNK}")
        if sched.gopack and not sched.regwin:
            out.append("gopack is a register-window option")
        if sched.apeasync and not sched.apesm:
            out.append("apeasync is an apesm option (how the APE copy is made)")
        if sched.gosm and (not sched.regwin or sched.vec != 2 or sched.gopack):
            out.append("gosm is a register-window option at vec 2 (a 4-byte cp.async), "
                       "exclusive with gopack")
        if sched.apesm:
            threads = sched.threads_x * sched.tchunks
            if not sched.regwin:
                out.append("apesm is a register-window option")
            elif threads >= 1 and sched.sm_threads % threads == 0:
                # the sm_threads target must stay resident: CTAs per SM x (smem + 1 KB)
                ctas = sched.sm_threads // threads
                need = ctas * (bwd_smem_bytes(coff, sched, ratio) + 1024)
                if need > SM_SMEM:
                    out.append(f"apesm: {ctas} CTAs per SM need {need} B of shared memory > "
                               f"{SM_SMEM} B")
        if bwd_smem_bytes(coff, sched, ratio) > SMEM_LIMIT:
            out.append(f"shared memory {bwd_smem_bytes(coff, sched, ratio)} B > {SMEM_LIMIT} B")
    return out


def _fwd(coff: int, d: int, vec: int, tchunks: int, twophase: bool, fastexp: bool) -> FwdSchedule:
    return FwdSchedule(vec, tchunks, threads_x_for(d, vec), twophase, fastexp)


def _bwd(coff: int, d: int, vec: int, tchunks: int, fastexp: bool, goreuse: bool) -> BwdSchedule:
    return BwdSchedule(vec, tchunks, threads_x_for(d, vec), fastexp, goreuse)


# --- upstream (B200, sm_100a) tables --------------------------------------------------------
# Provenance: upstream cudnn-frontend B200 measurements (nsys kernel time), see
# docs/KERNELS.md section 6.3; H200 re-measurements are recorded in docs/PERF_NOTES.md.

FWD_DEFAULT = {
    # (coff, d): schedule.  Default rule: vec 4 if W >= 1024 and d % 4 == 0 else 2; tchunks 8
    # for (coff=2, vec=2) else 4; online rescale; fastexp only where it measured faster.
    (1, 128): _fwd(1, 128, 2, 4, False, False),   # B200: baseline of the c1d128 mid bucket
    # B200: fastexp 3x8k 12.19 -> 8.99 us, 65k 25.56 -> 16.39
    (2, 128): _fwd(2, 128, 2, 8, False, True),
    (1, 512): _fwd(1, 512, 2, 4, False, False),   # B200: baseline of the c1d512 mid bucket
    (2, 512): _fwd(2, 512, 4, 4, False, False),   # B200: W = 1024 -> vec 4 default
}
FWD_SMALL = {
    (1, 128): _fwd(1, 128, 2, 8, False, False),   # B200: tchunks 8, 1x8192 7.75 -> ~5 us
    # B200: tchunks 16 10.5 -> ~7.3; fastexp 8.21 -> 6.42
    (2, 128): _fwd(2, 128, 2, 16, False, True),
    (2, 512): _fwd(2, 512, 2, 8, False, True),    # B200: 18.9 -> ~13.3; fastexp 14.42 -> 10.91
}
FWD_LARGE = {
    # B200: vec4 gy=1 0.58 waves; two-phase 23.1 -> 18.5
    (1, 128): _fwd(1, 128, 4, 4, True, True),
    (1, 512): _fwd(1, 512, 4, 4, False, True),    # B200: 131k 85.41 -> 77.55 us
    (2, 512): _fwd(2, 512, 4, 4, False, True),    # B200: 131k 152.35 -> 117.71 us
}

# --- backward tables -------------------------------------------------------------------

BWD_DEFAULT = {
    (1, 128): _bwd(1, 128, 2, 8, True, False),    # B200: goreuse lost 63.87 -> 64.70 us at 131k
    (2, 128): _bwd(2, 128, 2, 8, True, True),     # B200: goreuse 61.25 -> 60.32 us at 65k
    # B200: tchunks 4 ~25% faster; goreuse 17.65 -> 17.28
    (1, 512): _bwd(1, 512, 2, 4, True, True),
    (2, 512): _bwd(2, 512, 2, 8, True, True),     # B200: goreuse 28.27 -> 27.84 us at 8k
}
BWD_SMALL = {
    # B200: vec1 13.5 -> 11.5; fastexp off 0.905x; goreuse 8.45 -> 6.27
    (1, 128): _bwd(1, 128, 1, 8, False, True),
    # B200: vec1 17.3 -> 13.8; fastexp 1.003x (off); goreuse 11.30 -> 10.66
    (2, 128): _bwd(2, 128, 1, 8, False, True),
}


# --- H200 (sm_90a) tables ---------------------------------------------------------------
# Same buckets and boundaries as upstream; entries chosen on the H200 by `csagate bench
# --sweep` (geometry, then flags; every candidate passed G2 and probed 0 spill / 0 stack), each
# confirmed by an interleaved A/B in both orders against the entry it replaced: previous ->
# H200 choice, us per launch from CUDA-graph replays, order 1 / order 2 (docs/PERF_NOTES.md).
# Sweep 1 started from the upstream entries, sweep 2 from sweep 1's; a sweep-2 winner within
# the A/B noise (< 1%) kept the sweep-1 entry. Sweep 3 (2026-11-30, issue 12.4) re-derived
# every bucket with the cold method (L2 flushed before each launch, events around one launch)
# and adopted the six winners its rule accepts (beyond max(noise, 1%) in both orders). The
# c1d512 default and large buckets select the same kernel on the H200, so its forward table
# holds 9 distinct kernels (upstream: 10).

FWD_SMALL_H200 = {
    # sweep 1: 6.98 -> 4.26 / 6.99 -> 4.24 (+39%); sweep 2 fastexp: 4.74 -> 4.21 / 4.75 -> 4.25;
    # cold sweep (v1t8x32_fexp_pf ->): 7.8 -> 7.7 / 7.8 -> 7.7 cold us (+1.3%)
    (1, 128): FwdSchedule(1, 16, 32, False, True, unroll=8, prefetch=True),
    # sweep 1: 7.32 -> 5.12 / 7.34 -> 5.14 (+30%); sweep 2 oneexp: 5.04 -> 4.86 / 5.13 -> 4.96;
    # cold sweep (v1t8x32_fexp_pf_1e ->): 10.7 -> 10.1 / 10.7 -> 10.1 (+5.6%)
    (2, 128): FwdSchedule(1, 16, 32, False, True, prefetch=True, oneexp=True),
    # 1x8192: 11.08 -> 10.21 / 11.06 -> 10.21 (+8%); cold sweep (v2t8x32_fexp_1e ->):
    # 23.2 -> 18.7 / 23.0 -> 18.8 (+19%)
    (2, 512): FwdSchedule(2, 16, 32, False, True, oneexp=True),
}
FWD_DEFAULT_H200 = {
    # 1x65536: 15.85 -> 11.25 / 15.87 -> 11.28 (+29%); cold sweep (v4t8x32_2ph_fexp ->):
    # 22.5 -> 19.3 / 22.5 -> 19.3 cold us (+14%): no two-phase, no fast exp; cold sweep of
    # 2026-12-01 (v4t8x32 ->): 19.4 -> 18.6 / 19.4 -> 18.5 cold us (+4.6%): one exp
    (1, 128): FwdSchedule(4, 8, 32, False, False, oneexp=True),
    # 1x65536: 24.24 -> 22.01 / 24.22 -> 21.99 (+9%)
    (2, 128): FwdSchedule(2, 8, 32, False, True, oneexp=True),
    # sweep 1: 59.64 -> 42.54 / 59.80 -> 42.73 (+29%); sweep 2 unroll 8: 42.48 -> 38.62 /
    # 42.56 -> 38.63 (+9%): the same kernel as the large bucket
    (1, 512): FwdSchedule(4, 4, 32, False, True, unroll=8),
    # 1x65536: 86.22 -> 75.32 / 86.37 -> 75.40 (+13%)
    (2, 512): FwdSchedule(4, 4, 32, False, False, oneexp=True),
}
FWD_LARGE_H200 = {
    # 1x131072: 27.92 -> 22.74 / 27.93 -> 22.78 (+19%); cold sweep (v4t4x32_fexp ->):
    # 31.4 -> 29.4 / 31.4 -> 29.4 cold us (+6.4%): prefetch; cold sweep of 2026-12-01
    # (v4t4x32_fexp_pf ->): 29.5 -> 27.4 / 29.4 -> 27.5 cold us (+7%): a ring of 2 slots
    (1, 128): FwdSchedule(4, 4, 32, False, True, unroll=2, prefetch=True),
    # 1x131072: 80.95 -> 74.57 / 80.98 -> 74.57 (+8%)
    (1, 512): FwdSchedule(4, 4, 32, False, True, unroll=8),
    # 1x131072: 167.30 -> 145.13 / 167.36 -> 145.10 (+13%); cold sweep of 2026-12-01
    # (v4t4x32_fexp_pf ->): 150.6 -> 149.0 / 150.6 -> 149.0 cold us (+1.1%): vec 2
    (2, 512): FwdSchedule(2, 4, 32, False, True, prefetch=True),
}
BWD_SMALL_H200 = {
    # 1x8192: 8.58 -> 7.34 / 8.60 -> 7.33 (+14.6%): tchunks 16, fast exp; cold sweep
    # (v1t16x32_fexp_gor ->): 10.5 -> 10.1 / 10.4 -> 10.1 cold us (+3.8%): register window;
    # sweep 5 (v1t16x32_fexp_gor_rw ->): 10.3 -> 10.1 / 10.2 -> 10.1 cold us (+1.7/+1.3%): s
    # kept, goreuse off (with goreuse: +1.1/+0.3%, within noise); fifth session (->_gor.._gp):
    # 10.11 -> 9.82 / 10.05 -> 9.87 (+2.3%): grad_out word held, no reload
    (1, 128): BwdSchedule(1, 16, 32, True, True, regwin=True, keeps=True, gopack=True),
    # 1x8192: 12.78 -> 10.57 / 12.78 -> 10.55 (+17.3%): register window; 2026-12-01 cold
    # (v1t16x32_fexp_gor_rw ->): 14.2 -> 13.0 / 14.1 -> 12.9 cold us (+8.6%): s kept
    (2, 128): BwdSchedule(1, 16, 32, True, True, regwin=True, keeps=True),
}
BWD_DEFAULT_H200 = {
    # 1x131072: 94.75 -> 58.36 / 94.34 -> 57.68 (+38.6%) with goreuse; goreuse alone is a
    # tie (A/B on the shipped table: 57.04 -> 57.23 / 57.40 -> 57.59, noise 0.6%): off.
    # 2026-12-01 cold (v2t16x32_fexp_rw ->): 61.0 -> 56.9 / 60.8 -> 56.9 cold us (+6.5%): s kept;
    # then 56.8 -> 52.7 / 57.3 -> 52.1 (+8%): vector shared accesses; sweep 5
    # (v2t16x32_fexp_rw_ks_vsm ->): 54.0 -> 51.4 / 54.0 -> 51.6 cold us (+4.8/+4.5%): tchunks
    # 8, dp kept (the sweep's _l2p1 form ties it, and its deterministic form spills); fifth
    # session (->_as): 51.9 -> 50.0 / 51.9 -> 50.1 cold us (+3.7%): APE in shared memory;
    # then (->_asa.._gs) 50.6 -> 49.6 / 50.3 -> 49.8 (+1.4%; with goreuse +1.0%): grad_out by
    # cp.async into shared memory, the APE copy by cp.async too
    (1, 128): BwdSchedule(2, 8, 32, True, False, regwin=True, keeps=True, vsm=True, keepdp=True,
                          apesm=True, gosm=True, apeasync=True),
    # 1x65536: 78.20 -> 59.39 / 78.18 -> 59.44 (+24.0%); 2026-12-01 cold
    # (v2t16x32_fexp_gor_rw ->): 61.6 -> 54.3 / 61.5 -> 54.4 cold us (+11.7%): s kept, and
    # goreuse off (with both, ptxas spills at 128 registers); then 54.8 -> 53.6 / 54.7 ->
    # 53.6 (+2.1%): dp kept; fifth session (->_as): 53.5 -> 50.3 / 53.6 -> 50.3 (+6.1%): APE
    # in shared memory; then (->_gp) 51.2 -> 50.0 / 51.2 -> 49.8 (+2.5%): grad_out kept packed
    (2, 128): BwdSchedule(2, 16, 32, True, False, regwin=True, keeps=True, keepdp=True,
                          apesm=True, gopack=True),
    # 1x65536: 129.84 -> 113.46 / 129.78 -> 113.32 (+12.6%); goreuse off; 2026-12-01 cold
    # (v2t8x32_fexp_rw ->): 115.8 -> 92.0 / 116.3 -> 92.4 cold us (+20.5%): s kept; then
    # 92.1 -> 89.6 / 92.3 -> 89.3 (+3%): dp kept; fifth session (->_as): 90.4 -> 89.3 / 90.6
    # -> 89.5 (+1.3%; 1x8192 +3.9%): APE in shared memory; then (->_asa.._gs) 89.0 -> 87.7 /
    # 89.1 -> 87.6 (+1.6%; 1x8192 +4.7%; with goreuse +0.5%): grad_out by cp.async into shared
    # memory, the APE copy by cp.async too
    (1, 512): BwdSchedule(2, 8, 32, True, False, regwin=True, keeps=True, keepdp=True,
                          apesm=True, gosm=True, apeasync=True),
    # 1x65536: 256.42 -> 223.65 / 256.41 -> 223.72 (+12.8%); 2026-12-01 cold
    # (v2t16x32_fexp_gor_rw ->): 220.3 -> 181.8 / 220.6 -> 181.8 cold us (+17.5%): s kept,
    # goreuse off (with both, ptxas spills at 128 registers); then 182.2 -> 175.9 / 182.2 ->
    # 175.8 (+3.5%; 1x131072: 353.6 -> 339.0 / 353.7 -> 339.2, +4.2%): dp kept; fifth session
    # (->_as), 1x131072: 339.1 -> 329.0 / 339.3 -> 328.9 (+3.0%; 1x8192 +3.9%): APE in shared
    # memory; then (->_gor.._gp) 328.6 -> 315.6 / 327.9 -> 315.5 (+3.9%; 1x8192 +2.2%):
    # grad_out kept packed, its word held for the gradient pass; then (->_asa..)
    # 317.9 -> 313.5 / 317.5 -> 313.2 (+1.4%): the APE copy by cp.async (at c2d128: -0.2% cold,
    # and 8 B of spill on sm_100a, so not there)
    (2, 512): BwdSchedule(2, 16, 32, True, True, regwin=True, keeps=True, keepdp=True,
                          apesm=True, gopack=True, apeasync=True),
}

UPSTREAM_ARCH = "sm_100a"
# The build targets, each with the arch whose tables it selects from: sm_103a (B300/GB300) has
# no measurements of its own and takes the sm_100a (B200) tables.
ARCH_TABLES = {"sm_90a": "sm_90a", "sm_100a": "sm_100a", "sm_103a": "sm_100a"}
ARCHES = tuple(ARCH_TABLES)
TABLE_ARCHES = ("sm_100a", "sm_90a")  # the arches with tables of their own
FWD_TABLES = {
    "sm_100a": {"small": FWD_SMALL, "default": FWD_DEFAULT, "large": FWD_LARGE},
    "sm_90a": {"small": FWD_SMALL_H200, "default": FWD_DEFAULT_H200, "large": FWD_LARGE_H200},
}
BWD_TABLES = {
    "sm_100a": {"small": BWD_SMALL, "default": BWD_DEFAULT},
    "sm_90a": {"small": BWD_SMALL_H200, "default": BWD_DEFAULT_H200},
}


def fwd_bucket(coff: int, d: int, n_rows: int) -> str:
    """The forward bucket of N; which configs have a small/large bucket is the same per arch."""
    if n_rows <= SMALL_NB_MAX and (coff, d) in FWD_SMALL:
        return "small"
    if n_rows >= LARGE_NB_MIN and (coff, d) in FWD_LARGE:
        return "large"
    return "default"


def bwd_bucket(coff: int, d: int, n_rows: int) -> str:
    if n_rows <= BWD_SMALL_NB_MAX and (coff, d) in BWD_SMALL:
        return "small"
    return "default"


def _check_config(coff: int, d: int) -> None:
    if (coff, d) not in CONFIGS:
        raise ValueError(f"ratio=128 is validated for head_dim in {HEAD_DIMS} and coff in "
                         f"{COFFS}; got coff={coff}, head_dim={d}")


def _tables(tables: dict, arch: str) -> dict:
    if arch not in ARCH_TABLES:
        raise ValueError(f"no ratio=128 tables for arch {arch!r}; tables exist for "
                         f"{', '.join(ARCHES)}")
    return tables[ARCH_TABLES[arch]]


def select_fwd(coff: int, d: int, n_rows: int, arch: str = UPSTREAM_ARCH) -> FwdSchedule:
    _check_config(coff, d)
    return _tables(FWD_TABLES, arch)[fwd_bucket(coff, d, n_rows)][(coff, d)]


def select_bwd(coff: int, d: int, n_rows: int, arch: str = UPSTREAM_ARCH) -> BwdSchedule:
    _check_config(coff, d)
    return _tables(BWD_TABLES, arch)[bwd_bucket(coff, d, n_rows)][(coff, d)]


def bucket_probes(direction: str) -> tuple[int, ...]:
    """One N per bucket, derived from the boundaries: the smallest N that selects it."""
    if direction == "fwd":
        return (1, SMALL_NB_MAX + 1, LARGE_NB_MIN)
    if direction == "bwd":
        return (1, BWD_SMALL_NB_MAX + 1)
    raise ValueError(f"direction must be 'fwd' or 'bwd', got {direction!r}")


def selectable(direction: str, arch: str = UPSTREAM_ARCH
               ) -> set[tuple[tuple[int, int], FwdSchedule | BwdSchedule]]:
    """Every ((coff, d), schedule) the arch's tables can select, walked through the buckets."""
    select = select_fwd if direction == "fwd" else select_bwd
    probes = bucket_probes(direction)
    return {((coff, d), select(coff, d, n, arch)) for coff, d in CONFIGS for n in probes}


def selectable_any(direction: str) -> set[tuple[tuple[int, int], FwdSchedule | BwdSchedule]]:
    """The union over every arch's tables: what the build and probe tests must cover."""
    return set().union(*(selectable(direction, arch) for arch in TABLE_ARCHES))


# Backward rows per CTA (docs/KERNELS.md section 2, "rows_per_cta", from the upstream design):
# the staged kernel's resident CTAs per SM, limited by its shared memory (c2: 105 KB tiles) and
# registers; R is capped so a CTA's row loop stays short (1.16 waves measured 1.5x slower than
# one, c2d512 at 65k tokens, which is what the cap's wave fit avoids at large N).
STAGED_CTAS_PER_SM_COFF2 = 2
STAGED_CTAS_PER_SM_COFF1 = 4         # coff=1 with tchunks <= STAGED_NARROW_TCHUNKS
STAGED_CTAS_PER_SM_COFF1_WIDE = 3    # coff=1 with more chunks (tchunks 8)
STAGED_NARROW_TCHUNKS = 4
STAGED_MAX_ROWS_PER_CTA = 16


def rows_per_cta(n_rows: int, d: int, coff: int, sched: BwdSchedule, sm_count: int) -> int:
    """Backward rows per CTA, chosen at launch so the grid fits one resident wave."""
    gy = -(-(d // sched.vec) // sched.threads_x)
    if sched.regwin:
        # The smallest R whose grid fits one wave, rounded per column slice (ceil(N/R)*gy CTAs
        # never exceed the slots), and no cap: a CTA pipelines its rows (only its first fetch
        # is exposed) and fewer CTAs issue fewer dAPE atomics.
        per_sm = max(1, sched.sm_threads // (sched.threads_x * sched.tchunks))
        ctas_per_slice = max(1, per_sm * sm_count // gy)
        return max(1, -(-n_rows // ctas_per_slice))
    if coff == 2:
        per_sm = STAGED_CTAS_PER_SM_COFF2
    elif sched.tchunks <= STAGED_NARROW_TCHUNKS:
        per_sm = STAGED_CTAS_PER_SM_COFF1
    else:
        per_sm = STAGED_CTAS_PER_SM_COFF1_WIDE
    want = -(-(n_rows * gy) // (per_sm * sm_count))
    return max(1, min(STAGED_MAX_ROWS_PER_CTA, want))


# --- ratio=4 -------------------------------------------------------------------------------
# The ratio=4 kernels are the small-ratio family's (kernels/small.py); its schedules live in
# kernels/small_schedule.py. The names below are that module's, under their ratio=4 names.

from csagate.kernels import small_schedule as _small  # noqa: E402  (pure Python too)

MAX_GRID_Y = _small.MAX_GRID_Y
R4_BWD_ROWS = _small.SMALL_BWD_ROWS
R4_BWD_THREADS = _small.SMALL_BWD_THREADS
R4_FWD_THREADS = _small.SMALL_FWD_THREADS
R4_FWD_THREADS_WIDE = _small.SMALL_FWD_THREADS_WIDE
R4_HEAD_DIMS = _small.SMALL_HEAD_DIMS
R4Schedule = _small.SmallSchedule
r4_fwd_schedule = _small.fwd_schedule
r4_fwd_grid_y = _small.fwd_grid_y
R4_RATIO = 4


def r4_schedule(direction: str, d: int) -> R4Schedule:
    """The ratio=4 kernel of a direction for head_dim d (it does not depend on coff)."""
    return _small.small_schedule(direction, d, ratio=R4_RATIO)
