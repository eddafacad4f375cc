"""The one compile cache of the CSA compressor kernels, and the kernel set a ratio can select.

A kernel is named by a frozen :class:`KernelKey` ``(kind, ratio, d, coff, schedule, arch)``;
every field is compile-time. The cache compiles a key on first use (no GPU needed: the DSL
cross-compiles for ``arch``), keeps the compiled function for the life of the process and
records, per entry, the compile seconds and whether a lookup was a hit. Lookups are
lock-free once an entry exists; a miss takes the lock and checks again, so concurrent first
calls compile once.

A first compile while the current CUDA stream is capturing a graph is refused with a
RuntimeError: compiling takes a fraction of a second of host work that a graph would not
replay, so capture must find every kernel it needs already built (``csagate.kernels.api.build()`` or
one eager step).

Importing this module does not import cutlass or torch.
"""

from __future__ import annotations

import importlib
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from csagate.kernels import schedule as sched_tables

KINDS = ("r4fwd", "r4bwd", "r128fwd", "r128bwd")

# ratio=4 supports any head_dim; ``keys_for(4, ...)`` builds a representative set: d=65 is the
# odd-d vec=1 path, d=128 the vec=2 path of the drift check (c2d128), d=512 the wide head
# (vec=2, gridDim.y 4). Each at coff 1 and 2, forward and backward: 12 kernels.
R4_HEAD_DIMS = (65, 128, 512)
R4_COFFS = (1, 2)


@dataclass(frozen=True)
class R4Schedule:
    """The compile-time shape of a ratio=4 kernel (it follows from d alone)."""

    vec: int
    threads: int
    rows_per_cta: int

    @property
    def tag(self) -> str:
        return f"v{self.vec}" + (f"r{self.rows_per_cta}" if self.rows_per_cta > 1 else "")

    def astuple(self) -> tuple:
        return (self.vec, self.threads, self.rows_per_cta)


@dataclass(frozen=True)
class KernelKey:
    kind: str
    ratio: int
    d: int
    coff: int
    schedule: object  # FwdSchedule | BwdSchedule | R4Schedule
    arch: str

    @property
    def direction(self) -> str:
        return "fwd" if self.kind.endswith("fwd") else "bwd"

    @property
    def config(self) -> str:
        return f"c{self.coff}d{self.d}"

    @property
    def tag(self) -> str:
        """``fwd_c1d128_v2t8x32[_2ph][_fexp]``, ``bwd_..._fexp_gor``, ``r4fwd_c2d128_v2``."""
        if self.ratio == 4:
            return f"{self.kind}_{self.config}_{self.schedule.tag}"
        return f"{self.direction}_{self.config}_{self.schedule.tag}"


@dataclass(frozen=True)
class BuildRecord:
    """One entry as a build saw it: the entry's compile seconds, and whether it was cached."""

    key: KernelKey
    seconds: float
    hit: bool


def r4_schedule(direction: str, d: int) -> R4Schedule:
    from csagate.kernels import r4

    if direction == "fwd":
        vec, threads = r4.fwd_schedule(d)
        return R4Schedule(vec, threads, 1)
    return R4Schedule(1, r4.BWD_THREADS, r4.BWD_ROWS)


def make_key(direction: str, ratio: int, coff: int, d: int, sched, arch: str) -> KernelKey:
    return KernelKey(f"r{ratio}{direction}", ratio, d, coff, sched, arch)


def _sort_key(key: KernelKey):
    return (KINDS.index(key.kind), key.d, key.coff, key.tag, key.arch)


def keys_for(ratio: int, arch: str, coff: int | None = None, d: int | None = None
             ) -> list[KernelKey]:
    """Every kernel a configuration can select, sorted; ``coff``/``d`` narrow the set.

    ratio 128: what the dispatch tables can select (``schedule.selectable``), 10 forward +
    6 backward kernels. ratio 4: forward + backward for coff in (1, 2) x d in (65, 128, 512),
    see ``R4_HEAD_DIMS`` (any other ``d`` given explicitly is used as is).
    """
    keys: set[KernelKey] = set()
    if ratio == 128:
        if d is not None and d not in sched_tables.HEAD_DIMS:
            raise ValueError(f"ratio=128 is validated for head_dim in {sched_tables.HEAD_DIMS}, "
                             f"got {d}")
        for direction in ("fwd", "bwd"):
            for (c, hd), sched in sched_tables.selectable(direction, arch):
                if (coff is None or c == coff) and (d is None or hd == d):
                    keys.add(make_key(direction, 128, c, hd, sched, arch))
    elif ratio == 4:
        for c in (R4_COFFS if coff is None else (coff,)):
            for hd in (R4_HEAD_DIMS if d is None else (d,)):
                for direction in ("fwd", "bwd"):
                    keys.add(make_key(direction, 4, c, hd, r4_schedule(direction, hd), arch))
    else:
        raise ValueError(f"kernels are validated for ratio in {{4, 128}} only, got {ratio}")
    return sorted(keys, key=_sort_key)


def compile_key(key: KernelKey):
    """Compile one kernel (no cache); the builders live in the kernel modules."""
    if key.kind == "r4fwd":
        return importlib.import_module("csagate.kernels.r4").build_fwd(
            d=key.d, coff=key.coff, arch=key.arch)
    if key.kind == "r4bwd":
        return importlib.import_module("csagate.kernels.r4").build_bwd(
            d=key.d, coff=key.coff, arch=key.arch)
    if key.kind == "r128fwd":
        return importlib.import_module("csagate.kernels.r128_fwd").build_fwd(
            d=key.d, coff=key.coff, sched=key.schedule, arch=key.arch)
    if key.kind == "r128bwd":
        return importlib.import_module("csagate.kernels.r128_bwd").build_bwd(
            d=key.d, coff=key.coff, sched=key.schedule, arch=key.arch)
    raise ValueError(f"unknown kernel kind {key.kind!r}; expected one of {KINDS}")


def _capturing() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


@dataclass
class _Entry:
    fn: object
    seconds: float
    hits: int = 0
    executors: dict = field(default_factory=dict)  # device index -> JitExecutor


class KernelCache:
    """Compiled kernels by :class:`KernelKey`; thread-safe, compile-once."""

    def __init__(self, compiler: Callable[[KernelKey], object] = compile_key):
        self._compile = compiler
        self._entries: dict[KernelKey, _Entry] = {}
        self._lock = threading.RLock()
        self._misses = 0

    def _entry(self, key: KernelKey) -> tuple[_Entry, bool]:
        entry = self._entries.get(key)
        if entry is not None:
            return entry, True
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                return entry, True
            if _capturing():
                raise RuntimeError(
                    f"first call for config {key.tag} ({key.arch}) under CUDA graph capture: "
                    "compiling cannot be captured; call csagate.kernels.api.build() or run one "
                    "eager step before capturing")
            t0 = time.perf_counter()
            fn = self._compile(key)
            entry = _Entry(fn, time.perf_counter() - t0)
            self._entries[key] = entry
            self._misses += 1
            return entry, False

    def get(self, key: KernelKey):
        """The compiled function of ``key``, compiling it on first use."""
        entry, hit = self._entry(key)
        if hit:
            entry.hits += 1  # a statistic: a lost increment under a race is harmless
        return entry.fn

    def executor(self, key: KernelKey, device_index: int):
        """``key``'s function bound to one CUDA device (the DSL binds a plain call to the first
        device it runs on; an executor per device keeps multi-device launches correct)."""
        entry, hit = self._entry(key)
        if hit:
            entry.hits += 1
        ex = entry.executors.get(device_index)
        if ex is None:
            with self._lock:
                ex = entry.executors.get(device_index)
                if ex is None:
                    if _capturing():  # loading a module is no stream work a graph can hold
                        raise RuntimeError(
                            f"first call for config {key.tag} on cuda:{device_index} under "
                            "CUDA graph capture: the kernel is compiled but not loaded on "
                            "this device; call csagate.kernels.api.build() or run one eager step "
                            "before capturing")
                    ex = entry.fn.to(device_index)
                    entry.executors[device_index] = ex
        return ex

    def build(self, keys: Iterable[KernelKey],
              progress: Callable[[BuildRecord, int, int], None] | None = None
              ) -> list[BuildRecord]:
        """Compile every key not yet cached; ``progress(record, i, n)`` after each one."""
        keys = list(keys)
        records = []
        for i, key in enumerate(keys):
            entry, hit = self._entry(key)
            if hit:
                entry.hits += 1
            record = BuildRecord(key, entry.seconds, hit)
            records.append(record)
            if progress is not None:
                progress(record, i + 1, len(keys))
        return records

    def contains(self, key: KernelKey) -> bool:
        return key in self._entries

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._misses = 0

    def stats(self) -> dict:
        entries = dict(self._entries)
        return {
            "entries": len(entries),
            "hits": sum(e.hits for e in entries.values()),
            "misses": self._misses,
            "compile_seconds": sum(e.seconds for e in entries.values()),
            "per_entry": {k.tag + "@" + k.arch: {"seconds": e.seconds, "hits": e.hits}
                          for k, e in sorted(entries.items(), key=lambda kv: _sort_key(kv[0]))},
        }


CACHE = KernelCache()


def get(key: KernelKey):
    return CACHE.get(key)


def build(keys: Iterable[KernelKey], progress=None) -> list[BuildRecord]:
    return CACHE.build(keys, progress=progress)


def clear() -> None:
    CACHE.clear()


def stats() -> dict:
    return CACHE.stats()
