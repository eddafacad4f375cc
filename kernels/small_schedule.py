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

    @property
    def tag(self) -> str:
        return (f"v{self.vec}" + (f"r{self.rows_per_cta}" if self.rows_per_cta > 1 else "")
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


def fwd_schedule(d: int, window: int = 8) -> tuple[int, int]:
    """Forward ``(vec, threads)``: vec columns per thread, threads per CTA (grid.y <= 65535)."""
    vec = 2 if d % 2 == 0 and window <= FWD_VEC2_MAX_WINDOW else 1
    groups = d // vec
    threads = SMALL_FWD_THREADS if groups >= SMALL_FWD_THREADS else groups
    if -(-groups // threads) > MAX_GRID_Y:
        threads = SMALL_FWD_THREADS_WIDE
    return vec, threads


def fwd_grid_y(d: int, window: int = 8) -> int:
    vec, threads = fwd_schedule(d, window)
    return -(-(d // vec) // threads)


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
