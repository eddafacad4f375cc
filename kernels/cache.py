"""The one compile cache of the CSA compressor kernels: compiled functions by typed key
(``registry.KernelKey``, ``registry.ReduceKey``), compiled once per process (lock-free hits,
a miss locks and checks again), backed by the disk cache (kernels/diskcache.py). A first
compile under CUDA graph capture is refused. Design: docs/KERNELS.md section 5.3. Importing
this module imports neither cutlass nor torch.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from csagate.kernels.registry import KernelKey, ReduceKey, sort_keys


@dataclass(frozen=True)
class BuildRecord:
    """One entry as a build saw it: the entry's compile seconds, and whether it was cached."""

    key: KernelKey
    seconds: float
    hit: bool


def compile_key(key: KernelKey | ReduceKey):
    """Compile one kernel (no cache) through its family module, or kernels/reduce.py."""
    return key.build()


def _capturing() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


@dataclass
class _Entry:
    fn: object
    seconds: float
    hits: int = 0
    ptx: str | None = None  # the PTX text, for an entry loaded from the disk cache
    loaded: set = field(default_factory=set)  # device indices the module is loaded on
    resident: dict = field(default_factory=dict)  # device index -> resident CTAs per SM
    resident_error: str = ""  # why the driver could not say (then the rule keeps its aim)


class KernelCache:
    """Compiled kernels by :class:`KernelKey`; thread-safe, compile-once."""

    def __init__(self, compiler: Callable[[KernelKey], object] = compile_key, disk=None):
        self._compile = compiler
        self._disk = disk  # a diskcache.DiskCache: compiled kernels that outlive the process
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
            if self._disk is not None:
                fn, ptx, record = self._disk.get(disk_key(key), lambda: self._compile(key))
                entry = _Entry(fn, time.perf_counter() - t0, ptx=ptx or None)
                self._entries[key] = entry
                if record.hit:  # loaded from disk: a true cache hit, nothing compiled
                    return entry, True
                self._misses += 1
                return entry, False
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
        """``key``'s function for a launch on one CUDA device (loaded there on first use)."""
        entry, hit = self._entry(key)
        if hit:
            entry.hits += 1
        if device_index not in entry.loaded:
            if _capturing():
                raise RuntimeError(
                    f"first call for config {key.tag} on cuda:{device_index} under CUDA "
                    "graph capture: the kernel is compiled but not loaded on this device; "
                    "call csagate.kernels.api.build() or run one eager step before capturing")
            family = getattr(key, "family", None)
            if family is not None and family.launch_shape is not None:
                entry.resident[device_index] = self._resident(key, entry, device_index,
                                                              *family.launch_shape(key))
            entry.loaded.add(device_index)
        return entry.fn

    def resident_ctas(self, key: KernelKey, device_index: int) -> int:
        """CTAs of ``key``'s kernel resident per SM of device ``device_index``, as the driver
        computed them when the kernel was loaded there (``executor``); 0: unknown, or a family
        without a ``launch_shape``."""
        entry = self._entries.get(key)
        return entry.resident.get(device_index, 0) if entry is not None else 0

    def _resident(self, key: KernelKey, entry: _Entry, device_index: int, threads: int,
                  smem: int, kernel: str) -> int:
        """The driver's resident CTAs per SM of device ``device_index`` for the cubin kernel
        named ``*kernel*`` inside ``key``'s object file (the disk cache's entry, else
        exported); 0, with the reason kept in ``entry.resident_error``, when it cannot say."""
        from csagate.kernels import occupancy
        from csagate.kernels.diskcache import export_object

        try:
            obj = self._disk.object_bytes(disk_key(key)) if self._disk is not None else None
            cubin = occupancy.embedded_cubin(obj if obj is not None else export_object(entry.fn))
            names = [n for n in occupancy.kernel_names(cubin or b"") if kernel in n]
            if len(names) != 1:
                entry.resident_error = f"{len(names)} kernels named *{kernel}* in the cubin"
                return 0
            got = occupancy.resident_ctas(cubin, names[0], threads, smem, device_index)
            entry.resident_error = "" if got else "the driver counts 0 resident CTAs"
            return got
        except Exception as exc:  # the rule then keeps its aim: slower, never wrong
            entry.resident_error = f"{type(exc).__name__}: {exc}"
            return 0

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

    def ptx(self, key: KernelKey) -> str | None:
        """The PTX text of ``key``'s kernel (compiling or loading it first), None if none."""
        from csagate.kernels import _dsl

        entry, _ = self._entry(key)
        return entry.ptx if entry.ptx is not None else _dsl.ptx_of(entry.fn)

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
            "per_entry": {k.tag + "@" + k.arch: {"seconds": entries[k].seconds,
                                                 "hits": entries[k].hits}
                          for k in sort_keys(entries)},
        }


def disk_key(key: KernelKey | ReduceKey) -> dict:
    """The disk cache's key of a kernel: the compile key's fields and the sources' hash."""
    from csagate.kernels import diskcache

    family, direction, fields = key.disk_fields()
    return diskcache.make_key(family=family, direction=direction, fields=fields,
                              arch=key.arch, options="--enable-tvm-ffi",
                              sources=_kernel_sources())


@functools.cache
def _kernel_sources() -> str:
    from csagate.kernels import diskcache

    return diskcache.source_hash(diskcache.package_sources(Path(__file__).parent))


def default_disk_cache():
    """The per-user disk cache, or None when ``CSAGATE_DISK_CACHE=0`` turns it off."""
    from csagate.kernels.env import disk_cache

    if not disk_cache():
        return None
    from csagate.kernels import diskcache

    return diskcache.DiskCache()


CACHE = KernelCache(disk=default_disk_cache())
