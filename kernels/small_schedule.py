"""Schedules of the small-ratio family (kernels/small.py): every power-of-two ratio whose whole
window (``ratio * coff`` positions) of a row lives in registers. Pure Python; the schedule
follows from (ratio, d) alone. The register budget behind the limits below: docs/KERNELS.md
section 4.
"""

from __future__ import annotations

from dataclasses import dataclass

SMALL_RATIOS = (2, 4, 8, 16, 32)
COFFS = (1, 2)
MAX_WINDOW = 64              # ratio * coff: the largest window a thread holds in registers
FWD_VEC2_MAX_WINDOW = 32     # forward: 2 columns per thread up to here (4 * window registers)
BWD_APE_REGS_MAX_WINDOW = 32  # backward: the APE hoisted in registers up to here
SMALL_FWD_THREADS = 64       # threads per forward CTA when d/vec >= 64
SMALL_FWD_THREADS_WIDE = 128  # used when 64 threads would need gridDim.y > MAX_GRID_Y
MAX_GRID_Y = 65535
SMALL_BWD_ROWS = 8           # rows per backward CTA (compile-time)
SMALL_BWD_ROWS_WIDE = 1      # ... beyond BWD_APE_REGS_MAX_WINDOW (the register budget)
SMALL_BWD_THREADS = 128      # one thread per head-dim column
FWD_VECS = (1, 2, 4)         # forward columns per thread
FWD_ROWS = (1, 2, 4)         # forward rows per thread (and CTA), their windows loaded at once
FWD_MAX_VALUES = 128         # fp32 values per forward thread (fwd_values)
BWD_VECS = (1, 2, 4)         # backward columns per thread (vec > 1: the vector form)
BWD_ROWS_IN_FLIGHT = (1, 2)  # backward rows whose windows are loaded before their arithmetic
BWD_FORM_MAX_VALUES = 128    # fp32 values per thread (bwd_values) of a vector/in-flight form
# keys_for's representative d: 65 the odd-d vec=1 path, 128 the vec=2 path, 512 the wide head.
SMALL_HEAD_DIMS = (65, 128, 512)


@dataclass(frozen=True)
class SmallSchedule:
    """The compile-time shape of a small-ratio kernel (it follows from ratio and d)."""

    vec: int
    threads: int
    rows_per_cta: int
    deterministic: bool = False  # backward only: dAPE partials stored per CTA (BwdSchedule)
    ape_regs: bool = True        # backward only: the APE of the thread's column hoisted
    rows_in_flight: int = 1      # backward only: rows whose windows are loaded together

    @property
    def tag(self) -> str:
        return (f"v{self.vec}" + (f"r{self.rows_per_cta}" if self.rows_per_cta > 1 else "")
                + (f"f{self.rows_in_flight}" if self.rows_in_flight > 1 else "")
                + ("" if self.ape_regs else "_ag") + ("_det" if self.deterministic else ""))

    def astuple(self) -> tuple:
        return (self.vec, self.threads, self.rows_per_cta)


def config_problems(ratio: int, coff: int, d: int) -> list[str]:
    """Why the family cannot serve (ratio, coff, d); [] if it can."""
    out = []
    if ratio not in SMALL_RATIOS:
        out.append(f"ratio={ratio} is not a small ratio {SMALL_RATIOS}")
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
    if sched.deterministic or not sched.ape_regs or sched.rows_in_flight != 1:
        out.append("deterministic, ape_regs and rows_in_flight are backward fields")
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


def bwd_form(vec: int, ratio: int, coff: int, rows_in_flight: int = 1) -> SmallSchedule:
    """A backward form beyond the table: ``vec`` columns per thread with 128 // vec threads
    (128 columns per CTA, as the scalar form), the scalar form's rows per CTA (so every CTA
    sums the same rows into its dAPE partials), ``rows_in_flight`` rows' windows loaded
    together. Not in the table: ``small_schedule`` picks vec 1, one row at a time."""
    base = small_schedule("bwd", 128, ratio=ratio, coff=coff)
    return SmallSchedule(vec, SMALL_BWD_THREADS // vec, base.rows_per_cta, False,
                         base.ape_regs, rows_in_flight)


def bwd_values(window: int, vec: int, rows_in_flight: int) -> int:
    """fp32 values a backward thread keeps: APE and dAPE partial per (position, column), s/e/p
    and u/t per row in flight."""
    return (2 + 2 * rows_in_flight) * window * vec


def bwd_schedule_problems(ratio: int, coff: int, d: int, sched: SmallSchedule) -> list[str]:
    """Why the backward cannot build ``sched`` for (ratio, coff, d); [] if it can."""
    out = config_problems(ratio, coff, d)
    window, vec, flight = ratio * coff, sched.vec, sched.rows_in_flight
    if vec not in BWD_VECS:
        out.append(f"backward vec must be in {BWD_VECS}, got {vec}")
    elif d % vec:
        out.append(f"vec {vec} needs head_dim a multiple of it, got {d}")
    if flight not in BWD_ROWS_IN_FLIGHT:
        out.append(f"rows_in_flight must be in {BWD_ROWS_IN_FLIGHT}, got {flight}")
    elif sched.rows_per_cta % flight:
        out.append(f"rows_per_cta {sched.rows_per_cta} is not a multiple of rows_in_flight")
    if (vec, flight) != (1, 1):
        values = bwd_values(window, vec, flight)
        if values > BWD_FORM_MAX_VALUES:
            out.append(f"vec {vec} with {flight} row(s) in flight at a window of {window} "
                       f"keeps {values} fp32 values per thread (more than "
                       f"{BWD_FORM_MAX_VALUES})")
        if not sched.ape_regs:
            out.append("vec > 1 and rows in flight hoist the APE (ape_regs)")
    if not 32 <= sched.threads <= 1024 or sched.threads % 32:
        out.append(f"threads must be a multiple of 32 in [32, 1024], got {sched.threads}")
    if sched.rows_per_cta < 1:
        out.append(f"rows_per_cta must be >= 1, got {sched.rows_per_cta}")
    return out


def bwd_forms(ratio: int, coff: int, d: int) -> tuple[SmallSchedule, ...]:
    """The backward forms beyond the table's scalar one that (ratio, coff, d) can build:
    vec 1/2/4 with one or two rows in flight, the table's (vec 1, one row) excepted."""
    forms = (bwd_form(v, ratio, coff, f) for f in BWD_ROWS_IN_FLIGHT for v in BWD_VECS
             if (v, f) != (1, 1))
    return tuple(s for s in forms if not bwd_schedule_problems(ratio, coff, d, s))


def small_schedule(direction: str, d: int, *, ratio: int = 4, coff: int = 2) -> SmallSchedule:
    """The small-ratio kernel of a direction for (ratio, coff, head_dim)."""
    window = ratio * coff
    if direction == "fwd":
        vec, threads = fwd_schedule(d, window)
        return SmallSchedule(vec, threads, 1)
    if window <= BWD_APE_REGS_MAX_WINDOW:
        return SmallSchedule(1, SMALL_BWD_THREADS, SMALL_BWD_ROWS)
    return SmallSchedule(1, SMALL_BWD_THREADS, SMALL_BWD_ROWS_WIDE, ape_regs=False)


def build_configs(ratio: int) -> tuple[tuple[int, int], ...]:
    """(coff, d) pairs the family builds for ``ratio`` when no d is given."""
    return tuple((c, d) for c in COFFS for d in SMALL_HEAD_DIMS
                 if not config_problems(ratio, c, d))
