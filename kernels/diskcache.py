"""A compile cache on disk for the TVM-FFI kernels: one verified file per kernel (the exported
object file, then its PTX), loaded back as a ``tvm_ffi.Function``; the folder, entry and key
rules and the entry format: docs/KERNELS.md section 5.3.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

MAGIC = b"CSAGKRN1"
FORMAT = 1
EXPORT_NAME = "func"
_SUFFIX = ".cso"
_HDR_MAX = 1 << 20
MAX_BYTES = 256 << 20   # the automatic bound: 256 MiB of entries ...
MAX_ENTRIES = 1000      # ... and at most this many (a full build of every arch is ~100)


class CacheUnsafe(RuntimeError):
    """The cache folder fails the ownership/permission rules."""


class CacheWarning(UserWarning):
    """The disk cache is off for this process (the reason in the message)."""


class BadEntry(Exception):
    """An entry that must not be loaded (reason in the message)."""


# --- keys ----------------------------------------------------------------------------


def source_hash(paths) -> str:
    """sha256 over (relative name, size, bytes) of the given source files, sorted."""
    h = hashlib.sha256()
    files = sorted(Path(p) for p in paths)
    for p in files:
        data = p.read_bytes()
        h.update(p.name.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
    return h.hexdigest()


def package_sources(pkg_dir) -> list[Path]:
    """Every .py file of a kernels package (any change there invalidates every entry)."""
    return sorted(Path(pkg_dir).glob("*.py"))


def _dist_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "absent"


_TOOLCHAIN = None


def toolchain() -> dict:
    """What, besides our sources and the compile key, changes the binary or its loading."""
    global _TOOLCHAIN
    if _TOOLCHAIN is None:
        dists = ("nvidia-cutlass-dsl", "nvidia-cutlass-dsl-libs-base",
                 "nvidia-cutlass-dsl-libs-core", "nvidia-cutlass-dsl-libs-cu12",
                 "nvidia-cutlass-dsl-libs-cu13", "cuda-bindings", "apache-tvm-ffi")
        tc = {d: _dist_version(d) for d in dists}
        tc["python"] = f"{sys.implementation.name}-{sys.version_info[0]}.{sys.version_info[1]}"
        tc["machine"] = os.uname().machine
        try:  # the DSL's own compile-affecting CUTE_DSL_* settings (its cache key string)
            from csagate.kernels._dsl import cute_modules

            cute_modules()  # cutlass is imported through _dsl (environment first)
            from cutlass.cutlass_dsl.cutlass import CuTeDSL

            tc["dsl_env"] = CuTeDSL._get_dsl().envar.cache_key_str()
        except Exception as exc:  # pragma: no cover - internal API moved
            tc["dsl_env"] = f"unknown:{type(exc).__name__}"
        loaded = sys.modules.get("cutlass._mlir._mlir_libs._cutlass_ir")
        tc["dsl_ir_lib"] = os.path.basename(getattr(loaded, "__file__", "") or "")
        _TOOLCHAIN = tc
    return dict(_TOOLCHAIN)


def make_key(*, family: str, direction: str, fields: dict, arch: str, options: str,
             sources: str) -> dict:
    """The full key of one kernel; ``fields`` holds d, coff and the schedule's fields."""
    return {"format": FORMAT, "family": family, "direction": direction,
            "fields": {k: fields[k] for k in sorted(fields)}, "arch": arch,
            "options": options, "sources": sources, "toolchain": toolchain()}


def key_digest(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:40]


# --- the folder ------------------------------------------------------------------------


def default_root() -> Path:
    env = os.environ.get("CSAGATE_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg) / "csagate"
    return Path.home() / ".cache" / "csagate"


def default_ptx_dir() -> Path:
    """Where kernels/_dsl.py has the DSL dump PTX (a ``CUTE_DSL_DUMP_DIR`` of the user's own
    is theirs: never counted or cleared)."""
    from csagate.kernels._dsl import cache_root

    return cache_root() / "ptx"


def _check_dir(path: Path) -> None:
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise CacheUnsafe(f"{path} is not a directory (a symlink or file)")
    if st.st_uid != os.getuid():
        raise CacheUnsafe(f"{path} belongs to uid {st.st_uid}, not to the current user "
                          f"(uid {os.getuid()})")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise CacheUnsafe(f"{path} is writable by group or others "
                          f"(mode {stat.S_IMODE(st.st_mode):o})")


def _ensure_private_dir(path: Path) -> None:
    try:
        os.mkdir(path, 0o700)
        os.chmod(path, 0o700)  # mkdir's mode is masked by the umask; make it exact
    except FileExistsError:
        pass
    _check_dir(path)


def _write_probe(directory: Path) -> None:
    """Create and remove one temp file in ``directory`` (OSError when it cannot be written:
    permission bits do not tell, root bypasses them)."""
    fd, tmp = tempfile.mkstemp(prefix=".probe-", dir=directory)
    os.close(fd)
    os.unlink(tmp)


def write_problem(directory: Path) -> str | None:
    """Why no file can be created in the existing folder ``directory`` (or None)."""
    try:
        _write_probe(Path(directory))
    except OSError as exc:
        return f"{directory} is not writable ({exc.strerror or type(exc).__name__})"
    return None


def root_problem(root: Path) -> str | None:
    """Why ``root`` cannot hold the cache (or None); leaves nothing behind (an existing folder
    is probed with a temp file that is removed again)."""
    root = Path(root)
    for path in (root, root / "kernels"):
        if os.path.lexists(path):
            try:
                _check_dir(path)
            except CacheUnsafe as exc:
                return str(exc)
            problem = write_problem(path)
            if problem:
                return problem
    if os.path.lexists(root):
        return None
    parent = root.parent
    while not os.path.lexists(parent) and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        return f"{parent} is not a directory, so {root} cannot be created"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{root} cannot be created ({parent} is not writable)"
    return None


# --- the cache -----------------------------------------------------------------------


@dataclass
class Record:
    digest: str
    hit: bool
    seconds: float      # compile + export (miss) or load (hit)
    reason: str = ""    # why a miss was a miss: absent, corrupt, foreign owner, ...


class DiskCache:
    """Compiled kernels on disk; ``get(key, build)`` returns ``(fn, ptx, Record)``."""

    def __init__(self, root: Path | str | None = None, *, loader=None,
                 ptx_dir: Path | str | None = None):
        self.root = Path(root) if root is not None else default_root()
        self.dir = self.root / "kernels"
        # the compiler's PTX dumps (kernels/_dsl.py): ROOT/ptx, or where the DSL keeps them
        self.ptx_dir = Path(ptx_dir) if ptx_dir is not None else (
            self.root / "ptx" if root is not None else default_ptx_dir())
        self._loader = loader or load_object
        self._lock = threading.Lock()
        self._usable = None
        self.records: list[Record] = []

    # folder
    def usable(self) -> bool:
        """Whether the folder passes the rules (checked once per process)."""
        if self._usable is None:
            try:
                self.root.parent.mkdir(parents=True, exist_ok=True)
                _ensure_private_dir(self.root)
                _ensure_private_dir(self.dir)
                self._usable = True
            except (CacheUnsafe, OSError) as exc:
                why = exc if isinstance(exc, CacheUnsafe) else (exc.strerror or exc)
                warnings.warn(f"kernel cache disabled: {why} (kernels compile in memory; see "
                              "`csagate cache info`)", CacheWarning, stacklevel=3)
                self._usable = False
        return self._usable

    def path_of(self, key: dict) -> Path:
        return self.dir / (key_digest(key) + _SUFFIX)

    # read
    def _read(self, path: Path, key: dict) -> tuple[bytes, str, dict]:
        """Verified (object bytes, ptx, header) of an entry, or BadEntry."""
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            raise BadEntry("absent") from None
        except OSError as exc:  # ELOOP: a symlink
            raise BadEntry(f"unopenable ({exc.strerror})") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise BadEntry("not a regular file")
            if st.st_uid != os.getuid():
                raise BadEntry(f"owned by uid {st.st_uid}")
            if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                raise BadEntry(f"writable by group/others (mode {stat.S_IMODE(st.st_mode):o})")
            with os.fdopen(fd, "rb", closefd=False) as fh:
                blob = fh.read()
        finally:
            os.close(fd)
        if len(blob) < 12 or blob[:8] != MAGIC:
            raise BadEntry("corrupt (magic)")
        n = int.from_bytes(blob[8:12], "little")
        if n > _HDR_MAX or 12 + n > len(blob):
            raise BadEntry("truncated (header)")
        try:
            hdr = json.loads(blob[12:12 + n])
        except ValueError:
            raise BadEntry("corrupt (header)") from None
        body = blob[12 + n:]
        if not isinstance(hdr, dict) or hdr.get("format") != FORMAT:
            raise BadEntry("other format")
        if hdr.get("key") != key:
            raise BadEntry("key mismatch")
        olen, plen = hdr.get("payload_len"), hdr.get("ptx_len")
        if not isinstance(olen, int) or not isinstance(plen, int) or len(body) != olen + plen:
            raise BadEntry("truncated (payload)")
        if hashlib.sha256(body).hexdigest() != hdr.get("payload_sha256"):
            raise BadEntry("corrupt (checksum)")
        return body[:olen], body[olen:].decode(), hdr

    # write
    def _write(self, path: Path, key: dict, obj: bytes, ptx: str, compile_s: float) -> None:
        ptx_b = (ptx or "").encode()
        body = obj + ptx_b
        hdr = json.dumps({"format": FORMAT, "key": key, "function": EXPORT_NAME,
                          "payload_len": len(obj), "ptx_len": len(ptx_b),
                          "payload_sha256": hashlib.sha256(body).hexdigest(),
                          "compile_s": round(compile_s, 3), "created": time.time()},
                         sort_keys=True).encode()
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=_SUFFIX, dir=self.dir)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(MAGIC + len(hdr).to_bytes(4, "little") + hdr + body)
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp, 0o600)
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise

    # the one entry point
    def get(self, key: dict, build):
        """``build()`` is called on a miss; returns ``(fn, ptx, Record)``, ``fn`` loaded from
        the entry's bytes."""
        digest = key_digest(key)
        if not self.usable():
            t0 = time.perf_counter()
            fn = build()
            rec = Record(digest, False, time.perf_counter() - t0, "cache disabled")
            self.records.append(rec)
            return fn, _ptx_of(fn), rec
        path = self.dir / (digest + _SUFFIX)
        t0 = time.perf_counter()
        try:
            obj, ptx, _ = self._read(path, key)
            fn = self._loader(obj)
            _touch(path)
            rec = Record(digest, True, time.perf_counter() - t0)
            self.records.append(rec)
            return fn, ptx, rec
        except BadEntry as exc:
            reason = str(exc)
        with self._lock:
            t0 = time.perf_counter()
            compiled = build()
            obj = export_object(compiled)
            ptx = _ptx_of(compiled)
            seconds = time.perf_counter() - t0
            self._write(path, key, obj, ptx, seconds)
            self.prune(MAX_BYTES, MAX_ENTRIES, keep=path)
            fn = self._loader(obj)
        rec = Record(digest, False, seconds, reason)
        self.records.append(rec)
        return fn, ptx, rec

    def object_bytes(self, key: dict) -> bytes | None:
        """The verified object file of ``key``'s entry, or None (no usable entry)."""
        if not self.usable():
            return None
        try:
            return self._read(self.path_of(key), key)[0]
        except BadEntry:
            return None

    # maintenance
    def _entries(self) -> list[Path]:
        if not self.dir.is_dir():
            return []
        return sorted(p for p in self.dir.glob("*" + _SUFFIX) if not p.name.startswith("."))

    def _ptx_files(self) -> list[Path]:
        """The compiler's PTX dumps (regular files, not symlinks) under ``ptx_dir``."""
        if not self.ptx_dir.is_dir() or self.ptx_dir.is_symlink():
            return []
        return sorted(p for p in self.ptx_dir.rglob("*") if p.is_file() and not p.is_symlink())

    def info(self) -> dict:
        """Where the cache is, whether it can be used, what it holds (creates nothing)."""
        problem = root_problem(self.root)
        entries = self._entries() if problem is None else []
        ptx = self._ptx_files()
        return {"root": str(self.root), "exists": self.dir.is_dir(), "usable": problem is None,
                "problem": problem, "entries": len(entries),
                "bytes": sum(p.stat().st_size for p in entries),
                "ptx_dir": str(self.ptx_dir), "ptx_files": len(ptx),
                "ptx_bytes": sum(p.stat().st_size for p in ptx),
                "max_bytes": MAX_BYTES, "max_entries": MAX_ENTRIES}

    def prune(self, max_bytes: int = MAX_BYTES, max_entries: int = MAX_ENTRIES, *,
              keep: Path | None = None) -> tuple[int, int]:
        """Remove the least recently used entries (``keep`` stays) down to the bounds; returns
        (entries removed, bytes freed)."""
        if root_problem(self.root) is not None or not self.dir.is_dir():
            return 0, 0
        stats = []
        for p in self._entries():
            try:
                st = p.stat()
            except FileNotFoundError:  # another process pruned it
                continue
            stats.append((st.st_mtime, st.st_size, p))
        stats.sort(key=lambda e: (e[2] == keep, e[0]), reverse=True)  # newest (and keep) first
        total, kept, removed, freed = 0, 0, 0, 0
        for _, size, p in stats:
            if p == keep or (kept < max_entries and total + size <= max_bytes):
                total, kept = total + size, kept + 1
                continue
            p.unlink(missing_ok=True)
            removed, freed = removed + 1, freed + size
        return removed, freed

    def clear(self) -> int:
        """Remove our entries, stale temp files and the PTX dumps; returns how many files
        were removed."""
        n = 0
        if self.dir.is_dir():
            _check_dir(self.dir)
            for p in self._entries() + sorted(self.dir.glob(".tmp-*")):
                p.unlink(missing_ok=True)
                n += 1
        for p in self._ptx_files():
            p.unlink(missing_ok=True)
            n += 1
        return n


def _touch(path: Path) -> None:
    """Mark an entry used now (its mtime orders pruning); a read-only cache just skips it."""
    try:
        os.utime(path, follow_symlinks=False)
    except OSError:
        pass


# --- DSL glue (nvidia-cutlass-dsl 4.8.1) ----------------------------------------------


def export_object(compiled) -> bytes:
    """The object file of a TVM-FFI compiled function (``export_to_c``), as bytes."""
    fd, tmp = tempfile.mkstemp(suffix=".o")
    os.close(fd)
    try:
        compiled.export_to_c(tmp, function_name=EXPORT_NAME)
        return Path(tmp).read_bytes()
    finally:
        os.unlink(tmp)


_RUNTIME_LIBS = []


def load_object(obj: bytes):
    """A ``tvm_ffi.Function`` from verified object-file bytes (the DSL's ``load_module`` path)."""
    import ctypes

    import cutlass.cute.export  # noqa: F401  (sets ExternalBinaryModule.load_provider)
    from cutlass.base_dsl.export.external_binary_module import ExternalBinaryModule
    from cutlass.runtime import find_runtime_libraries

    if not _RUNTIME_LIBS:
        for p in find_runtime_libraries(enable_tvm_ffi=True):
            if os.path.exists(p):
                _RUNTIME_LIBS.append(ctypes.CDLL(p))
    mod = ExternalBinaryModule.__new__(ExternalBinaryModule)
    mod.enable_tvm_ffi = True
    provider = ExternalBinaryModule.load_provider
    shared_libs = provider.dsl._get_dsl().get_shared_libs()
    mod.engine = provider.execution_engine_constructor(obj, shared_libs, True)
    return mod[EXPORT_NAME]


def _ptx_of(compiled) -> str:
    ptx = getattr(compiled, "__ptx__", None)
    if not ptx:
        return ""
    if isinstance(ptx, bytes):
        ptx = ptx.decode()
    if "\n" not in ptx and os.path.isfile(ptx):
        return Path(ptx).read_text()
    return ptx
