"""Schedules of the small-ratio family (kernels/small.py): a power-of-two ratio whose whole
window (``ratio * coff`` positions) of a row lives in registers (the ratios served:
``registry.SMALL_RATIOS``). Pure Python; the schedule
follows from (ratio, coff, d) and the arch, the backward's rows per CTA from N at launch. The
register budget behind the limits below and the H200 measurements behind the sm_90a forms:
docs/KERNELS.md section 4.
"""

from __future__ import annotations

from dataclasses import dataclass

COFFS = (1, 2)
MAX_WINDOW = 64              # ratio * coff: the largest window a thread holds in registers
FWD_VEC2_MAX_WINDOW = 32     # forward: 2 columns per thread up to here (4 * window registers)
BWD_APE_REGS_MAX_WINDOW = 32  # backward: the APE hoisted in registers up to here
SMALL_FWD_THREADS = 64       # threads per forward CTA when d/vec >= 64
SMALL_FWD_THREADS_WIDE = 128  # used when 64 threads would need gridDim.y > MAX_GRID_Y
MAX_GRID_Y = 65535
SMALL_BWD_ROWS = 32          # most rows per backward CTA (the launch picks: bwd_rows_per_cta)
SMALL_BWD_ROWS_WIDE = 1      # ... beyond BWD_APE_REGS_MAX_WINDOW: one, compile-time (registers)
BWD_CTAS_PER_SLICE = 512     # bwd_rows_per_cta's CTAs along the rows per 128-column slice
SMALL_BWD_THREADS = 128      # one thread per head-dim column
FWD_VECS = (1, 2, 4)         # forward columns per thread
FWD_ROWS = (1, 2)            # forward rows per thread (and CTA), their windows loaded at once
FWD_MAX_VALUES = 128         # fp32 values per forward thread (fwd_values)
# keys_for's representative d: 65 the odd-d vec=1 path, 128 the vec=2 path, 512 the wide head.
SMALL_HEAD_DIMS = (65, 128, 512)


@dataclass(frozen=True)
class SmallSchedule:
    """The compile-time shape of a small-ratio kernel: the forward's ``rows_per_cta`` rows per
    thread (and CTA), the backward's the most rows per CTA a launch may take."""

    vec: int
    threads: int
    rows_per_cta: int
    ape_regs: bool = True        # backward only: the APE of the thread's column hoisted

    @property
    def tag(self) -> str:
        return (f"v{self.vec}" + (f"r{self.rows_per_cta}" if self.rows_per_cta > 1 else "")
                + ("" if self.ape_regs else "_ag"))

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
        # dAPE is zeroed and reduced in 16-byte vectors: ratio*coff*d must be a multiple of 4.
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
    """A forward form: ``vec`` columns per thread, ``rows`` rows per thread (and per CTA)
    whose windows are all loaded before their arithmetic."""
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
    if not sched.ape_regs:
        out.append("ape_regs is a backward field")
    if not 1 <= sched.threads <= 1024:
        out.append(f"threads must be in [1, 1024], got {sched.threads}")
    return out


def fwd_forms(ratio: int, coff: int, d: int) -> tuple[SmallSchedule, ...]:
    """The vector forward forms beyond the table's that (ratio, coff, d) can build (vec 1 is
    the odd-d form, never a faster one)."""
    table = small_schedule("fwd", d, ratio=ratio, coff=coff)
    forms = (fwd_form(v, r, d) for r in FWD_ROWS for v in FWD_VECS if v > 1)
    return tuple(s for s in dict.fromkeys(forms)
                 if s != table and not fwd_schedule_problems(ratio, coff, d, s))


def bwd_rows_per_cta(n_rows: int, d: int, coff: int, sched: SmallSchedule,
                     sm_count: int = 0) -> int:
    """Backward rows per CTA, chosen at launch (at most ``sched.rows_per_cta``): about
    ``BWD_CTAS_PER_SLICE`` CTAs along the rows for every 128-column slice, at least
    ``2 * slices`` rows. Fewer CTAs issue fewer dAPE atomics onto the same addresses, which
    serialize in the L2; more slices spread them over more addresses. The H200 cold sweep behind
    the constants: docs/PERF_NOTES.md section 14.2. ``sm_count``: the uniform signature."""
    if sched.rows_per_cta == 1:
        return 1
    slices = -(-d // sched.threads)
    want = -(-n_rows // (BWD_CTAS_PER_SLICE * slices))
    return max(1, min(sched.rows_per_cta, max(2 * slices, want)))


def small_schedule(direction: str, d: int, *, ratio: int = 4, coff: int = 2,
                   arch: str | None = None) -> SmallSchedule:
    """The small-ratio kernel of a direction for (ratio, coff, head_dim) on ``arch`` (None:
    the arch-independent defaults)."""
    window = ratio * coff
    if direction == "fwd":
        form = _fwd_table_form(ratio, coff, d, arch)
        if form is not None:
            return fwd_form(*form, d)
        vec, threads = fwd_schedule(d, window)
        return SmallSchedule(vec, threads, 1)
    if window <= BWD_APE_REGS_MAX_WINDOW:
        return SmallSchedule(1, SMALL_BWD_THREADS, SMALL_BWD_ROWS)
    return SmallSchedule(1, SMALL_BWD_THREADS, SMALL_BWD_ROWS_WIDE, ape_regs=False)


# The forward forms the H200 cold A/B chose on sm_90a (docs/PERF_NOTES.md section 14.2), for
# d >= 128 and a multiple of 4: (ratio, coff, narrow) -> (vec, rows per thread), narrow: a row
# of fewer than SMALL_FWD_THREADS vec-4 groups (d < 256). Elsewhere the defaults hold.
SM90_FWD_FORMS = {(2, 1, True): (4, 2), (2, 1, False): (4, 1), (2, 2, False): (4, 1),
                  (4, 1, True): (4, 1), (4, 1, False): (4, 1)}


def _fwd_table_form(ratio: int, coff: int, d: int, arch: str | None):
    if arch != "sm_90a" or d < 128 or d % 4:
        return None
    return SM90_FWD_FORMS.get((ratio, coff, d // 4 < SMALL_FWD_THREADS))


def build_configs(ratio: int) -> tuple[tuple[int, int], ...]:
    """(coff, d) pairs the family builds for ``ratio`` when no d is given."""
    return tuple((c, d) for c in COFFS for d in SMALL_HEAD_DIMS
                 if not config_problems(ratio, c, d))
