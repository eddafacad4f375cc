"""Schedules of the ratio=128 kernels: the target arches, the dispatch tables and buckets, and
the validity rule set (``config_problems``); the small ratios' are kernels/small_schedule.py's.
Pure Python (no cutlass, no torch). Buckets and tables: docs/KERNELS.md section 3.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Callable
from dataclasses import dataclass, fields, replace

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
# regwin: resident threads per SM (.maxntid: 65536 / 512 = 128 registers per thread).
REGWIN_THREADS_PER_SM = 512
# regwin: the longest chunk C (4 registers per position): C = 16 fits 128 registers, 32 spills.
REGWIN_MAX_CHUNK = 16
# Largest forward prefetch ring (slots x columns): a ring of 32 takes 150-200 registers and spills.
PREFETCH_RING_MAX = 16
# The deterministic dAPE reduction's load groups (kernels/reduce.py): slice loads a lane
# issues together.
REDUCE_DEPTHS = (4,)


def config_name(coff: int, d: int) -> str:
    return f"c{coff}d{d}"


class FwdForm(enum.StrEnum):
    """How the forward reduces a chunk: online rescale (two exps, or one), or twophase."""

    ONLINE = "online"
    ONEEXP = "oneexp"
    TWOPHASE = "twophase"


class GradOut(enum.StrEnum):
    """Register window: where the next row's fetched grad_out waits for pass 1."""

    REGS = "regs"      # unpacked to fp32 as loaded
    PACKED = "packed"  # the loaded word (a bf16 pair at vec 2), unpacked where used
    SHARED = "shared"  # a cp.async into a thread-private shared slot (vec 2)


class ApeCopy(enum.StrEnum):
    """Register window: where a row reads its APE values."""

    GLOBAL = "global"  # loaded per row (L1/L2)
    SHARED = "shared"  # copied once per CTA into thread-private shared memory
    ASYNC = "async"    # the same copy by cp.async


GEOMETRY = ("vec", "tchunks", "threads_x")  # the tag's v<vec>t<tchunks>x<threads_x>


def schedule_tag(sched) -> str:
    """The tag: the geometry, then each field off its default (flag, name_value, name<n>)."""
    parts = ["v{}t{}x{}".format(*(getattr(sched, g) for g in GEOMETRY))]
    for f in fields(sched):
        value = getattr(sched, f.name)
        if f.name in GEOMETRY or value == f.default:
            continue
        if isinstance(value, bool):
            parts.append(f.name)
        elif isinstance(value, enum.Enum):
            parts.append(f"{f.name}_{value.value}")
        else:
            parts.append(f"{f.name}{value}")
    return "_".join(parts)


@dataclass(frozen=True)
class FwdSchedule:
    """One r128 forward kernel: vec columns per thread, tchunks window chunks per row."""

    vec: int
    tchunks: int
    threads_x: int
    fastexp: bool = False            # ex2.approx in the chunk loop (the merge stays exact)
    form: FwdForm = FwdForm.ONLINE
    unroll: int = 4                  # runtime-loop unroll of the chunk loop
    prefetch: bool = False           # online forms: the next unroll group's loads in flight

    @property
    def tag(self) -> str:
        return schedule_tag(self)

    def astuple(self) -> tuple:
        """The upstream 5-tuple (vec, tchunks, threads_x, twophase, fastexp)."""
        return (self.vec, self.tchunks, self.threads_x, self.form is FwdForm.TWOPHASE,
                self.fastexp)


@dataclass(frozen=True)
class BwdSchedule:
    """One r128 backward kernel (kernels/r128_bwd.py describes each field's code)."""

    vec: int
    tchunks: int
    threads_x: int
    fastexp: bool = False
    goreuse: bool = False            # grad_out kept for the gradient pass, not reloaded
    regwin: bool = False             # the window in registers, not staged in shared memory
    keepdp: bool = False             # regwin: dp = go * kv kept in fp32 from pass 1
    vsm: bool = False                # regwin: per-row shared values moved as vec-wide vectors
    go: GradOut = GradOut.REGS
    ape: ApeCopy = ApeCopy.GLOBAL

    @property
    def tag(self) -> str:
        return schedule_tag(self)

    def astuple(self) -> tuple:
        """The upstream 5-tuple (vec, tchunks, threads_x, fastexp, goreuse)."""
        return (self.vec, self.tchunks, self.threads_x, self.fastexp, self.goreuse)


def threads_x_for(d: int, vec: int) -> int:
    return 32 if d // vec >= 32 else d // vec


def window(coff: int, ratio: int = RATIO) -> int:
    return coff * ratio


class R128Geometry:
    """The static geometry of one ratio=128 kernel (the kernel classes extend it)."""

    def __init__(self, d: int, coff: int, sched: FwdSchedule | BwdSchedule):
        self.d, self.coff, self.sched = d, coff, sched
        self.vec, self.tchunks, self.threads_x = sched.vec, sched.tchunks, sched.threads_x
        self.width = coff * d  # W: row width of kv, score, ape
        self.win = window(coff)
        self.chunk = self.win // sched.tchunks  # C: window slots per thread
        self.ncols = d // sched.vec  # column groups of a half row
        self.gy = -(-self.ncols // sched.threads_x)  # CTAs across the column groups


def bwd_smem_bytes(coff: int, sched: BwdSchedule, ratio: int = RATIO) -> int:
    """Shared memory of the backward: window tiles (staged) or thread-private dAPE sums and
    copies (regwin), plus the chunk partials, 1/den, S and 64 B slack."""
    cols = sched.threads_x * sched.vec
    win = window(coff, ratio)
    if sched.regwin:
        ape = win * cols * 4 if sched.ape is not ApeCopy.GLOBAL else 0
        go = 2 * sched.threads_x * sched.tchunks * 4 if sched.go is GradOut.SHARED else 0
        return win * cols * 4 + ape + go + 3 * sched.tchunks * cols * 4 + 2 * cols * 4 + 64
    return win * cols * 6 + 3 * sched.tchunks * cols * 4 + 2 * cols * 4 + 64


def fwd_smem_bytes(sched: FwdSchedule) -> int:
    """The forward's merge buffers: (m, den, acc) per chunk and column."""
    return 3 * sched.tchunks * sched.threads_x * sched.vec * 4


# --- the rule set: SPACE, each field's values; NEEDS, where an option may leave its default ---

_BOOL = (False, True)
FWD_SPACE = {"vec": (1, 2, 4), "tchunks": (4, 8, 16), "fastexp": _BOOL,
             "form": tuple(FwdForm), "unroll": (2, 4, 8), "prefetch": _BOOL}
BWD_SPACE = {"vec": (1, 2), "tchunks": (4, 8, 16, 32), "fastexp": _BOOL, "goreuse": _BOOL,
             "regwin": _BOOL, "keepdp": _BOOL, "vsm": _BOOL, "go": tuple(GradOut),
             "ape": tuple(ApeCopy)}


@dataclass(frozen=True)
class Needs:
    """``field`` off its default exists only where ``ok(sched)`` holds (``why`` says so)."""

    field: str
    ok: Callable[[object], bool]
    why: str


FWD_NEEDS = (Needs("prefetch", lambda s: s.form is not FwdForm.TWOPHASE, "an online form"),)
BWD_NEEDS = (
    Needs("keepdp", lambda s: s.regwin, "the register window"),
    Needs("vsm", lambda s: s.regwin, "the register window"),
    Needs("go", lambda s: s.regwin, "the register window"),
    Needs("go", lambda s: s.go is not GradOut.SHARED or (s.vec == 2 and not s.goreuse),
          "vec 2 (a 4-byte cp.async) without goreuse"),
    Needs("ape", lambda s: s.regwin, "the register window"),
)


def _space_needs(sched):
    return (FWD_SPACE, FWD_NEEDS) if isinstance(sched, FwdSchedule) else (BWD_SPACE, BWD_NEEDS)


def _default(sched, name: str):
    return next(f.default for f in fields(sched) if f.name == name)


def option_names(direction: str) -> tuple[str, ...]:
    """The fields a sweep varies one at a time (every field of the space but the geometry)."""
    space = FWD_SPACE if direction == "fwd" else BWD_SPACE
    return tuple(n for n in space if n not in GEOMETRY and n != "regwin")


def restrict(sched):
    """``sched`` with every option whose rule fails reset to its default."""
    for need in _space_needs(sched)[1]:
        if getattr(sched, need.field) != _default(sched, need.field) and not need.ok(sched):
            sched = replace(sched, **{need.field: _default(sched, need.field)})
    return sched


def _rule_problems(coff: int, d: int, sched) -> list[str]:
    space, needs = _space_needs(sched)
    out = [f"{name}={getattr(sched, name)} is not one of {values}"
           for name, values in space.items()
           if name != "tchunks" and getattr(sched, name) not in values]
    if d % sched.vec:
        out.append(f"vec={sched.vec} does not divide head_dim {d}")
    out += [f"{n.field}={getattr(sched, n.field)} needs {n.why}" for n in needs
            if getattr(sched, n.field) != _default(sched, n.field) and not n.ok(sched)]
    return out


def _geometry_problems(coff: int, d: int, sched, ratio: int) -> list[str]:
    win = window(coff, ratio)
    out = []
    if sched.tchunks < 1 or win % sched.tchunks:
        out.append(f"tchunks={sched.tchunks} does not divide the window {win}")
    elif coff == 2 and ratio % (win // sched.tchunks):
        out.append(f"chunk {win // sched.tchunks} straddles the coff=2 half boundary")
    if sched.threads_x < 1 or sched.threads_x * sched.tchunks > MAX_THREADS:
        out.append(f"threads {sched.threads_x}x{sched.tchunks} exceed {MAX_THREADS}")
    if sched.vec >= 1 and sched.threads_x != threads_x_for(d, sched.vec):
        out.append(f"threads_x={sched.threads_x} is not the derived {threads_x_for(d, sched.vec)}")
    return out


def _fwd_problems(coff: int, d: int, sched: FwdSchedule, ratio: int) -> list[str]:
    win = window(coff, ratio)
    if (sched.prefetch and sched.tchunks >= 1 and win % sched.tchunks == 0
            and min(sched.unroll, win // sched.tchunks) * sched.vec > PREFETCH_RING_MAX):
        return [f"prefetch keeps min(unroll, C)*vec > {PREFETCH_RING_MAX} loads live: it spills"]
    return []


def _bwd_problems(coff: int, d: int, sched: BwdSchedule, ratio: int) -> list[str]:
    win = window(coff, ratio)
    threads = sched.threads_x * sched.tchunks
    chunk = win // sched.tchunks if sched.tchunks >= 1 and win % sched.tchunks == 0 else None
    out = []
    if sched.vec >= 1 and (d // sched.vec) % max(sched.threads_x, 1):
        # full column coverage makes every `col < d/vec` predicate statically true
        out.append(f"d/vec={d // sched.vec} is not a multiple of threads_x={sched.threads_x}")
    if sched.vec > sched.tchunks:
        out.append(f"the merge needs vec <= tchunks, got {sched.vec} > {sched.tchunks}")
    if sched.regwin:
        if threads < 1 or REGWIN_THREADS_PER_SM % threads:
            out.append(f"regwin: {threads} threads per CTA do not divide "
                       f"{REGWIN_THREADS_PER_SM} per SM")
        if chunk is not None and chunk > REGWIN_MAX_CHUNK:
            out.append(f"regwin: a chunk of C={chunk} window positions needs 4*C = "
                       f"{4 * chunk} registers > {4 * REGWIN_MAX_CHUNK}")
        if chunk is not None and (chunk * sched.vec) % 4:
            out.append("regwin moves dAPE sums as 4-slot vectors: C*vec must be a multiple of 4")
        if (sched.ape is not ApeCopy.GLOBAL and threads >= 1
                and REGWIN_THREADS_PER_SM % threads == 0):
            # the target stays resident: CTAs per SM x (smem + 1 KB)
            ctas = REGWIN_THREADS_PER_SM // threads
            need = ctas * (bwd_smem_bytes(coff, sched, ratio) + 1024)
            if need > SM_SMEM:
                out.append(f"ape={sched.ape}: {ctas} CTAs per SM need {need} B of shared "
                           f"memory > {SM_SMEM} B")
    if bwd_smem_bytes(coff, sched, ratio) > SMEM_LIMIT:
        out.append(f"shared memory {bwd_smem_bytes(coff, sched, ratio)} B > {SMEM_LIMIT} B")
    return out


def config_problems(coff: int, d: int, sched: FwdSchedule | BwdSchedule,
                    ratio: int = RATIO) -> list[str]:
    """THE statement of the constraint set: why a schedule cannot serve (coff, d); [] if it can."""
    out = _rule_problems(coff, d, sched)
    if out:  # a value outside the space: the limits below may not even be computable
        return out
    out = _geometry_problems(coff, d, sched, ratio)
    if isinstance(sched, FwdSchedule):
        return out + _fwd_problems(coff, d, sched, ratio)
    return out + _bwd_problems(coff, d, sched, ratio)


def schedule_space(direction: str, coff: int, d: int) -> list:
    """Every schedule of the space that serves (coff, d) (``config_problems`` filters)."""
    cls, space = (FwdSchedule, FWD_SPACE) if direction == "fwd" else (BwdSchedule, BWD_SPACE)
    out = []
    for values in itertools.product(*space.values()):
        kw = dict(zip(space, values, strict=True))
        sched = cls(threads_x=threads_x_for(d, kw["vec"]), **kw)
        if not config_problems(coff, d, sched):
            out.append(sched)
    return out


def _fwd(coff: int, d: int, vec: int, tchunks: int, twophase: bool, fastexp: bool) -> FwdSchedule:
    return FwdSchedule(vec, tchunks, threads_x_for(d, vec), fastexp,
                       FwdForm.TWOPHASE if twophase else FwdForm.ONLINE)


def _bwd(coff: int, d: int, vec: int, tchunks: int, fastexp: bool, goreuse: bool) -> BwdSchedule:
    return BwdSchedule(vec, tchunks, threads_x_for(d, vec), fastexp, goreuse)


def _rw(vec: int, tchunks: int, **options) -> BwdSchedule:
    """A register-window entry (d=128 and 512 both give threads_x 32 at vec 1 and 2)."""
    return BwdSchedule(vec, tchunks, 32, fastexp=True, regwin=True, **options)


# --- upstream (B200, sm_100a) tables: docs/KERNELS.md section 6.3 -----------------------

FWD_DEFAULT = {
    (1, 128): _fwd(1, 128, 2, 4, False, False),
    (2, 128): _fwd(2, 128, 2, 8, False, True),
    (1, 512): _fwd(1, 512, 2, 4, False, False),
    (2, 512): _fwd(2, 512, 4, 4, False, False),   # W = 1024 -> vec 4
}
FWD_SMALL = {
    (1, 128): _fwd(1, 128, 2, 8, False, False),
    (2, 128): _fwd(2, 128, 2, 16, False, True),
    (2, 512): _fwd(2, 512, 2, 8, False, True),
}
FWD_LARGE = {
    (1, 128): _fwd(1, 128, 4, 4, True, True),
    (1, 512): _fwd(1, 512, 4, 4, False, True),
    (2, 512): _fwd(2, 512, 4, 4, False, True),
}
BWD_DEFAULT = {
    (1, 128): _bwd(1, 128, 2, 8, True, False),    # goreuse off (it lost at 131k)
    (2, 128): _bwd(2, 128, 2, 8, True, True),
    (1, 512): _bwd(1, 512, 2, 4, True, True),     # tchunks 4 (~25% faster)
    (2, 512): _bwd(2, 512, 2, 8, True, True),
}
BWD_SMALL = {
    (1, 128): _bwd(1, 128, 1, 8, False, True),
    (2, 128): _bwd(2, 128, 1, 8, False, True),
}

# --- H200 (sm_90a) tables: `csagate bench --sweep` + cold A/B (docs/KERNELS.md section 3.2) ---

FWD_SMALL_H200 = {
    (1, 128): FwdSchedule(1, 16, 32, True, unroll=8, prefetch=True),
    (2, 128): FwdSchedule(1, 16, 32, True, FwdForm.ONEEXP, prefetch=True),
    (2, 512): FwdSchedule(2, 16, 32, True, FwdForm.ONEEXP),
}
FWD_DEFAULT_H200 = {
    (1, 128): FwdSchedule(4, 8, 32, False, FwdForm.ONEEXP),
    (2, 128): FwdSchedule(2, 8, 32, True, FwdForm.ONEEXP),
    (1, 512): FwdSchedule(4, 4, 32, True, unroll=8),   # the same kernel as the large bucket
    (2, 512): FwdSchedule(4, 4, 32, False, FwdForm.ONEEXP),
}
FWD_LARGE_H200 = {
    (1, 128): FwdSchedule(4, 4, 32, True, unroll=2, prefetch=True),  # a ring of 2 slots
    (1, 512): FwdSchedule(4, 4, 32, True, unroll=8),
    (2, 512): FwdSchedule(2, 4, 32, True, prefetch=True),
}
BWD_SMALL_H200 = {
    (1, 128): _rw(1, 16, goreuse=True, go=GradOut.PACKED),
    (2, 128): _rw(1, 16, goreuse=True),
}
BWD_DEFAULT_H200 = {
    (1, 128): _rw(2, 8, keepdp=True, vsm=True, go=GradOut.SHARED, ape=ApeCopy.ASYNC),
    # goreuse spills at 128 registers; ape async spills 8 B on sm_100a (PERF_NOTES section 8.2)
    (2, 128): _rw(2, 16, keepdp=True, go=GradOut.PACKED, ape=ApeCopy.SHARED),
    (1, 512): _rw(2, 8, keepdp=True, go=GradOut.SHARED, ape=ApeCopy.ASYNC),
    (2, 512): _rw(2, 16, goreuse=True, keepdp=True, go=GradOut.PACKED, ape=ApeCopy.ASYNC),
}

UPSTREAM_ARCH = "sm_100a"
# Build targets -> the arch whose tables they select (sm_103a has no measurements of its own).
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


def tables(direction: str, arch: str) -> dict[str, dict]:
    """{bucket: {(coff, d): schedule}}: the dispatch tables of a direction on ``arch``."""
    return _tables(FWD_TABLES if direction == "fwd" else BWD_TABLES, arch)


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


# Staged backward rows per CTA (docs/KERNELS.md section 2): resident CTAs per SM, R capped.
STAGED_CTAS_PER_SM_COFF2 = 2
STAGED_CTAS_PER_SM_COFF1 = 4         # coff=1 with tchunks <= STAGED_NARROW_TCHUNKS
STAGED_CTAS_PER_SM_COFF1_WIDE = 3    # coff=1 with more chunks (tchunks 8)
STAGED_NARROW_TCHUNKS = 4
STAGED_MAX_ROWS_PER_CTA = 16


def rows_per_cta(n_rows: int, d: int, coff: int, sched: BwdSchedule, sm_count: int,
                 ctas_per_sm: int = 0) -> int:
    """Backward rows per CTA, chosen at launch so the grid fits one resident wave (its CTAs
    per SM are the schedule's: ``ctas_per_sm``, the family's uniform signature, is unused)."""
    gy = -(-(d // sched.vec) // sched.threads_x)
    if sched.regwin:
        # one wave, no cap: a CTA pipelines its rows, fewer CTAs issue fewer dAPE atomics
        per_sm = max(1, REGWIN_THREADS_PER_SM // (sched.threads_x * sched.tchunks))
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
