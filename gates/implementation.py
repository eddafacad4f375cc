"""How an implementation the gate can judge is found. The interface itself is
:mod:`csagate.gates.plugin` (``from csagate.gates.plugin import Supports``; ``Supports``
stays importable from here too, as adapters written before that import it).

They are found three ways (:func:`resolve`): the built-ins (:data:`BUILTINS`, each imported
when first named), the entry-point group ``csagate.implementations`` (a package registers an
object, a class or a factory), and ``path/to/file.py:NAME`` or ``module:NAME`` for a local
adapter. A bad value raises :class:`~csagate.gates.plugin.ImplError` with one line (the CLI's
usage error, exit 2).
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from csagate.gates.plugin import ImplError, Supports, raised

ENTRY_POINT_GROUP = "csagate.implementations"
DEFAULT = "csagate"

# The built-in implementations, by ``--impl`` name: ``module:attribute`` of a class (or a
# factory), imported only when the name is loaded. Registering another built-in is one line
# here.
BUILTINS: dict[str, str] = {
    "csagate": "csagate.gates.builtin_impls:Csagate",
    "csagate-op": "csagate.gates.builtin_impls:CsagateOp",
    "cudnn": "csagate.gates.builtin_impls:Cudnn",
    "eager-bf16w": "csagate.gates.builtin_impls:EagerBf16Weights",
    "eager-bf16ape": "csagate.gates.builtin_impls:EagerBf16Ape",
    "compiled": "csagate.gates.builtin_impls:Compiled",
    "decode": "csagate.gates.inference_impls:Decode",
    "online-c128": "csagate.gates.inference_impls:OnlineSoftmax",
    "bf16-state": "csagate.gates.inference_impls:Bf16State",
}


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
        raise ImplError(f"{where}: {what} raised {raised(exc)}") from exc


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


def _builtin(target: str):
    """The class or factory ``module:attribute`` names (a built-in, imported now)."""
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def builtins() -> dict[str, Found]:
    return {name: Found(name, "built-in", lambda target=target: _builtin(target))
            for name, target in BUILTINS.items()}


def load_builtin(name: str = DEFAULT):
    """The built-in implementation ``name`` (default: the gate's own kernels), loaded."""
    return load(builtins()[name])


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
    """The module of an adapter file. Its folder goes first on ``sys.path`` (and stays: the
    adapter may import its sibling modules later, lazily), as ``python path/to/file.py``
    would put it."""
    file = Path(path)
    if not file.is_file():
        raise ImplError(f"--impl {path}:{attr}: no such file {str(file)!r}")
    folder = str(file.resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
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
        raise ImplError(f"--impl {name}:{attr}: cannot import {name!r} ({raised(exc)})"
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
