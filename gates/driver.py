"""The one seam between the gate and an implementation (:mod:`csagate.gates.plugin`).

The runner (``csagate.gates.runner``), the fuzz judge, the drift check and the self-tests
never call an implementation themselves: they call a :class:`Driver`, which gives them the
buffer interface they judge through (the gate allocates and pre-fills every buffer) whatever
the implementation offers. An implementation with the buffer hooks (``forward_into`` /
``backward_into``: the gate's own kernels) writes into those buffers; any other one returns its
outputs, which are copied in (dAPE added to the zeroed one), so G1 and zeros judge what it
returned. Its hooks that exit the process become an :class:`AdapterExit` (that case's error).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from csagate.gates.errors import BuildError, one_line
from csagate.gates.plugin import AdapterExit, applies_of, hook, raised
from csagate.gates.verdict import Selection

Target = tuple[int, int, int]                     # (ratio, coff, d): one build unit
ProgressFn = Callable[[int, int, str], None]      # (done, total, label)


class Driver:
    """One implementation on one device, as the gate drives it."""

    def __init__(self, impl, device: torch.device):
        self.impl = impl
        self.device = torch.device(device)
        self.applies = applies_of(impl)

    def _call(self, what: str, fn, *args, **kwargs):
        """An implementation's hook; an exit or a ``BaseException`` of its own it raises (not
        Ctrl-C) becomes an :class:`AdapterExit`, so the case is an ``error`` row and the run
        goes on, instead of the process ending (with exit 0 for ``sys.exit(0)``) mid-verdict.
        On a CUDA device the call runs with that device current."""
        try:
            if self.device.type != "cuda":
                return fn(*args, **kwargs)
            with torch.cuda.device(self.device):   # the implementation's current device
                return fn(*args, **kwargs)
        except (Exception, KeyboardInterrupt):
            raise
        except BaseException as exc:  # SystemExit and the like
            raise AdapterExit(f"{self.impl.name}.{what} raised {raised(exc)}") from exc

    def build(self, targets: Sequence[Target], progress: ProgressFn | None = None) -> list:
        """``impl.prepare(targets, progress)`` when it has one; a :class:`BuildError` else."""
        prepare = hook(self.impl, "prepare")
        if prepare is None:
            return []
        try:
            return list(self._call("prepare", prepare, tuple(targets), progress) or [])
        except BuildError:
            raise
        except Exception as exc:
            raise BuildError(f"preparing {self.impl.name} failed: {one_line(exc)}") from exc

    def _select(self, direction: str, ratio: int, coff: int, d: int, n_rows: int):
        if not self.applies.dispatch:
            return None
        return self._call("dispatch", self.impl.dispatch, ratio, direction, coff, d, n_rows)

    def forward(self, kv, score, ape, cu, cuc, out, *, ratio: int, coff: int):
        """Write ``out``; return the kernel selected (None without the dispatch hooks)."""
        into = hook(self.impl, "forward_into")
        if into is not None:
            return self._call("forward_into", into, kv, score, ape, cu, cuc, out, ratio=ratio,
                              coff=coff)
        got = self._call("forward", self.impl.forward, kv, score, ape, cu, cuc, out.shape[0],
                         ratio=ratio, coff=coff)
        _copy_into(out, got, "out")
        return self._select("fwd", ratio, coff, out.shape[1], out.shape[0])

    def backward(self, kv, score, ape, cu, cuc, grad_out, dkv, dscore, dape, *, ratio: int,
                 coff: int, deterministic: bool = False):
        """Write ``dkv``/``dscore``, accumulate into the zeroed ``dape``; return the kernel."""
        if not self.applies.backward:
            raise NotImplementedError(f"{self.impl.name} provides no backward")
        # the keyword only when asked: an implementation without the mode does not take it
        mode = {"deterministic": True} if deterministic else {}
        into = hook(self.impl, "backward_into")
        if into is not None:
            return self._call("backward_into", into, kv, score, ape, cu, cuc, grad_out, dkv,
                              dscore, dape, ratio=ratio, coff=coff, **mode)
        got = self._call("backward", self.impl.backward, kv, score, ape, cu, cuc, grad_out,
                         ratio=ratio, coff=coff, **mode)
        if len(got) != 3:
            raise ValueError(f"{self.impl.name}.backward returned {len(got)} tensors, "
                             "expected (dkv, dscore, dape)")
        for buf, t, name in zip((dkv, dscore), got[:2], ("dkv", "dscore")):
            _copy_into(buf, t, name)
        _check_shape(dape, got[2], "dape")
        dape += got[2].to(dape.dtype)
        return self._select("bwd", ratio, coff, grad_out.shape[1], grad_out.shape[0])

    def through_op(self, kv, score, ape, cu, cuc, grad_out, *, n_rows: int, ratio: int,
                   coff: int):
        """``(out, (dkv, dscore, dape))`` through the op that wraps the implementation."""
        return self._call("through_op", self.impl.through_op, kv, score, ape, cu, cuc,
                          grad_out, n_rows=n_rows, ratio=ratio, coff=coff)

    def entries(self, ratio: int, direction: str, configs=None) -> dict:
        """Every (bucket, coff, d) kernel the implementation's tables can select."""
        if not self.applies.dispatch:
            return {}
        return dict(self._call("kernels", self.impl.kernels, ratio, direction, configs))

    def dispatch(self, ratio: int, direction: str, coff: int, d: int,
                 n_rows: int) -> Selection | None:
        return self._select(direction, ratio, coff, d, n_rows)

    def describe(self) -> dict[str, Any]:
        """The report's environment: the implementation's own ``describe`` when it names the
        device (``"device"``) and, otherwise, the implementation, the device and torch first."""
        own = hook(self.impl, "describe")
        found = dict(self._call("describe", own)) if own is not None else {}
        if "device" in found:
            return found
        env: dict[str, Any] = {"implementation": self.impl.name, "device": str(self.device)}
        if self.device.type == "cuda":
            props = torch.cuda.get_device_properties(self.device)
            env.update(gpu=props.name, compute_capability=f"{props.major}.{props.minor}")
        env["torch"] = torch.__version__
        return {**env, **found}


def _check_shape(buf: torch.Tensor, got, name: str) -> None:
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(buf.shape):
        shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
        raise ValueError(f"{name}: expected shape {tuple(buf.shape)}, got {shape}")


def _copy_into(buf: torch.Tensor, got, name: str) -> None:
    _check_shape(buf, got, name)
    if got.dtype != buf.dtype:
        raise ValueError(f"{name}: expected {buf.dtype}, got {got.dtype}")
    buf.copy_(got)
