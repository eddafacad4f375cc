"""Schedules of the small-ratio family (kernels/small.py), a power-of-two ratio whose row window
(``ratio * coff`` positions) lives in registers; pure Python. The register budget behind the
limits and the measurements behind the sm_90a forms: docs/KERNELS.md section 4."""

from __future__ import annotations

from dataclasses import dataclass, replace
from math import prod

COFFS = (1, 2)
MAX_WINDOW = 64              # ratio * coff: the largest window a thread holds in registers
FWD_VEC2_MAX_WINDOW = 32     # forward: 2 columns per thread up to here (4 * window registers)
BWD_APE_REGS_MAX_WINDOW = 32  # backward: the APE hoisted in registers up to here
SMALL_FWD_THREADS = 64       # threads per forward CTA when d/vec >= 64
SMALL_FWD_THREADS_WIDE = 128  # used when 64 threads would need gridDim.y > MAX_GRID_Y
MAX_GRID_Y = 65535
SMALL_BWD_ROWS = 32          # most rows per lane of a backward CTA (bwd_rows_per_cta picks)
SMALL_BWD_ROWS_LANES = 64    # ... and per CTA of a form with lanes
SMALL_BWD_ROWS_WIDE = 1      # ... beyond BWD_APE_REGS_MAX_WINDOW: one, compile-time (registers)
BWD_CTAS_PER_SLICE = 512     # bwd_rows_per_cta's CTAs along the rows per 128-column slice
BWD_STAGED_CTAS_PER_SLICE = 256  # ... of a staged form (its lanes hide a row's latency)
BWD_WAVE_FILL = 0.97         # ... a wave: this share of the resident CTAs (a margin below full)
BWD_WAVE_MIN = 0.75          # ... grids of fewer waves keep the aim (latency bounds them)
BWD_CTA_COST = 2             # ... a CTA's own work (APE loads, dAPE sums), in rows per lane
BWD_WAVE_GAIN = 0.12         # ... the least modelled gain that moves the aim (the model is rough)
BWD_KERNEL = "SmallBwdKernel"  # the backward's kernel in its cubin (occupancy.kernel_names)
SMALL_BWD_THREADS = 128      # threads per backward CTA (vec 1: one per head-dim column)
BWD_VECS = (1, 2, 4)         # backward columns per thread
BWD_STAGES = (2, 3)          # backward staged forms: rows of a lane in shared memory at once
BWD_STAGED_SMEM = 48 * 1024  # ... the most bytes of shared memory a staged CTA may take
BWD_VEC_MAX_VALUES = 64      # fp32 values per thread of a vector backward (bwd_values)
BWD_STAGED_MAX_VALUES = 96   # ... of a staged one that re-reads the APE (ape_regs off)
FWD_VECS = (1, 2, 4)         # forward columns per thread
FWD_ROWS = (1, 2)            # forward rows per thread (and CTA), their windows loaded at once
FWD_MAX_VALUES = 128         # fp32 values per forward thread (fwd_values)
# keys_for's representative d: 65 the odd-d vec=1 path, 128 the vec=2 path, 512 the wide head.
SMALL_HEAD_DIMS = (65, 128, 512)


@dataclass(frozen=True)
class SmallSchedule:
    """Compile-time shape; ``rows_per_cta``: forward rows per thread, backward's most per CTA."""

    vec: int
    threads: int
    rows_per_cta: int
    ape_regs: bool = True        # backward only: the APE of the thread's column hoisted
    lanes: int = 1               # backward only: rows a CTA runs side by side (block.y)
    prefetch: bool = False       # backward only: a lane's next row loaded during this one's
    stages: int = 0              # backward only: cp.async shared buffers, stages - 1 rows ahead
    ieee_div: bool = False       # every p_k its own div.rn.f32, no shared reciprocal (the A/B)

    @property
    def tag(self) -> str:
        return (f"v{self.vec}" + (f"r{self.rows_per_cta}" if self.rows_per_cta > 1 else "")
                + (f"l{self.lanes}" if self.lanes > 1 else "")
                + ("" if self.ape_regs else "_ag") + ("p" if self.prefetch else "")
                + (f"s{self.stages}" if self.stages else "")
                + ("_div" if self.ieee_div else ""))

    def astuple(self) -> tuple:
        return (self.vec, self.threads, self.rows_per_cta)


def config_problems(ratio: int, coff: int, d: int) -> list[str]:
    """Why the family cannot serve (ratio, coff, d); [] if it can."""
    out = []
    if ratio < 2 or ratio & (ratio - 1):
        out.append(f"ratio={ratio} is not a power of two >= 2")
    if coff not in COFFS:
        out.append(f"coff must be in {COFFS}, got {coff}")
    if d < 1:
        out.append(f"head_dim must be >= 1, got {d}")
    if ratio * coff > MAX_WINDOW:
        out.append(f"a window of ratio*coff = {ratio * coff} positions exceeds the "
                   f"{MAX_WINDOW} a thread holds in registers")
    if ratio * coff * d % 4:
        out.append(f"ratio*coff*head_dim = {ratio * coff * d} is not a multiple of 4 (dAPE is "
                   "zeroed and reduced in 16-byte vectors): use an even coff*head_dim")
    return out


def check_config(ratio: int, coff: int, d: int) -> None:
    problems = config_problems(ratio, coff, d)
    if problems:
        raise ValueError(f"ratio={ratio} c{coff}d{d}: " + "; ".join(problems))


def fwd_threads(groups: int) -> int:
    """Forward threads per CTA for a row of ``groups`` column groups (grid.y <= 65535)."""
    threads = SMALL_FWD_THREADS if groups >= SMALL_FWD_THREADS else groups
    if -(-groups // threads) > MAX_GRID_Y:
        threads = SMALL_FWD_THREADS_WIDE
    return threads


def fwd_schedule(d: int, window: int = 8) -> tuple[int, int]:
    """Forward ``(vec, threads)``: vec columns per thread, threads per CTA (grid.y <= 65535)."""
    vec = 2 if d % 2 == 0 and window <= FWD_VEC2_MAX_WINDOW else 1
    return vec, fwd_threads(d // vec)


def fwd_grid_y(d: int, window: int = 8) -> int:
    vec, threads = fwd_schedule(d, window)
    return -(-(d // vec) // threads)


def fwd_form(vec: int, rows: int, d: int) -> SmallSchedule:
    """A forward form: ``vec`` columns and ``rows`` rows per thread, all windows loaded at once."""
    return SmallSchedule(vec, fwd_threads(d // vec), rows)


def fwd_values(window: int, vec: int, rows: int) -> int:
    """fp32 values a forward thread keeps: s/e and u per (position, column, row)."""
    return 2 * window * vec * rows


def fwd_schedule_problems(ratio: int, coff: int, d: int, sched: SmallSchedule) -> list[str]:
    """Why the forward cannot build ``sched`` for (ratio, coff, d); [] if it can."""
    out = config_problems(ratio, coff, d)
    vec, rows = sched.vec, sched.rows_per_cta
    if vec not in FWD_VECS:
        out.append(f"forward vec must be in {FWD_VECS}, got {vec}")
    elif d % vec:
        out.append(f"vec {vec} needs head_dim a multiple of it, got {d}")
    if rows not in FWD_ROWS:
        out.append(f"forward rows per CTA must be in {FWD_ROWS}, got {rows}")
    values = fwd_values(ratio * coff, vec, rows)
    if values > FWD_MAX_VALUES:
        out.append(f"vec {vec} with {rows} row(s) at a window of {ratio * coff} keeps "
                   f"{values} fp32 values per thread (more than {FWD_MAX_VALUES})")
    if not sched.ape_regs or sched.lanes != 1 or sched.prefetch or sched.stages:
        out.append("ape_regs, lanes, prefetch and stages are backward fields")
    if not 1 <= sched.threads <= 1024:
        out.append(f"threads must be in [1, 1024], got {sched.threads}")
    return out


def fwd_forms(ratio: int, coff: int, d: int, arch: str | None = None
              ) -> tuple[SmallSchedule, ...]:
    """Vector forward forms beyond ``arch``'s table form (vec 1, for odd d, is never faster)."""
    table = small_schedule("fwd", d, ratio=ratio, coff=coff, arch=arch)
    forms = (fwd_form(v, r, d) for r in FWD_ROWS for v in FWD_VECS if v > 1)
    return tuple(s for s in dict.fromkeys(forms)
                 if s != table and not fwd_schedule_problems(ratio, coff, d, s))


def bwd_values(window: int, vec: int, ape_regs: bool = True) -> int:
    """A backward thread's fp32 values per (position, column): dAPE, s/e/p, u/t, APE if hoisted."""
    return (4 if ape_regs else 3) * window * vec


def bwd_form(vec: int, d: int, window: int, prefetch: bool = False, stages: int = 0
             ) -> SmallSchedule:
    """A backward form of ``vec`` adjacent columns per thread; a vector form runs ``lanes`` rows
    side by side, their dAPE sums merged in shared memory, and staged re-reads the APE (from L1)
    where hoisting would pass ``BWD_VEC_MAX_VALUES``. The forms: docs/KERNELS.md section 4."""
    if vec == 1:
        if window <= BWD_APE_REGS_MAX_WINDOW:
            return SmallSchedule(1, SMALL_BWD_THREADS, SMALL_BWD_ROWS, prefetch=prefetch,
                                 stages=stages)
        return SmallSchedule(1, SMALL_BWD_THREADS, SMALL_BWD_ROWS_WIDE, ape_regs=False,
                             prefetch=prefetch, stages=stages)
    groups = -(-d // vec)
    threads = min(SMALL_BWD_THREADS, -(-groups // 32) * 32)
    lanes = max(1, SMALL_BWD_THREADS // threads)
    ape_regs = not stages or bwd_values(window, vec) <= BWD_VEC_MAX_VALUES
    return SmallSchedule(vec, threads, bwd_most_rows(lanes), ape_regs=ape_regs, lanes=lanes,
                         prefetch=prefetch, stages=stages)


def bwd_most_rows(lanes: int) -> int:
    """The most rows per CTA a backward form of ``lanes`` lanes may take."""
    return min(SMALL_BWD_ROWS * lanes, SMALL_BWD_ROWS_LANES) if lanes > 1 else SMALL_BWD_ROWS


def bwd_schedule_problems(ratio: int, coff: int, d: int, sched: SmallSchedule) -> list[str]:
    """Why the backward cannot build ``sched`` for (ratio, coff, d); [] if it can."""
    out = config_problems(ratio, coff, d)
    vec, window = sched.vec, ratio * coff
    if vec not in BWD_VECS:
        out.append(f"backward vec must be in {BWD_VECS}, got {vec}")
    elif d % vec:
        out.append(f"vec {vec} needs head_dim a multiple of it, got {d}")
    most = BWD_VEC_MAX_VALUES if sched.ape_regs else BWD_STAGED_MAX_VALUES
    values = bwd_values(window, vec, sched.ape_regs)
    if vec > 1 and values > most:
        out.append(f"vec {vec} at a window of {window} keeps {values} fp32 values per thread "
                   f"(more than {most})")
    if vec > 1 and not sched.ape_regs and not sched.stages:
        out.append("a vector backward hoists the APE (ape_regs) unless it is staged")
    if sched.ape_regs and window > BWD_APE_REGS_MAX_WINDOW:
        out.append(f"a window of {window} re-reads the APE (ape_regs off)")
    if sched.prefetch and sched.rows_per_cta == 1:
        out.append("prefetch needs more than one row per CTA")
    if sched.stages:
        if sched.stages not in BWD_STAGES:
            out.append(f"stages must be 0 or in {BWD_STAGES}, got {sched.stages}")
        if vec == 1:
            out.append("a staged form copies 4 or 8 bytes a position (cp.async): vec 2 or 4")
        if sched.prefetch or sched.rows_per_cta == 1:
            out.append("a staged form is not a prefetch form and takes more than one row "
                       "per CTA")
        smem = bwd_launch_shape(sched, window)[1]
        if smem > BWD_STAGED_SMEM:
            out.append(f"{smem} bytes of shared memory (more than {BWD_STAGED_SMEM})")
    if sched.rows_per_cta < sched.lanes:
        out.append(f"{sched.rows_per_cta} rows per CTA for {sched.lanes} lanes")
    if not 1 <= sched.threads * sched.lanes <= 1024:
        out.append(f"threads x lanes must be in [1, 1024], got {sched.threads * sched.lanes}")
    return out


def bwd_forms(ratio: int, coff: int, d: int, arch: str | None = None
              ) -> tuple[SmallSchedule, ...]:
    """The backward forms beyond ``arch``'s table form that (ratio, coff, d) can build."""
    table = small_schedule("bwd", d, ratio=ratio, coff=coff, arch=arch)
    forms = [bwd_form(v, d, ratio * coff, p) for v in BWD_VECS for p in (False, True)]
    forms += [bwd_form(v, d, ratio * coff, stages=s) for v in BWD_VECS if v > 1
              for s in BWD_STAGES]
    return tuple(s for s in dict.fromkeys(forms)
                 if s != table and not bwd_schedule_problems(ratio, coff, d, s))


def bwd_rows_per_cta(n_rows: int, d: int, coff: int, sched: SmallSchedule,
                     sm_count: int = 0, ctas_per_sm: int = 0) -> int:
    """Backward rows per CTA at launch, at most ``sched.rows_per_cta``. The aim: about
    ``BWD_CTAS_PER_SLICE`` CTAs per column slice (staged: ``BWD_STAGED_CTAS_PER_SLICE``), at least
    2 * slices rows a lane; fewer CTAs, fewer dAPE atomics serializing in the L2. An unstaged form
    below ``bwd_most_rows`` keeps its rows; an unstaged grid moves toward whole waves given
    ``ctas_per_sm`` (``occupancy.resident_ctas``). Why: docs/PERF_NOTES.md section 14.8."""
    if sched.rows_per_cta == 1:
        return 1
    slices = bwd_slices(d, sched)
    if sched.rows_per_cta < bwd_most_rows(sched.lanes) and not sched.stages:
        aim = sched.rows_per_cta  # a table form's fixed rows per CTA
    else:
        per_slice = BWD_STAGED_CTAS_PER_SLICE if sched.stages else BWD_CTAS_PER_SLICE
        want = -(-n_rows // (per_slice * slices))
        aim = min(sched.rows_per_cta, max(2 * slices * sched.lanes, want))
    wave = int(BWD_WAVE_FILL * sm_count * ctas_per_sm)

    def ctas(rows: int) -> int:
        return -(-n_rows // rows) * slices
    if sched.stages or wave < 1 or ctas(aim) < BWD_WAVE_MIN * wave:
        return aim

    def cost(rows: int) -> int:
        return -(-ctas(rows) // wave) * (-(-rows // sched.lanes) + BWD_CTA_COST)
    rows = range(max(sched.lanes, -(-aim // 2)), min(sched.rows_per_cta, 2 * aim) + 1)
    pick = min(rows, key=lambda r: (cost(r), -r))
    return pick if cost(pick) <= (1 - BWD_WAVE_GAIN) * cost(aim) else aim


def bwd_slices(d: int, sched: SmallSchedule) -> int:
    """A backward row's column slices of ``threads * vec`` columns: its CTAs across the row."""
    return -(-d // (sched.threads * sched.vec))


def bwd_launch_shape(sched: SmallSchedule, window: int) -> tuple[int, int]:
    """(threads, dynamic shared bytes) of a backward launch: lanes' dAPE merge and stage buffers."""
    merge = (sched.lanes - 1) * window * sched.threads * sched.vec * 4
    staged = sum(-(-prod(shape) * size // 16) * 16
                 for shape, size in bwd_stage_shapes(sched, window))
    return sched.threads * sched.lanes, merge + staged


def bwd_stage_shapes(sched: SmallSchedule, window: int) -> tuple:
    """A staged backward's shared buffers, (shape, bytes per element) each: per stage a row's bf16
    score/kv window and grad_out, int32 segment/block/first token; a thread reads only its own."""
    if not sched.stages:
        return ()
    s, lanes, threads, vec = sched.stages, sched.lanes, sched.threads, sched.vec
    return (((s, 2, window, lanes, threads, vec), 2), ((s, lanes, threads, vec), 2),
            ((s, 3, lanes, threads), 4))


def small_schedule(direction: str, d: int, *, ratio: int = 4, coff: int = 2,
                   arch: str | None = None) -> SmallSchedule:
    """The small-ratio kernel of a direction for (ratio, coff, d) on ``arch`` (None: defaults)."""
    window = ratio * coff
    if direction == "fwd":
        form = _fwd_table_form(ratio, coff, d, arch)
        if form is not None:
            return fwd_form(*form, d)
        vec, threads = fwd_schedule(d, window)
        return SmallSchedule(vec, threads, 1)
    vec = _bwd_table_vec(ratio, coff, d, arch)
    sched = bwd_form(vec, d, window, _bwd_table_prefetch(ratio, coff, d, arch),
                     _bwd_table_stages(ratio, coff, d, arch) if vec > 1 else 0)
    rows = _bwd_table_rows(ratio, coff, d, arch)
    return replace(sched, rows_per_cta=rows * sched.lanes) if rows else sched


# sm_90a forward forms (docs/PERF_NOTES.md section 14.2), d >= 128 and a multiple of 4:
# (ratio, coff, narrow) -> (vec, rows per thread); narrow: d < 256. Else (all coff 2) the defaults.
SM90_FWD_FORMS = {(2, 1, True): (4, 2), (2, 1, False): (4, 1),
                  (4, 1, True): (4, 1), (4, 1, False): (4, 1)}


def _sm90_key(ratio: int, coff: int, d: int, arch: str | None):
    """The sm_90a tables' key, (ratio, coff, narrow); None on another arch or below d = 128."""
    if arch != "sm_90a" or d < 128:
        return None
    return ratio, coff, d // 4 < SMALL_FWD_THREADS


def _fwd_table_form(ratio: int, coff: int, d: int, arch: str | None):
    key = _sm90_key(ratio, coff, d, arch)
    return None if key is None or d % 4 else SM90_FWD_FORMS.get(key)


# The sm_90a backward's vec (docs/PERF_NOTES.md sections 14.5 and 14.7); vec 1 elsewhere.
SM90_BWD_VECS = {(2, 1, True): 4, (2, 1, False): 4, (2, 2, True): 4, (2, 2, False): 4,
                 (4, 1, True): 4, (4, 1, False): 4, (4, 2, True): 2, (4, 2, False): 4,
                 (8, 1, True): 2, (8, 1, False): 2, (8, 2, True): 2, (16, 1, True): 2}
# ... its prefetch forms (section 14.6): the one-column forms of windows of 16 or 32.
SM90_BWD_PREFETCH = frozenset({(8, 2, False), (16, 1, False), (16, 2, True), (16, 2, False),
                               (32, 1, True), (32, 1, False)})
# ... and stages (section 14.6): every vector form is staged.
SM90_BWD_STAGES = {(2, 1, True): 3, (2, 1, False): 3, (2, 2, True): 2, (2, 2, False): 2,
                   (4, 1, True): 2, (4, 1, False): 3, (4, 2, True): 3, (4, 2, False): 2,
                   (8, 1, True): 2, (8, 1, False): 2, (8, 2, True): 2, (16, 1, True): 2}


# ... and the most rows a lane takes, capping the staged aim of bwd_rows_per_cta (section 14.8).
SM90_BWD_ROWS = {(4, 2, False): 16, (2, 2, False): 16, (8, 2, True): 8, (16, 1, True): 8}


def _bwd_table_rows(ratio: int, coff: int, d: int, arch: str | None) -> int:
    """The most rows per lane the sm_90a table gives (ratio, coff, d); 0: the form's."""
    return SM90_BWD_ROWS.get(_sm90_key(ratio, coff, d, arch), 0)


def _bwd_table_stages(ratio: int, coff: int, d: int, arch: str | None) -> int:
    return SM90_BWD_STAGES.get(_sm90_key(ratio, coff, d, arch), 0)


def _bwd_table_prefetch(ratio: int, coff: int, d: int, arch: str | None) -> bool:
    return _sm90_key(ratio, coff, d, arch) in SM90_BWD_PREFETCH


def _bwd_table_vec(ratio: int, coff: int, d: int, arch: str | None) -> int:
    vec = SM90_BWD_VECS.get(_sm90_key(ratio, coff, d, arch), 1)
    return vec if d % vec == 0 else 1


def build_configs(ratio: int) -> tuple[tuple[int, int], ...]:
    """(coff, d) pairs the family builds for ``ratio`` when no d is given."""
    return tuple((c, d) for c in COFFS for d in SMALL_HEAD_DIMS
                 if not config_problems(ratio, c, d))
