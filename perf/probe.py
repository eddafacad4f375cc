"""Register probe: ``ptxas -v`` on the PTX of every kernel, parsed into rows.

For each :class:`KernelKey` the kernel is compiled through the cache (no GPU needed), its
retained PTX is written to a directory and assembled with ``ptxas -v -arch=<arch> -o
/dev/null``; the registers, spill stores/loads and stack frame are parsed from its report
and ``ex2.approx`` is counted in the PTX (the fast-exp buckets use it, and so does the
accurate exp's range-reduced ex2). A kernel is clean when ptxas succeeded and reported 0
spill bytes and a 0-byte stack frame. A kernel whose PTX was not retained is a row that
says so and is not clean: nothing was verified for it. ptxas of one kernel runs while the next
one compiles, and one process assembles the same PTX for the same arch once.

Returns data; never prints.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from csagate.kernels.cache import CACHE, KernelCache
from csagate.kernels.registry import KernelKey

_REGS = re.compile(r"Used (\d+) registers")
_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
_STACK = re.compile(r"(\d+) bytes stack frame")
_EX2 = re.compile(r"ex2\.approx")
DEFAULT_CUDA_HOME = "/usr/local/cuda"


class PtxasNotFound(RuntimeError):
    """No ptxas: not from the wheel, not on PATH, not in $CUDA_HOME/bin or /usr/local/cuda/bin."""


@dataclass(frozen=True)
class ProbeRow:
    tag: str
    kind: str
    schedule: tuple
    arch: str
    regs: int | None
    spill_st: int | None
    spill_ld: int | None
    stack: int | None
    ex2: int | None
    rc: int | None
    clean: bool
    note: str

    @property
    def skipped(self) -> bool:
        return self.rc is None


# The dev extra's ptxas wheel (pyproject.toml): CUDA 12, the major of the DSL's default libs.
PTXAS_WHEEL = "nvidia-cuda-nvcc-cu12"


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def wheel_ptxas() -> str | None:
    """The ptxas of the ``nvidia-cuda-nvcc-cu12`` wheel (``nvidia/cuda_nvcc/bin/ptxas``), if
    that wheel is installed in this environment."""
    from importlib import metadata

    try:
        dist = metadata.distribution(PTXAS_WHEEL)
    except metadata.PackageNotFoundError:
        return None
    for file in dist.files or ():
        if file.name == "ptxas" and file.parent.name == "bin":
            path = Path(dist.locate_file(file))
            if _executable(path):
                return str(path)
    return None


def find_ptxas() -> str:
    """The ptxas to run: the wheel's first, then PATH, then $CUDA_HOME/bin, then
    /usr/local/cuda/bin. The probe and the tests both call this."""
    found = wheel_ptxas() or shutil.which("ptxas")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), DEFAULT_CUDA_HOME):
        if root and _executable(Path(root) / "bin" / "ptxas"):
            return str(Path(root) / "bin" / "ptxas")
    raise PtxasNotFound(f"ptxas not found (no {PTXAS_WHEEL} wheel, not on PATH, not in "
                        "$CUDA_HOME/bin or /usr/local/cuda/bin): `make setup` installs the "
                        f"wheel, or `pip install {PTXAS_WHEEL}`")


def _max_int(pattern: re.Pattern, text: str, group: int = 1) -> int | None:
    values = [int(m.group(group)) for m in pattern.finditer(text)]
    return max(values) if values else None


def parse_ptxas(report: str) -> tuple[int | None, int | None, int | None, int | None]:
    """(registers, spill store bytes, spill load bytes, stack frame bytes) from ``ptxas -v``.

    With several entry points the maximum of each field is taken; None when absent.
    """
    return (_max_int(_REGS, report), _max_int(_SPILL, report, 1), _max_int(_SPILL, report, 2),
            _max_int(_STACK, report))


# The dAPE zeroing kernel a default backward's launcher carries beside the backward itself
# (kernels/device.py: launch_zero_f32); its symbol embeds this function name.
ZERO_KERNEL = "_zero_f32_kernel"
_ENTRY = re.compile(r"^\s*(?:\.visible\s+)?\.entry\s+(\w+)\s*\(", re.M)
_PTXAS_ENTRY = re.compile(r"Compiling entry function '([^']+)'")


def ptx_entries(ptx: str) -> dict[str, str]:
    """``{symbol: text}`` of every ``.entry`` of a PTX module, in order; an entry's text runs
    from its ``.entry`` line to the next one (or the end)."""
    marks = list(_ENTRY.finditer(ptx))
    return {m.group(1): ptx[m.start():marks[i + 1].start() if i + 1 < len(marks) else None]
            for i, m in enumerate(marks)}


def main_entry(ptx: str) -> str:
    """The PTX of a launcher's one compute kernel: every entry except the dAPE zeroing
    kernel's. Raises ValueError unless exactly one such entry exists."""
    main = [text for name, text in ptx_entries(ptx).items() if ZERO_KERNEL not in name]
    if len(main) != 1:
        raise ValueError(f"expected one kernel besides {ZERO_KERNEL}, found {len(main)}")
    return main[0]


def ptxas_entries(report: str) -> dict[str, tuple[int | None, int | None, int | None,
                                                   int | None]]:
    """``{symbol: (registers, spill store bytes, spill load bytes, stack frame bytes)}`` per
    entry function of a ``ptxas -v`` report (None where a field is absent)."""
    parts = _PTXAS_ENTRY.split(report)
    return {parts[i]: parse_ptxas(parts[i + 1]) for i in range(1, len(parts) - 1, 2)}


# (sha256 of the PTX, arch, ptxas) -> (return code, report): ptxas is a pure function of them
_ASSEMBLED: dict[tuple[str, str, str], tuple[int, str]] = {}
_ASSEMBLED_LOCK = threading.Lock()


def assemble(ptx: str, arch: str, ptxas: str | None = None, path: Path | None = None
             ) -> tuple[int, str]:
    """``(return code, report)`` of ``ptxas -v -arch=<arch>`` on ``ptx`` (also written to
    ``path`` when given); ``ptxas`` defaults to :func:`find_ptxas`. The same PTX, arch and
    ptxas give the same report: each is assembled once per process."""
    ptxas = ptxas or find_ptxas()
    if path is not None:
        Path(path).write_text(ptx)
    key = (hashlib.sha256(ptx.encode()).hexdigest(), arch, ptxas)
    with _ASSEMBLED_LOCK:
        found = _ASSEMBLED.get(key)
    if found is not None:
        return found
    with tempfile.TemporaryDirectory(prefix="csagate-ptxas-") as tmp:
        source = Path(tmp) / "kernel.ptx"
        source.write_text(ptx)
        proc = subprocess.run([ptxas, "-v", f"-arch={arch}", str(source), "-o", os.devnull],
                              capture_output=True, text=True)
    found = (proc.returncode, proc.stdout + proc.stderr)
    with _ASSEMBLED_LOCK:
        _ASSEMBLED[key] = found
    return found


def _schedule_tuple(key: KernelKey) -> tuple:
    astuple = getattr(key.schedule, "astuple", None)
    return astuple() if astuple else tuple(key.schedule)


def probe_one(key: KernelKey, out_dir: Path, ptxas: str, cache: KernelCache = CACHE
              ) -> ProbeRow:
    return _row(key, cache.ptx(key), out_dir, ptxas)


def _row(key: KernelKey, ptx: str | None, out_dir: Path, ptxas: str) -> ProbeRow:
    """``key``'s row from its PTX (None: none retained)."""
    sched = _schedule_tuple(key)
    if ptx is None:
        return ProbeRow(key.tag, key.kind, sched, key.arch, None, None, None, None, None, None,
                        False, "skipped: no PTX retained (need CUTE_DSL_KEEP=ptx)")
    rc, report = assemble(ptx, key.arch, ptxas, out_dir / f"{key.tag}.{key.arch}.ptx")
    regs, spill_st, spill_ld, stack = parse_ptxas(report)
    ex2 = len(_EX2.findall(ptx))
    problems = []
    if rc:
        last = report.strip().splitlines()[-1] if report.strip() else ""
        problems.append(f"ptxas rc={rc}: {last}")
    if None in (spill_st, spill_ld, stack):
        problems.append("ptxas -v report not parsed")
    else:
        if spill_st or spill_ld:
            problems.append(f"spills {spill_st}/{spill_ld} B")
        if stack:
            problems.append(f"stack {stack} B")
    return ProbeRow(key.tag, key.kind, sched, key.arch, regs, spill_st, spill_ld, stack, ex2,
                    rc, not problems, "; ".join(problems) or "clean")


def probe(keys: Iterable[KernelKey], *, keep_dir: str | os.PathLike | None = None,
          cache: KernelCache = CACHE,
          progress: Callable[[ProbeRow, int, int], None] | None = None) -> list[ProbeRow]:
    """Probe every key, in order; the PTX files stay in ``keep_dir`` if given.

    Raises :class:`PtxasNotFound` before compiling anything when there is no ptxas.
    """
    ptxas = find_ptxas()
    keys = list(keys)
    rows = []
    with tempfile.TemporaryDirectory(prefix="csagate-probe-") as tmp, \
            ThreadPoolExecutor(max_workers=1) as assembler:
        out_dir = Path(keep_dir) if keep_dir is not None else Path(tmp)
        out_dir.mkdir(parents=True, exist_ok=True)
        pending = []   # ptxas of the kernel before runs while this thread compiles the next

        def finish(future) -> None:
            rows.append(future.result())
            if progress is not None:
                progress(rows[-1], len(rows), len(keys))

        for key in keys:
            pending.append(assembler.submit(_row, key, cache.ptx(key), out_dir, ptxas))
            while len(pending) > 1:
                finish(pending.pop(0))
        for future in pending:
            finish(future)
    return rows


def summary(rows: list[ProbeRow], arch: str) -> tuple[bool, str]:
    """(all clean and nothing skipped, the summary line)."""
    skipped = sum(r.skipped for r in rows)
    failed = [r for r in rows if not r.clean and not r.skipped]
    line = (f"{len(rows)} kernels probed ({arch}); "
            + ("SPILL/STACK OR PTXAS FAILURE DETECTED" if failed else "ALL 0 spill / 0 stack"))
    if skipped:
        line += f"; {skipped} kernel(s) skipped with no PTX -- nothing verified for them"
    return not failed and not skipped and bool(rows), line
