"""An implementation of the CSA compressor as a plug-in the gate can judge, and how one is found.

An implementation is any object with

* ``name`` (str) and ``supports`` (:class:`Supports`: ratios, coffs, head dims, the compute
  capability it needs);
* ``forward(kv, score, ape, cu, cuc, n_rows, *, ratio, coff) -> out`` (``(n_rows, d)`` bf16);

and optionally

* ``backward(kv, score, ape, cu, cuc, grad_out, *, ratio, coff[, deterministic]) -> (dkv,
  dscore, dape)``: without it only the forward contract is judged;
* ``deterministic = True``: ``backward`` takes ``deterministic=True`` (dAPE bitwise run to
  run); the deterministic cases apply only then;
* the dispatch hooks ``kernels(ratio, direction, configs)`` (every kernel its tables can
  select, keyed ``(bucket, coff, d)``) and ``dispatch(ratio, direction, coff, d, n_rows)``
  (the kernel a case selects, no launch), both as :class:`~csagate.gates.verdict.Selection`;
  coverage and the bucket edges apply only with both;
* ``unavailable(device) -> str | None``: why it cannot run here (a missing package, the
  compute capability), in one line; ``prepare(targets)``: compile ahead of the cases;
  ``describe() -> dict``: versions for the report.

They are found three ways (:func:`resolve`): the built-ins (``csagate.gates.builtin_impls``),
the entry-point group ``csagate.implementations`` (a package registers an object, a class or a
factory), and ``path/to/file.py:NAME`` or ``module:NAME`` for a local adapter. A bad value
raises :class:`ImplError` with one line (the CLI's usage error, exit 2).

:class:`ImplBackend` drives an implementation through the gate's buffer interface
(:class:`~csagate.gates.backend.Backend`), and :class:`Applies` says which gates apply to it.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from csagate.gates.backend import BuildError, ProgressFn, Target, one_line
from csagate.gates.verdict import Selection

ENTRY_POINT_GROUP = "csagate.implementations"
DEFAULT = "csagate"


class ImplError(ValueError):
    """A bad ``--impl`` value: one line, a usage error."""


class AdapterExit(RuntimeError):
    """An implementation's hook tried to exit the process (or raised another BaseException
    that is not an Exception) while the gate ran it: an error of that case."""


def _guarded(where: str, what: str, fn, *args):
    """``fn(*args)``, with anything it raises as an :class:`ImplError` naming ``where`` and
    ``what`` raised. Anything: an adapter's ``sys.exit(0)``, a ``KeyboardInterrupt`` or another
    ``BaseException`` in its import or construction would otherwise end the process silently
    (or with a traceback) before a verdict; loading it is a usage error instead (exit 2)."""
    try:
        return fn(*args)
    except ImplError:
        raise
    except BaseException as exc:  # SystemExit and KeyboardInterrupt on purpose
        raise ImplError(f"{where}: {what} raised {_raised(exc)}") from exc


def _raised(exc: BaseException) -> str:
    """``one_line(exc)``, saying why an exit or an interrupt is refused."""
    text = one_line(exc)
    if not isinstance(exc, Exception):
        text += " (an implementation must not exit or interrupt the process)"
    return text


@dataclass(frozen=True)
class Supports:
    """The envelope an implementation declares: a case outside it is ``n/a`` for it."""

    ratios: tuple[int, ...] | None = None          # None: any ratio
    coffs: tuple[int, ...] = (1, 2)
    head_dims: tuple[int, ...] | None = None       # None: any head dim
    min_compute_capability: tuple[int, int] | None = None  # None: any device (CPU included)

    def covers(self, ratio: int, coff: int, d: int) -> bool:
        return ((self.ratios is None or ratio in self.ratios) and coff in self.coffs
                and (self.head_dims is None or d in self.head_dims))

    def text(self) -> str:
        dims = "any d" if self.head_dims is None else "d " + "/".join(map(str, self.head_dims))
        cc = "" if self.min_compute_capability is None else \
            ", cc >= {}.{}".format(*self.min_compute_capability)
        ratios = "any ratio" if self.ratios is None else \
            "ratio " + "/".join(map(str, sorted(self.ratios)))
        return (f"{ratios}, coff "
                f"{'/'.join(map(str, self.coffs))}, {dims}{cc}")


@runtime_checkable
class Implementation(Protocol):
    """The required part of an implementation (the optional hooks are read by name)."""

    name: str
    supports: Supports

    def forward(self, kv, score, ape, cu, cuc, n_rows: int, *, ratio: int,
                coff: int) -> torch.Tensor:
        """``out`` (n_rows, d) bf16."""


@dataclass(frozen=True)
class Applies:
    """Which parts of the contract apply to a backend (a plain Backend: all of them)."""

    forward: bool = True
    backward: bool = True
    deterministic: bool = True     # the deterministic-mode cases
    dispatch: bool = True          # coverage and bucket edges
    op: bool = True                # the torch-op comparison (``op`` gate)
    impl: str = ""                 # the implementation's name ("" for the gate's own kernels)
    supports: Supports | None = None

    def covers(self, case) -> bool:
        if case.deterministic and not (self.deterministic and self.backward):
            return False
        return self.supports is None or self.supports.covers(case.ratio, case.coff, case.d)

    def why_not(self, case) -> str:
        if case.deterministic and not (self.deterministic and self.backward):
            return f"n/a: {self.impl} has no deterministic backward"
        return f"n/a: outside {self.impl}'s envelope ({self.supports.text()})"

    @property
    def scope(self) -> str:
        """What a verdict judged, for its headline ('' when everything applies)."""
        parts = []
        if not self.backward:
            parts.append("forward contract only")
        if not self.dispatch:
            parts.append("coverage n/a (no dispatch hooks)")
        if self.backward and not self.deterministic:
            parts.append("deterministic n/a")
        if not self.impl:
            return "; ".join(parts)
        return f"{self.impl}: " + ("; ".join(parts) or "forward and backward")


def applies_to(backend) -> Applies:
    return getattr(backend, "applies", None) or Applies()


def has_backward(impl) -> bool:
    return callable(getattr(impl, "backward", None))


def has_dispatch(impl) -> bool:
    return callable(getattr(impl, "kernels", None)) and callable(getattr(impl, "dispatch", None))


def applies_of(impl) -> Applies:
    return Applies(forward=True, backward=has_backward(impl),
                   deterministic=bool(getattr(impl, "deterministic", False)),
                   dispatch=has_dispatch(impl), op=False,
                   impl=str(getattr(impl, "label", impl.name)),
                   supports=impl.supports)


def unavailable(impl, device: torch.device) -> str | None:
    """Why ``impl`` cannot run on ``device`` (one line), or None."""
    hook = getattr(impl, "unavailable", None)
    if callable(hook):           # its own check, when it has one, decides
        try:
            return hook(device)
        except Exception:        # an error: the caller says it could not evaluate
            raise
        except BaseException as exc:  # an exit or interrupt: a usage error
            raise ImplError(f"{impl.name}: its availability check (unavailable) raised "
                            f"{_raised(exc)}") from exc
    cc = impl.supports.min_compute_capability
    if cc is not None:
        if device.type != "cuda" or not torch.cuda.is_available():
            return f"no CUDA GPU visible (needs compute capability >= {cc[0]}.{cc[1]})"
        have = torch.cuda.get_device_capability(device)
        if tuple(have) < tuple(cc):
            return (f"{impl.name} needs compute capability >= {cc[0]}.{cc[1]}, this GPU is "
                    f"{have[0]}.{have[1]}")
    return None


class ImplBackend:
    """An :class:`Implementation` behind the gate's buffer interface (outputs copied into the
    gate's pre-filled buffers, dAPE added to the zeroed one, so G1 and zeros judge what the
    implementation returned)."""

    def __init__(self, impl, device: torch.device):
        self.impl = impl
        self.device = torch.device(device)
        self.applies = applies_of(impl)

    def build(self, targets: Sequence[Target], progress: ProgressFn | None = None) -> list:
        prepare = getattr(self.impl, "prepare", None)
        if not callable(prepare):
            return []
        try:
            return list(self._call("prepare", prepare, tuple(targets), progress) or [])
        except Exception as exc:
            raise BuildError(f"preparing {self.impl.name} failed: {one_line(exc)}") from exc

    def _call(self, what: str, fn, *args, **kwargs):
        """An implementation's hook; an exit or a ``BaseException`` of its own it raises (not
        Ctrl-C) becomes an :class:`AdapterExit`, so the case is an ``error`` row and the run
        goes on, instead of the process ending (with exit 0 for ``sys.exit(0)``) mid-verdict."""
        try:
            return fn(*args, **kwargs)
        except (Exception, KeyboardInterrupt):
            raise
        except BaseException as exc:  # SystemExit and the like
            raise AdapterExit(f"{self.impl.name}.{what} raised {_raised(exc)}") from exc

    def _select(self, direction: str, ratio: int, coff: int, d: int, n_rows: int):
        if not self.applies.dispatch:
            return None
        return self.impl.dispatch(ratio, direction, coff, d, n_rows)

    def forward(self, kv, score, ape, cu, cuc, out, *, ratio: int, coff: int):
        got = self._call("forward", self.impl.forward, kv, score, ape, cu, cuc, out.shape[0],
                         ratio=ratio, coff=coff)
        _copy_into(out, got, "out")
        return self._select("fwd", ratio, coff, out.shape[1], out.shape[0])

    def backward(self, kv, score, ape, cu, cuc, grad_out, dkv, dscore, dape, *, ratio: int,
                 coff: int, deterministic: bool = False):
        if not self.applies.backward:
            raise NotImplementedError(f"{self.impl.name} provides no backward")
        det = {"deterministic": True} if deterministic else {}
        got = self._call("backward", self.impl.backward, kv, score, ape, cu, cuc, grad_out,
                         ratio=ratio, coff=coff, **det)
        if len(got) != 3:
            raise ValueError(f"{self.impl.name}.backward returned {len(got)} tensors, "
                             "expected (dkv, dscore, dape)")
        for buf, t, name in zip((dkv, dscore), got[:2], ("dkv", "dscore")):
            _copy_into(buf, t, name)
        _check_shape(dape, got[2], "dape")
        dape += got[2].to(dape.dtype)
        return self._select("bwd", ratio, coff, grad_out.shape[1], grad_out.shape[0])

    def entries(self, ratio: int, direction: str, configs=None):
        if not self.applies.dispatch:
            return {}
        return dict(self.impl.kernels(ratio, direction, configs))

    def dispatch(self, ratio: int, direction: str, coff: int, d: int,
                 n_rows: int) -> Selection | None:
        return self._select(direction, ratio, coff, d, n_rows)

    def describe(self) -> dict[str, Any]:
        env: dict[str, Any] = {"implementation": self.impl.name, "device": str(self.device)}
        if self.device.type == "cuda":
            props = torch.cuda.get_device_properties(self.device)
            env.update(gpu=props.name, compute_capability=f"{props.major}.{props.minor}")
        env["torch"] = torch.__version__
        hook = getattr(self.impl, "describe", None)
        if callable(hook):
            env.update(hook())
        return env


def _check_shape(buf: torch.Tensor, got, name: str) -> None:
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(buf.shape):
        shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
        raise ValueError(f"{name}: expected shape {tuple(buf.shape)}, got {shape}")


def _copy_into(buf: torch.Tensor, got, name: str) -> None:
    _check_shape(buf, got, name)
    if got.dtype != buf.dtype:
        raise ValueError(f"{name}: expected {buf.dtype}, got {got.dtype}")
    buf.copy_(got)


def as_backend(impl, device: torch.device):
    """The gate's backend for ``impl``: its own (``impl.backend(device)``, the gate's kernels)
    or :class:`ImplBackend`."""
    own = getattr(impl, "backend", None)
    backend = own(device) if callable(own) else None
    return backend if backend is not None else ImplBackend(impl, device)


# --- discovery -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Found:
    """One implementation a name can select: where it comes from and how to get it."""

    name: str
    origin: str            # "built-in", "entry point (dist)", "file", "module"
    load: Any              # () -> the implementation object


def _instantiate(obj, where: str):
    """An implementation from what ``where`` names: the object, a class, or a factory. What
    its construction or its attributes raise is an :class:`ImplError` (:func:`_guarded`)."""
    return _guarded(where, "loading it", _instantiate_checked, obj, where)


def _instantiate_checked(obj, where: str):
    if isinstance(obj, type) or (callable(obj) and not hasattr(obj, "forward")):
        obj = _guarded(where, "constructing it", obj)
    missing = _guarded(where, "reading its attributes", lambda: [
        a for a in ("name", "supports", "forward") if not hasattr(obj, a)])
    if missing:
        raise ImplError(f"{where} is not an implementation: it has no "
                        + ", ".join(missing) + " (see `csagate impls --help`)")
    name = _guarded(where, "reading its name", getattr, obj, "name")
    if not isinstance(name, str) or not name:
        raise ImplError(f"{where}: name must be a non-empty string, got {name!r}")
    supports = _guarded(where, "reading its supports", getattr, obj, "supports")
    if not isinstance(supports, Supports):
        raise ImplError(f"{where}: supports must be a csagate.gates.implementation.Supports, "
                        f"got {type(supports).__name__}")
    if not callable(obj.forward):
        raise ImplError(f"{where}: forward is not callable")
    return obj


def builtins() -> dict[str, Found]:
    from csagate.gates import builtin_impls

    return {name: Found(name, "built-in", factory)
            for name, factory in builtin_impls.BUILTINS.items()}


def entry_points() -> dict[str, Found]:
    """The ``csagate.implementations`` entry points, by entry-point name."""
    from importlib import metadata

    found = {}
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = getattr(getattr(ep, "dist", None), "name", None) or "?"

        def load(ep=ep):
            where = f"entry point {ep.name!r} ({ep.value})"
            return _instantiate(_guarded(where, "importing it", ep.load), where)

        found[ep.name] = Found(ep.name, f"entry point ({dist})", load)
    return found


def known() -> dict[str, Found]:
    """Every implementation found by name: the built-ins, then the entry points."""
    return {**entry_points(), **builtins()}   # a built-in name is never shadowed


def _from_file(path: str, attr: str):
    file = Path(path)
    if not file.is_file():
        raise ImplError(f"--impl {path}:{attr}: no such file {str(file)!r}")
    mod_name = f"csagate_adapter_{abs(hash(str(file.resolve())))}"
    spec = importlib.util.spec_from_file_location(mod_name, file)
    if spec is None or spec.loader is None:
        raise ImplError(f"--impl {path}:{attr}: cannot load {str(file)!r} as Python")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        _guarded(f"--impl {path}:{attr}", "importing it", spec.loader.exec_module, module)
    except ImplError:
        sys.modules.pop(mod_name, None)
        raise
    return module


def _from_module(name: str, attr: str):
    try:
        return importlib.import_module(name)
    except BaseException as exc:  # an exit or interrupt on import too, as in _guarded
        raise ImplError(f"--impl {name}:{attr}: cannot import {name!r} ({_raised(exc)})"
                        ) from exc


_MISSING = object()


def resolve(value: str) -> Found:
    """What ``--impl VALUE`` names: a built-in or entry-point name, ``file.py:NAME`` or
    ``module:NAME``. Loading is deferred to ``Found.load`` except for paths (checked now)."""
    value = value.strip()
    if ":" in value:
        where, _, attr = value.rpartition(":")
        if not where or not attr.isidentifier():
            raise ImplError(f"--impl {value!r}: expected NAME, path/to/file.py:NAME or "
                            "module:NAME")
        is_file = where.endswith(".py") or "/" in where
        module = _from_file(where, attr) if is_file else _from_module(where, attr)
        found = _guarded(f"--impl {value}", f"reading {attr}", getattr, module, attr, _MISSING)
        if found is _MISSING:
            raise ImplError(f"--impl {value}: {where} has no attribute {attr!r}")
        obj = _instantiate(found, f"--impl {value}")
        return Found(obj.name, "file" if is_file else "module", lambda: obj)
    found = known()
    if value not in found:
        close = difflib.get_close_matches(value, list(found), n=3)
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise ImplError(f"unknown implementation {value!r}.{hint} Known (`csagate impls`): "
                        + ", ".join(found) + "; or path/to/file.py:NAME, module:NAME")
    return found[value]


def load(found: Found):
    """The implementation object of ``found`` (a built-in's or entry point's constructor runs
    here; ImplError with one line if it is not one)."""
    obj = found.load()
    return _instantiate(obj, f"{found.origin} {found.name!r}")
