"""The plug-in interface: what an implementation the gate judges is, and what applies to it.

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
  compute capability), in one line; ``prepare(targets, progress)``: compile ahead of the
  cases; ``describe() -> dict``: versions for the report; ``label``: the name the verdict's
  headline gives it (``""``: none, the gate's own kernels);
* the buffer hooks ``forward_into(kv, score, ape, cu, cuc, out, *, ratio, coff)`` and
  ``backward_into(kv, score, ape, cu, cuc, grad_out, dkv, dscore, dape, *, ratio, coff,
  deterministic=False)``: write into the gate's pre-filled buffers (dAPE accumulated into the
  zeroed one) and return the kernel launched; used instead of ``forward`` / ``backward`` when
  present, so a slot the implementation never writes shows up in the NaN-filled runs;
* ``through_op(kv, score, ape, cu, cuc, grad_out, *, n_rows, ratio, coff) -> (out, (dkv,
  dscore, dape))``: the framework op that wraps it; the contract's ``op`` check compares it
  with the direct path.
* ``bitwise = ("out", ...)``: the outputs it promises bit for bit equal to the fp32 reference
  (docs/CONTRACT.md section 3.1) on the device it runs on, a stricter promise than the
  contract's rule for them; the gate holds it to that too (a G2 check per output, named
  ``out[claimed bitwise]``, whose failures are located like any other).

:class:`~csagate.gates.driver.Driver` is the one thing that calls these; this module only
says what they are (and imports nothing of the gate but its error text).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from csagate.gates.errors import Unusable, one_line

if TYPE_CHECKING:
    import torch

# How the gate calls each method (``forward`` and the optional hooks): the arguments it passes
# by position (named as the protocol names them; a hook may name them otherwise) and those it
# passes by keyword. ``csagate impls --impl`` checks each signature accepts them.
CALLS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "forward": (("kv", "score", "ape", "cu", "cuc", "n_rows"), ("ratio", "coff")),
    "backward": (("kv", "score", "ape", "cu", "cuc", "grad_out"), ("ratio", "coff")),
    "kernels": (("ratio", "direction", "configs"), ()),
    "dispatch": (("ratio", "direction", "coff", "d", "n_rows"), ()),
    "unavailable": (("device",), ()),
    "prepare": (("targets", "progress"), ()),
    "describe": ((), ()),
    "forward_into": (("kv", "score", "ape", "cu", "cuc", "out"), ("ratio", "coff")),
    "backward_into": (("kv", "score", "ape", "cu", "cuc", "grad_out", "dkv", "dscore",
                       "dape"), ("ratio", "coff")),
    "through_op": (("kv", "score", "ape", "cu", "cuc", "grad_out"),
                   ("n_rows", "ratio", "coff")),
}


class ImplError(Unusable):
    """A bad ``--impl`` value, or an adapter that cannot be loaded: one line, a usage error."""


class AdapterExit(RuntimeError):
    """An implementation's hook tried to exit the process (or raised another BaseException
    that is not an Exception) while the gate ran it: an error of that case."""


def raised(exc: BaseException) -> str:
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
    """The required part of an implementation (the optional hooks: the module's docstring)."""

    name: str
    supports: Supports

    def forward(self, kv, score, ape, cu, cuc, n_rows: int, *, ratio: int,
                coff: int) -> torch.Tensor:
        """``out`` (n_rows, d) bf16."""


def hook(impl, name: str):
    """The optional hook ``name`` of ``impl`` (a callable), or None."""
    found = getattr(impl, name, None)
    return found if callable(found) else None


def has_backward(impl) -> bool:
    return hook(impl, "backward") is not None or hook(impl, "backward_into") is not None


def has_dispatch(impl) -> bool:
    return hook(impl, "kernels") is not None and hook(impl, "dispatch") is not None


@dataclass(frozen=True)
class Applies:
    """Which parts of the contract apply to an implementation (all of them by default)."""

    forward: bool = True
    backward: bool = True
    deterministic: bool = True     # the deterministic-mode cases
    dispatch: bool = True          # coverage and bucket edges
    op: bool = True                # the torch-op comparison (``op`` gate)
    impl: str = ""                 # the name the headline gives it ("": the gate's own kernels)
    supports: Supports | None = None
    bitwise: tuple[str, ...] = ()  # outputs it claims bitwise the fp32 reference

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
        if self.bitwise:
            parts.append(f"{', '.join(self.bitwise)} held bitwise, as it claims")
        if not self.impl:
            return "; ".join(parts)
        return f"{self.impl}: " + ("; ".join(parts) or "forward and backward")


def applies_to(backend) -> Applies:
    """What applies to what the runner drives (its ``applies``; everything without one)."""
    return getattr(backend, "applies", None) or Applies()


def applies_of(impl) -> Applies:
    """What applies to an implementation, from the hooks it has."""
    label = getattr(impl, "label", impl.name)
    return Applies(forward=True, backward=has_backward(impl),
                   deterministic=bool(getattr(impl, "deterministic", False)),
                   dispatch=has_dispatch(impl), op=hook(impl, "through_op") is not None,
                   impl=str(label), supports=impl.supports,
                   bitwise=tuple(getattr(impl, "bitwise", None) or ()))


def unavailable(impl, device: torch.device) -> str | None:
    """Why ``impl`` cannot run on ``device`` (one line), or None: its own ``unavailable`` hook
    when it has one, else the compute capability ``supports`` names."""
    import torch

    own = hook(impl, "unavailable")
    if own is not None:
        try:
            return own(device)
        except Exception:        # an error: the caller says it could not evaluate
            raise
        except BaseException as exc:  # an exit or interrupt: a usage error
            raise ImplError(f"{impl.name}: its availability check (unavailable) raised "
                            f"{raised(exc)}") from exc
    cc = impl.supports.min_compute_capability
    if cc is not None:
        if device.type != "cuda" or not torch.cuda.is_available():
            return f"no CUDA GPU visible (needs compute capability >= {cc[0]}.{cc[1]})"
        have = torch.cuda.get_device_capability(device)
        if tuple(have) < tuple(cc):
            return (f"{impl.name} needs compute capability >= {cc[0]}.{cc[1]}, this GPU is "
                    f"{have[0]}.{have[1]}")
    return None


def _call_text(name: str, positional, keywords) -> str:
    args = ", ".join(positional) + (", *, " + ", ".join(keywords) if keywords else "")
    return f"{name}({args})"


def _signature_problem(impl, name: str, positional, keywords) -> str | None:
    """Why the gate's call of ``impl.name`` would not bind to its signature, or None."""
    import inspect

    fn = getattr(impl, name)
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None               # a builtin without a signature: nothing to check
    try:
        sig.bind(*positional, **dict.fromkeys(keywords))
    except TypeError as exc:
        return f"{name} cannot be called as {_call_text(name, positional, keywords)}: {exc}"
    return None


def _supports_problem(supports: Supports) -> str | None:
    def ints(values, low=1):
        return isinstance(values, tuple) and values and all(
            isinstance(v, int) and not isinstance(v, bool) and v >= low for v in values)

    if supports.ratios is not None and not ints(supports.ratios, 2):
        return f"supports.ratios must be None or a tuple of ints >= 2, got {supports.ratios!r}"
    if not ints(supports.coffs) or not set(supports.coffs) <= {1, 2}:
        return f"supports.coffs must be a tuple of 1 and/or 2, got {supports.coffs!r}"
    if supports.head_dims is not None and not ints(supports.head_dims):
        return (f"supports.head_dims must be None or a tuple of ints >= 1, got "
                f"{supports.head_dims!r}")
    cc = supports.min_compute_capability
    if cc is not None and not (ints(cc, 0) and len(cc) == 2):
        return (f"supports.min_compute_capability must be None or (major, minor), got "
                f"{cc!r}")
    return None


def conformance(impl) -> str | None:
    """The first way ``impl`` (loaded: it has a name, a Supports and a callable forward) breaks
    the protocol, in one line, or None: ``supports`` well-formed, ``forward`` and every
    optional hook it has callable as the gate calls them (``backward`` with
    ``deterministic=True`` too when it declares ``deterministic``), both dispatch hooks or
    neither."""
    problem = _supports_problem(impl.supports)
    if problem:
        return problem
    deterministic = getattr(impl, "deterministic", False)
    if not isinstance(deterministic, bool):
        return f"deterministic must be True or False, got {deterministic!r}"
    from csagate.gates.verdict import TENSORS

    claimed = getattr(impl, "bitwise", None) or ()
    if not (isinstance(claimed, (tuple, list)) and set(claimed) <= set(TENSORS)):
        return f"bitwise must be a tuple of output names ({', '.join(TENSORS)}), got {claimed!r}"
    for name, (positional, keywords) in CALLS.items():
        if name != "forward" and getattr(impl, name, None) is None:
            continue              # absent, or None (``backward = None``: forward only)
        if not callable(getattr(impl, name)):
            return f"{name} is not callable"
        if name in ("backward", "backward_into") and deterministic:
            keywords = (*keywords, "deterministic")
        problem = _signature_problem(impl, name, positional, keywords)
        if problem:
            return problem
    if has_dispatch(impl) != (hook(impl, "kernels") is not None
                              or hook(impl, "dispatch") is not None):
        return "kernels and dispatch come together: it has one without the other"
    return None
