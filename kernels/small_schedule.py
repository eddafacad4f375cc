"""Schedules of the small-ratio family (kernels/small.py): every power-of-two ratio whose whole
window (``ratio * coff`` positions) of a row lives in registers.

Pure Python (no cutlass, no torch). The schedule follows from (ratio, d) alone; every field is
compile-time and part of the JIT key. The ratio=4 schedules are the production ratio=4 kernels'
(their PTX is pinned: the drift check's anchor), so no field takes another value at ratio 4.

Register budget (``ptxas -v``, 0 spill and 0 stack on sm_90a, sm_100a and sm_103a; the build
tests and ``csagate probe`` check every shipped kernel). One forward thread keeps
``2 * window * vec`` fp32 values (s then e, and u, per position and column); one backward
thread ``4 * window`` (APE, the dAPE partial, s/e/p, u/t) with the APE hoisted, plus the
addresses ptxas keeps from the loads to the stores: measured on sm_90a, a backward window of 32
(ratio 16 at coff 2) takes 228-242 registers, one of 64 (ratio 32 at coff 2) 255 with 36-508 B
of spill. A thread may use 255 registers, so beyond ``BWD_APE_REGS_MAX_WINDOW`` the backward
re-reads the APE (an L1 hit, the same value) and runs one row per CTA (``SMALL_BWD_ROWS_WIDE``:
its dAPE partial is the row's ds, so ptxas keeps no running sum): 235-255 registers, 0 spill on
the three arches. The forward takes vec 1 beyond ``FWD_VEC2_MAX_WINDOW`` (168 registers at a
window of 64, vec 1; 168 at a window of 32, vec 2). A window of 128 (ratio 64 at coff 2)
would hold 256 fp32 values of s and u alone per thread, more than 255 registers: ratio 64 is
not served here.
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
# keys_for(ratio, ...) builds a representative set: d=65 is the odd-d vec=1 path, d=128 the
# vec=2 path of the drift check (c2d128 at ratio 4), d=512 the wide head (gridDim.y 4). Each
# at coff 1 and 2 (ratio 2: coff 2 only at d=65, see ``config_problems``), forward and
# backward. Any other d >= 1 is served as well.
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
        # dAPE (ratio, coff*d) fp32 is zeroed and (deterministic mode) reduced in 16-byte
        # vectors: its element count must be a multiple of 4 (ratio 2 with odd coff*d).
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
