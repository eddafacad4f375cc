"""The one place that imports the CuTe DSL, through :func:`cute_modules`: the DSL reads its
``CUTE_DSL_*`` variables at first import. PTX is always kept (the register probe reads it)."""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile
from pathlib import Path

from csagate.kernels.schedule import ARCHES  # the build targets, with their tables


def cache_root() -> Path:
    """Where csagate keeps compiler by-products (PTX dumps); ``CSAGATE_CACHE_DIR`` overrides."""
    root = os.environ.get("CSAGATE_CACHE_DIR")
    if root:
        return Path(root)
    return Path(tempfile.gettempdir()) / f"csagate-{os.getuid()}"


_DUMP_OWNER = "CSAGATE_PTX_DUMP_PID"   # the process whose PTX dump folder CUTE_DSL_DUMP_DIR is


def _prepare_env() -> None:
    keep = os.environ.get("CUTE_DSL_KEEP", "")
    if "ptx" not in keep.split(","):
        os.environ["CUTE_DSL_KEEP"] = ",".join(p for p in (keep, "ptx") if p)
    # a CUTE_DSL_DUMP_DIR this function set in a parent process is the parent's: make our own
    inherited = os.environ.get(_DUMP_OWNER, str(os.getpid())) != str(os.getpid())
    if "CUTE_DSL_DUMP_DIR" not in os.environ or inherited:
        root = cache_root()
        root.parent.mkdir(parents=True, exist_ok=True)
        try:  # private (0700): compiled kernels are loaded from the disk cache under it
            os.mkdir(root, 0o700)
        except FileExistsError:
            pass
        # one per process (dumps are named by kernel: a shared one mixes processes' PTX)
        dump = root / "ptx" / f"pid{os.getpid()}"
        dump.mkdir(parents=True, exist_ok=True)
        atexit.register(shutil.rmtree, dump, ignore_errors=True)
        os.environ["CUTE_DSL_DUMP_DIR"] = str(dump)
        os.environ[_DUMP_OWNER] = str(os.getpid())
    else:
        Path(os.environ["CUTE_DSL_DUMP_DIR"]).mkdir(parents=True, exist_ok=True)


@functools.cache
def cute_modules():
    """Import and return ``(cutlass, cute)`` with the environment prepared first."""
    _prepare_env()
    import cutlass
    import cutlass.cute as cute

    return cutlass, cute


def dsl_available() -> tuple[bool, str]:
    """Whether nvidia-cutlass-dsl imports here; the reason when it does not."""
    try:
        _prepare_env()
    except OSError as exc:  # the folder of the PTX dumps: not the DSL's fault
        return False, (f"the kernel cache folder {cache_root()} is not writable "
                       f"({exc.strerror or type(exc).__name__}: {exc.filename or ''}); set "
                       "CSAGATE_CACHE_DIR to a writable folder")
    try:
        cute_modules()
    except Exception as exc:  # ImportError, or a broken install raising anything else
        return False, f"nvidia-cutlass-dsl is not importable ({type(exc).__name__}: {exc})"
    return True, ""


def dsl_version() -> str:
    try:
        from importlib.metadata import version

        return version("nvidia-cutlass-dsl")
    except Exception:
        return "unknown"


def device_arch(device_index: int | None = None) -> str:
    """The build target of a CUDA device (``sm_90a`` H200, ``sm_100a`` B200, ``sm_103a`` B300)."""
    import torch

    major, minor = torch.cuda.get_device_capability(device_index)
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


@functools.cache
def sm_count(device_index: int) -> int:
    """Streaming multiprocessors of a CUDA device (cached: device properties are static)."""
    import torch

    return torch.cuda.get_device_properties(device_index).multi_processor_count


def compile_for(arch: str, jit_fn, *args):
    """``cute.compile`` for ``arch`` via TVM-FFI (no GPU needed); symbolic fakes: any row count."""
    if arch not in ARCHES:
        raise ValueError(f"arch must be one of {ARCHES}, got {arch!r}")
    _, cute = cute_modules()
    return cute.compile(jit_fn, *args, options=f"--gpu-arch {arch} --enable-tvm-ffi")


ALIGN_DATA = 16   # bf16/fp32 base pointers: the vector accesses need 16 B (checked per call)
ALIGN_INDEX = 4   # int32 offsets


def sym(divisibility: int = 1):
    """A fresh symbolic extent (a multiple of ``divisibility``, checked per call); the same
    object in two fake tensors ties their extents."""
    _, cute = cute_modules()
    return cute.sym_int(divisibility=divisibility)


def fake_rows(dtype, rows, width: int, align: int = ALIGN_DATA):
    """A row-major (rows, width) fake tensor: ``rows`` symbolic or int, ``width`` static."""
    cute_modules()
    from cutlass.cute.runtime import make_fake_compact_tensor

    return make_fake_compact_tensor(dtype, (rows, width), stride_order=(1, 0),
                                    assumed_align=align)


def fake_vec(dtype, n, align: int = ALIGN_INDEX):
    """A 1-D fake tensor of extent ``n`` (cu_seqlens / cu_seqlens_comp)."""
    cute_modules()
    from cutlass.cute.runtime import make_fake_compact_tensor

    return make_fake_compact_tensor(dtype, (n,), assumed_align=align)


def env_stream():
    """The stream parameter of a TVM-FFI compile: the caller's current torch stream."""
    cute_modules()
    from cutlass.cute.runtime import make_fake_stream

    return make_fake_stream(use_tvm_ffi_env_stream=True)


def ptx_of(fn) -> str | None:
    """The PTX text of a compiled function (``__ptx__``: the text or the dumped file), or None."""
    ptx = getattr(fn, "__ptx__", None)
    if not ptx:
        return None
    if isinstance(ptx, bytes):
        ptx = ptx.decode()
    if "\n" in ptx:
        return ptx
    path = Path(ptx)
    if path.is_file():
        text = path.read_text()
        return text if "\n" in text else None
    return None
