"""The buffer interface the gate judges through, and the gate's own kernels behind it.

The gate (``csagate.gates.runner``) never imports a kernel nor calls an implementation: it
drives a :class:`Backend`, which builds, runs into caller-allocated buffers and enumerates what
the dispatch tables can select. The one class that is one is
:class:`csagate.gates.driver.Driver`, over any implementation (:mod:`csagate.gates.plugin`).
:class:`KernelBackend` is the buffer path of the built-in ``csagate`` implementation
(``csagate.gates.builtin_impls.Csagate``): it wraps ``csagate.kernels.api`` (imported lazily,
so importing ``gates`` never imports cutlass). The CPU tests drive the same gate code through
small reference-backed implementations in ``tests/`` with one fault planted at a time, which
is how we know the gate can fail.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from csagate.gates.errors import BuildError, one_line
from csagate.gates.verdict import Selection
from csagate.kernels.schedule import config_name

if TYPE_CHECKING:
    import torch

Target = tuple[int, int, int]                     # (ratio, coff, d): one build unit
ProgressFn = Callable[[int, int, str], None]      # (done, total, label)


class Backend(Protocol):
    """What the runner calls on its driver. Buffers are allocated and pre-filled by the gate."""

    device: torch.device

    def build(self, targets: Sequence[Target], progress: ProgressFn | None = None) -> list:
        """Build (or load) every kernel the tables can select for each target; BuildError."""

    def forward(self, kv, score, ape, cu, cuc, out, *, ratio: int,
                coff: int) -> Selection | None:
        """Write ``out``; return the kernel selected (None when nothing launched)."""

    def backward(self, kv, score, ape, cu, cuc, grad_out, dkv, dscore, dape, *, ratio: int,
                 coff: int, deterministic: bool = False) -> Selection | None:
        """Write ``dkv``/``dscore``, accumulate into the zeroed ``dape``; return the kernel.
        ``deterministic``: the deterministic backward (dAPE bitwise run to run)."""

    def through_op(self, kv, score, ape, cu, cuc, grad_out, *, n_rows: int, ratio: int,
                   coff: int):
        """``(out, (dkv, dscore, dape))`` through the torch op users call: its forward, then
        the autograd backward with ``grad_out`` (leaves: fresh copies of kv, score, ape)."""

    def entries(self, ratio: int, direction: str,
                configs: Sequence[tuple[int, int]] | None = None
                ) -> dict[tuple[str, int, int], Selection]:
        """Every (bucket, coff, d) entry of the device's dispatch tables and its kernel, read
        from the tables themselves; ``configs`` narrows the configs (ratio=4 needs them)."""

    def dispatch(self, ratio: int, direction: str, coff: int, d: int,
                 n_rows: int) -> Selection | None:
        """The kernel the dispatcher selects for N rows (no launch); None when N == 0."""

    def describe(self) -> dict[str, Any]:
        """Where the kernels run: device, arch, versions (for the report)."""


def op_forward_backward(kv, score, ape, cu, cuc, grad_out, *, n_rows: int, ratio: int,
                        coff: int):
    """``(out, (dkv, dscore, dape))`` through the torch op users call
    (``csagate.ops.csa_compress``): its forward, then autograd with ``grad_out``; the leaves
    are fresh copies of kv, score and ape."""
    import torch

    from csagate import ops

    leaves = [t.detach().clone().requires_grad_(True) for t in (kv, score, ape)]
    with torch.enable_grad():
        out = ops.csa_compress(*leaves, cu, cuc, ratio=ratio, coff=coff, n_rows=n_rows)
        out.backward(grad_out)
    return out.detach(), tuple(t.grad for t in leaves)


def _selection(direction: str, key) -> Selection | None:
    if key is None:
        return None
    return Selection(direction, int(key.coff), int(key.d), key.schedule)


class KernelBackend:
    """The real kernels through ``csagate.kernels.api`` on one CUDA device. Every launch runs
    with ``check=True``: the gate's cu/cuc values are read and checked first."""

    def __init__(self, device_index: int = 0):
        import torch
        from csagate.kernels._dsl import device_arch

        self.device = torch.device("cuda", device_index)
        self.arch = device_arch(device_index)

    def build(self, targets: Sequence[Target], progress: ProgressFn | None = None) -> list:
        """``kernels.api.build`` per target; progress counts kernels (cache hits included)."""
        import torch

        try:
            from csagate.kernels import api
            from csagate.kernels.cache import keys_for
        except Exception as exc:
            raise BuildError(f"cannot import csagate.kernels.api ({one_line(exc)})") from exc
        counts = [len(keys_for(ratio, self.arch, coff=coff, d=d)) for ratio, coff, d in targets]
        total, done = sum(counts), 0
        records: list = []
        for (ratio, coff, d), count in zip(targets, counts, strict=True):
            label = f"ratio={ratio} {config_name(coff, d)} for {self.arch}"
            if progress:
                progress(done, total, label)

            def tick(record, i, n, offset=done):
                if progress:
                    hit = " (cached)" if getattr(record, "hit", False) else ""
                    progress(offset + i, total, f"{record.key.tag}{hit}")

            try:
                with torch.cuda.device(self.device):
                    records.extend(api.build(ratio, arch=self.arch, coff=coff, d=d,
                                             progress=tick) or [])
            except Exception as exc:
                raise BuildError(f"building {label} failed: {one_line(exc)}") from exc
            done += count
        if progress:
            progress(total, total, "built")
        return records

    def forward(self, kv, score, ape, cu, cuc, out, *, ratio: int,
                coff: int) -> Selection | None:
        from csagate.kernels import api  # launches on kv's device

        return _selection("fwd", api.run_forward(kv, score, ape, cu, cuc, out, ratio=ratio,
                                                 coff=coff, check=True))

    def backward(self, kv, score, ape, cu, cuc, grad_out, dkv, dscore, dape, *, ratio: int,
                 coff: int, deterministic: bool = False) -> Selection | None:
        from csagate.kernels import api  # launches on kv's device

        key = api.run_backward(kv, score, ape, cu, cuc, grad_out, dkv, dscore, dape,
                               ratio=ratio, coff=coff, deterministic=bool(deterministic),
                               check=True)
        return _selection("bwd", key)  # a deterministic key's schedule is its table entry

    def through_op(self, kv, score, ape, cu, cuc, grad_out, *, n_rows: int, ratio: int,
                   coff: int):
        import torch

        got = op_forward_backward(kv, score, ape, cu, cuc, grad_out, n_rows=n_rows,
                                  ratio=ratio, coff=coff)
        torch.cuda.synchronize(self.device)
        return got

    def entries(self, ratio: int, direction: str,
                configs: Sequence[tuple[int, int]] | None = None
                ) -> dict[tuple[str, int, int], Selection]:
        """The registry's entries (``kernels.registry.entries``): a table family's tables
        bucket by bucket (not through the dispatcher's bucket constants), otherwise one kernel
        per config under bucket ``any``."""
        from csagate.kernels.registry import entries

        return {k: _selection(direction, key)
                for k, key in entries(ratio, direction, self.arch, configs).items()}

    def dispatch(self, ratio: int, direction: str, coff: int, d: int,
                 n_rows: int) -> Selection | None:
        from csagate.kernels.api import kernel_for

        return _selection(direction, kernel_for(direction, ratio, coff, d, n_rows, self.arch))

    def describe(self) -> dict[str, Any]:
        import torch
        from csagate.kernels._dsl import dsl_version

        index = self.device.index or 0
        props = torch.cuda.get_device_properties(index)
        return {
            "backend": "kernels",
            "device": str(self.device),
            "gpu": props.name,
            "compute_capability": f"{props.major}.{props.minor}",
            "sm_count": props.multi_processor_count,
            "arch": self.arch,
            "driver": _nvidia_driver(),
            "cuda_driver_api": _driver_api_version(),
            "cuda_runtime": torch.version.cuda,
            "torch": torch.__version__,
            "nvidia_cutlass_dsl": dsl_version(),
        }


def _nvidia_driver() -> str:
    """The kernel module's version (e.g. ``570.86.15``) from /proc, else ``unknown``."""
    import re
    from pathlib import Path

    try:
        text = Path("/proc/driver/nvidia/version").read_text()
    except OSError:
        return "unknown"
    found = re.search(r"Kernel Module\s+(?:for \S+\s+)?([0-9][0-9.]+)", text)
    return found.group(1) if found else "unknown"


def _driver_api_version() -> str:
    """The CUDA driver API version as ``major.minor`` (``unknown`` if no binding answers)."""
    try:
        import cuda.bindings.driver as drv

        err, v = drv.cuDriverGetVersion()
        if int(err) == 0:
            return f"{v // 1000}.{v % 1000 // 10}"
    except Exception:
        pass
    try:
        import torch

        v = torch._C._cuda_getDriverVersion()
        return f"{v // 1000}.{v % 1000 // 10}"
    except Exception:
        return "unknown"
