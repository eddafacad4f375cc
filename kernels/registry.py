"""The kernel families (:data:`FAMILIES`: (ratio, direction) -> build, launch, schedules,
dispatch), the compile keys and the one list of the ratios served (a new ratio goes here and in
gates/cases.py). Pure Python: kernel modules are imported when a kernel is built or launched."""

from __future__ import annotations

import dataclasses
import functools
import importlib
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from csagate.kernels import schedule as S
from csagate.kernels import small_schedule as SS

DIRECTIONS = ("fwd", "bwd")
COFFS = S.COFFS  # both families serve coff 1 and 2
# The ratios served: the table family (buckets by N) and the small-ratio family (no buckets).
TABLE_RATIO = S.RATIO
SMALL_RATIOS = (2, 4, 8, 16, 32)
REDUCE_DEPTHS = S.REDUCE_DEPTHS


@dataclass(frozen=True)
class KernelKey:
    """Everything compile-time about one kernel (the compile cache's key)."""

    ratio: int
    direction: str
    d: int
    coff: int
    schedule: object  # FwdSchedule | BwdSchedule | SmallSchedule: a table's entry
    arch: str
    # backward mode: dAPE partials per CTA summed in a fixed order (ReduceKey), not fp32 atomics
    deterministic: bool = False

    def __post_init__(self):
        if (self.ratio, self.direction) not in FAMILIES:
            family(self.ratio, self.direction)  # raises, naming what is wrong
        if self.deterministic and self.direction != "bwd":
            raise ValueError("deterministic is a backward mode (dAPE partials), got "
                             f"direction={self.direction!r}")

    @property
    def kind(self) -> str:
        """``r4fwd``, ``r128bwd``, ...: the family, as the probe and build tables name it."""
        return f"r{self.ratio}{self.direction}"

    @property
    def config(self) -> str:
        return S.config_name(self.coff, self.d)

    @property
    def family(self) -> Family:
        return FAMILIES[self.ratio, self.direction]  # checked when the key was made

    @property
    def tag(self) -> str:
        """The family, the config and the schedule's tag, ``_deterministic`` for that mode."""
        return (f"{self.family.tag_prefix(self)}_{self.config}_{self.schedule.tag}"
                + ("_deterministic" if self.deterministic else ""))

    def build(self):
        """Compile this kernel (no cache, no GPU needed)."""
        return self.family.build(self)

    def disk_fields(self) -> tuple[str, str, dict]:
        """(family, direction, fields) of the disk cache's key."""
        fields = {"d": self.d, "coff": self.coff, "deterministic": self.deterministic}
        fields.update({f"sched.{k}": v for k, v in dataclasses.asdict(self.schedule).items()})
        return f"r{self.ratio}", self.direction, fields


def make_key(direction: str, ratio: int, coff: int, d: int, sched, arch: str,
             deterministic: bool = False) -> KernelKey:
    return KernelKey(ratio, direction, d, coff, sched, arch, deterministic)


@dataclass(frozen=True)
class ReduceKey:
    """The deterministic backward's dAPE reduction (kernels/reduce.py); ``split``: two-pass."""

    arch: str
    depths: tuple[int, ...] = REDUCE_DEPTHS
    split: bool = False

    @property
    def kind(self) -> str:
        return "reduce"

    @property
    def tag(self) -> str:
        return ("reduce_dape_g" + "x".join(str(d) for d in self.depths)
                + ("_split" if self.split else ""))

    def build(self):
        from csagate.kernels import reduce

        return reduce.build_reduce(self.arch, self.depths, self.split)

    def disk_fields(self) -> tuple[str, str, dict]:
        return "reduce", "dape", {"depths": list(self.depths), "split": self.split}


@dataclass(frozen=True)
class Family:
    """One kernel family: a ratio and a direction."""

    ratio: int
    direction: str
    module: str                     # the kernel module, imported on first build or launch
    head_dims: tuple[int, ...] | None  # validated head dims; None: any d >= 1
    build_dims: tuple[int, ...]     # the head dims ``keys_for`` builds when d is not given
    select: Callable[[int, int, int, str], object]  # (coff, d, n_rows, arch) -> schedule
    selectable: Callable[[str], set]  # arch -> {((coff, d), schedule)} over build_dims
    tag_prefix: Callable[[KernelKey], str]
    takes_rows_per_cta: bool = False  # the launch has a rows_per_cta argument
    # (n_rows, d, coff, schedule, sm_count, ctas_per_sm (0: unknown)) -> default rows per CTA
    rows_per_cta: Callable[..., int] | None = None
    # key -> (threads per CTA, dynamic shared bytes, cubin kernel name), to ask the driver for
    # rows_per_cta's ctas_per_sm when the kernel loads (cache.py, occupancy.py); None: not asked
    launch_shape: Callable[[KernelKey], tuple[int, int, str]] | None = None
    # schedule -> the most rows per CTA a launch may take (None: no bound)
    max_rows_per_cta: Callable[[object], int] | None = None
    takes_ratio: bool = False       # the build has a ratio argument (one module, many ratios)
    check_config: Callable[[int, int], None] | None = None  # (coff, d): ValueError if refused
    # the compiled function takes the segment search's depth (bits of B) after the tensors
    takes_segment_bits: bool = False
    # arch -> {bucket: {(coff, d): schedule}}: the dispatch tables; None: no buckets
    tables: Callable[[str], dict] | None = None

    def _fn(self, verb: str):
        return getattr(importlib.import_module(self.module), f"{verb}_{self.direction}")

    def build(self, key: KernelKey):
        """Compile ``key`` (no cache, no GPU needed)."""
        extra = {"ratio": key.ratio} if self.takes_ratio else {}
        if self.direction == "bwd":
            extra["deterministic"] = key.deterministic
        return self._fn("build")(d=key.d, coff=key.coff, sched=key.schedule, arch=key.arch,
                                 **extra)

    def launch(self, fn, key: KernelKey, **tensors) -> None:
        """Launch the compiled ``fn`` of ``key`` on torch tensors (no validation)."""
        self._fn("launch")(fn, sched=key.schedule, **tensors)

    def check_head_dim(self, d: int) -> None:
        if self.head_dims is not None and d not in self.head_dims:
            raise ValueError(f"ratio={self.ratio} is validated for head_dim in "
                             f"{self.head_dims}, got head_dim={d}")

    def check_shape(self, coff: int, d: int) -> None:
        """ValueError unless the family serves (coff, d) (head dims, and its own rules)."""
        self.check_head_dim(d)
        if self.check_config is not None:
            self.check_config(coff, d)

    def configs(self, coff: int | None = None, d: int | None = None) -> list[tuple[int, int]]:
        """(coff, d) pairs to build: the given ones, else every coff x build dim served."""
        if d is not None:
            self.check_head_dim(d)
            if coff is not None and self.check_config is not None:
                self.check_config(coff, d)
        pairs = [(c, hd) for c in (COFFS if coff is None else (coff,))
                 for hd in (self.build_dims if d is None else (d,))]
        if self.check_config is None or (coff is not None and d is not None):
            return pairs
        return [(c, hd) for c, hd in pairs if _serves(self.check_config, c, hd)]

    def keys(self, arch: str, coff: int | None = None, d: int | None = None) -> set[KernelKey]:
        """Every kernel the configuration can select on ``arch``."""
        configs = set(self.configs(coff, d))
        if d is not None and d not in self.build_dims:  # any d: its own schedule
            return {make_key(self.direction, self.ratio, c, hd,
                             self.select(c, hd, 1, arch), arch) for c, hd in configs}
        return {make_key(self.direction, self.ratio, c, hd, sched, arch)
                for (c, hd), sched in self.selectable(arch) if (c, hd) in configs}


def _serves(check: Callable[[int, int], None], coff: int, d: int) -> bool:
    try:
        check(coff, d)
    except ValueError:
        return False
    return True


def _small(ratio: int, direction: str) -> Family:
    """One ratio of the small-ratio family (kernels/small.py): no buckets."""
    def select(coff, d, n_rows, arch):
        return SS.small_schedule(direction, d, ratio=ratio, coff=coff, arch=arch)

    return Family(
        ratio=ratio, direction=direction, module="csagate.kernels.small", head_dims=None,
        build_dims=SS.SMALL_HEAD_DIMS, select=select,
        selectable=lambda arch: {((c, d), select(c, d, 1, arch))
                                 for c, d in SS.build_configs(ratio)},
        tag_prefix=lambda key: key.kind, takes_ratio=True, takes_segment_bits=True,
        takes_rows_per_cta=direction == "bwd", rows_per_cta=SS.bwd_rows_per_cta,
        max_rows_per_cta=lambda sched: sched.rows_per_cta,
        launch_shape=None if direction == "fwd" else lambda key: (
            *SS.bwd_launch_shape(key.schedule, key.ratio * key.coff), SS.BWD_KERNEL),
        check_config=lambda coff, d: SS.check_config(ratio, coff, d))


def _r128(direction: str) -> Family:
    return Family(
        ratio=S.RATIO, direction=direction, module=f"csagate.kernels.r128_{direction}",
        head_dims=S.HEAD_DIMS, build_dims=S.HEAD_DIMS,
        select=S.select_fwd if direction == "fwd" else S.select_bwd,
        selectable=lambda arch: S.selectable(direction, arch),
        tag_prefix=lambda key: key.direction, takes_rows_per_cta=direction == "bwd",
        rows_per_cta=S.rows_per_cta, tables=lambda arch: S.tables(direction, arch))


# In build and report order: ratio=4 (the production small ratio), 128, the other small ratios.
_ORDER = (4, TABLE_RATIO, *(r for r in SMALL_RATIOS if r != 4))
FAMILIES: dict[tuple[int, str], Family] = {
    (f.ratio, f.direction): f
    for ratio in _ORDER for direction in DIRECTIONS
    for f in ((_r128 if ratio == TABLE_RATIO else functools.partial(_small, ratio))(direction),)}
RATIOS = tuple(dict.fromkeys(ratio for ratio, _ in FAMILIES))


def check_ratio(ratio) -> None:
    """ValueError unless ``ratio`` is an int some family serves (the message lists them)."""
    if isinstance(ratio, bool) or not isinstance(ratio, numbers.Integral):
        raise ValueError(f"ratio must be an int, one of {sorted(RATIOS)}, got "
                         f"{type(ratio).__name__} {ratio!r}")
    if ratio not in RATIOS:
        raise ValueError(f"ratio must be one of {sorted(RATIOS)}, got {ratio}")


def family(ratio: int, direction: str) -> Family:
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be 'fwd' or 'bwd', got {direction!r}")
    check_ratio(ratio)
    if (ratio, direction) not in FAMILIES:
        raise ValueError(f"ratio={ratio} has no {direction} kernel")
    return FAMILIES[ratio, direction]


def has_tables(ratio: int) -> bool:
    """Whether the ratio's kernels come from dispatch tables with buckets by N."""
    return family(ratio, "fwd").tables is not None


def tables(ratio: int, direction: str, arch: str) -> dict[str, dict]:
    """{bucket: {(coff, d): schedule}} of the ratio's dispatch tables on ``arch``; {} if none."""
    fam = family(ratio, direction)
    return fam.tables(arch) if fam.tables is not None else {}


def entries(ratio: int, direction: str, arch: str,
            configs: Sequence[tuple[int, int]] | None = None
            ) -> dict[tuple[str, int, int], KernelKey]:
    """(bucket, coff, d) -> every kernel the dispatch selects on ``arch`` (``any``: no tables)."""
    fam = family(ratio, direction)
    if fam.tables is not None:
        return {(bucket, coff, d): make_key(direction, ratio, coff, d, sched, arch)
                for bucket, table in fam.tables(arch).items()
                for (coff, d), sched in table.items()
                if configs is None or (coff, d) in configs}
    return {("any", coff, d): make_key(direction, ratio, coff, d,
                                       fam.select(coff, d, 1, arch), arch)
            for coff, d in (fam.configs() if configs is None else configs)}


def config_label(ratio: int, config: str) -> str:
    """A config as the reports name it: bare at the table ratio, ``r4 c1d128`` otherwise."""
    return config if ratio == TABLE_RATIO else f"r{ratio} {config}"


def parse_shape(spec: str) -> tuple[int, int, int]:
    """``cCOFFdD:TOKENS`` (``c1d128:8192``) as (coff, d, tokens); ValueError naming the spec."""
    try:
        cfg, tokens = spec.split(":")
        coff, d = (int(x) for x in cfg.removeprefix("c").split("d"))
        shape = (coff, d, int(tokens))
    except ValueError:
        raise ValueError(f"{spec!r} is not cCOFFdD:TOKENS") from None
    if not cfg.startswith("c") or min(shape) < 1:
        raise ValueError(f"{spec!r} is not cCOFFdD:TOKENS")
    return shape


def _sort_key(key: KernelKey | ReduceKey):
    if isinstance(key, ReduceKey):
        return (len(FAMILIES), 0, 0, key.tag, key.arch)
    return (list(FAMILIES).index((key.ratio, key.direction)), key.d, key.coff, key.tag,
            key.arch)


def keys_for(ratio: int, arch: str, coff: int | None = None, d: int | None = None
             ) -> list[KernelKey]:
    """Every kernel a configuration can select, sorted; ``coff``/``d`` narrow the set."""
    keys: set[KernelKey] = set()
    for direction in DIRECTIONS:
        keys |= family(ratio, direction).keys(arch, coff, d)
    return sorted(keys, key=_sort_key)


def sort_keys(keys) -> list[KernelKey]:
    """Keys in build and report order (family, d, coff, tag, arch)."""
    return sorted(keys, key=_sort_key)
