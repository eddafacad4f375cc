"""Every option two commands share, defined once: ``--ratio``, ``--impl``, ``--device``,
``--arch``, the report options (``--json PATH``, ``--junit-xml PATH``, ``--report DIR``) and the
listing flag (``--json``), with one spelling, one set of choices in one order and one
validation wherever they appear; and the float type that refuses NaN and infinity. No torch at
parse time: the contracts and cases are plain data.

``contracts`` is looked up as an attribute of this module by every command, so the CLI tests
can pick small contracts in one place.
"""

from __future__ import annotations

import difflib
import math
from pathlib import Path

import click

from csagate import console
from csagate.exitcodes import ExitCode
from csagate.gates.contracts import CONTRACTS  # plain data: no torch
from csagate.gates.judging import parse_device
from csagate.kernels.schedule import ARCHES

# --- numbers ---------------------------------------------------------------------------------


class FiniteFloat(click.ParamType):
    """A finite float in [``low``, ``high``] (``low_open``: above ``low``). ``click.FloatRange``
    lets NaN through every bound (every comparison with it is false)."""

    name = "float"

    def __init__(self, low: float | None = None, high: float | None = None, *,
                 low_open: bool = False):
        self.low, self.high, self.low_open = low, high, low_open

    def convert(self, value, param, ctx):
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        if self.low is not None and (number <= self.low if self.low_open else
                                     number < self.low):
            self.fail(f"{value!r} must be {'>' if self.low_open else '>='} {self.low:g}",
                      param, ctx)
        if self.high is not None and number > self.high:
            self.fail(f"{value!r} must be <= {self.high:g}", param, ctx)
        return number


# --- --ratio and --case: the contract families ----------------------------------------------

# One order everywhere: the contract families as CONTRACTS lists them (128, then the small
# ratios ascending); the kernel families serve the same ratios.
RATIOS = (*(str(r) for r in CONTRACTS), "all")


def contracts(ratio: str):
    """The contract families ``--ratio`` names (``all``: every family, in CONTRACTS' order)."""
    if ratio == "all":
        return tuple(CONTRACTS.values())
    return (CONTRACTS[int(ratio)],)


def ratios_of(ratio: str) -> tuple[int, ...]:
    """The ratios ``--ratio`` names, in the one order."""
    return tuple(CONTRACTS) if ratio == "all" else (int(ratio),)


def ratio_option(default: str, help_: str, *, eager: bool = False):
    """``--ratio R|all``: the families a command works on (its default and what it does with
    them are the command's; the choices and their order are the same everywhere). ``eager``:
    parsed first, so ``--case`` names are checked against the family it picks."""
    return click.option("--ratio", type=click.Choice(RATIOS), default=default,
                        show_default=True, is_eager=eager, help=help_)


def case_counts(contract) -> str:
    """``21 + 3 hardening + 4 deterministic cases``: a family's counts, from its data."""
    parts = [str(len(contract.cases))]
    parts += [f"{len(extra)} {word}"
              for extra, word in ((contract.hardening, "hardening"),
                                  (contract.deterministic_cases, "deterministic")) if extra]
    return " + ".join(parts) + " cases"


def unknown_case_message(name: str, valid: list[str], elsewhere: list[str]) -> str:
    """An unknown ``--case``: up to three close names (of this family, else of another one,
    with the ``--ratio`` that has it), never the whole list."""
    close = difflib.get_close_matches(name, valid, n=3)
    text = f"unknown case {name!r}."
    if name in elsewhere:
        return text + " It is a case of another family: add --ratio all (or its ratio)."
    if not close:
        close = difflib.get_close_matches(name, elsewhere, n=3)
        if close:
            return (text + f" Did you mean {', '.join(repr(c) for c in close)} (another "
                    "family: --ratio all)? See `csagate cases --ratio all`.")
        return text + " See `csagate cases` for the names."
    return text + f" Did you mean {', '.join(repr(c) for c in close)}? See `csagate cases`."


def check_case_names(names, ratio: str, param_hint: str | None = None) -> None:
    """A usage error (exit 2) naming the first of ``names`` that is no case of the families
    ``ratio`` picks."""
    chosen = contracts(ratio)
    valid = [c.name for k in chosen for c in k.all_cases]
    elsewhere = [c.name for k in contracts("all") if k not in chosen for c in k.all_cases]
    for name in names:
        if name not in valid:
            raise click.BadParameter(unknown_case_message(name, valid, elsewhere),
                                     param_hint=param_hint)


# --- --impl -------------------------------------------------------------------------------------

IMPL_HELP = ("The implementation judged: a name from `csagate impls` (default: csagate, the "
             "gate's own kernels), path/to/file.py:NAME or module:NAME.")


def load_impl(value: str, *, check: bool = True):
    """The implementation object ``value`` names, loaded once; ``click.BadParameter`` (exit
    2) when it cannot be loaded or (``check``) does not keep the protocol
    (``plugin.conformance``), as ``csagate impls --impl`` checks it."""
    from csagate.gates.implementation import load, resolve
    from csagate.gates.plugin import ImplError, conformance

    try:
        impl = load(resolve(value))
    except ImplError as exc:
        raise click.BadParameter(str(exc), param_hint="--impl") from exc
    problem = conformance(impl) if check else None
    if problem:
        raise click.BadParameter(f"{value}: {problem}", param_hint="--impl")
    return impl


IMPL_SPEC = "csagate.impl_spec"   # ctx.meta: the --impl value as given (replay commands)


def _impl(ctx, param, value):
    ctx.meta[IMPL_SPEC] = value
    if isinstance(value, tuple):
        return tuple(load_impl(v) for v in value)
    return load_impl(value)


def impl_spec() -> str:
    """The ``--impl`` value of the running command as the user gave it."""
    return click.get_current_context().meta[IMPL_SPEC]


def impl_option(*, multiple: bool = False, help_: str = IMPL_HELP):
    """``--impl NAME``: loaded and checked when parsed (a bad one is exit 2 before any work);
    ``multiple``: repeatable, no default (``compare``)."""
    if multiple:
        return click.option("--impl", "impl", multiple=True, required=True, metavar="NAME",
                            callback=_impl, help=help_)
    return click.option("--impl", "impl", default="csagate", show_default=True,
                        metavar="NAME", callback=_impl, help=help_)


# --- --device -----------------------------------------------------------------------------------


class DeviceType(click.ParamType):
    """``cpu``, ``cuda``, ``cuda:N`` or ``N``: a :class:`~csagate.gates.judging.Device`."""

    name = "device"

    def convert(self, value, param, ctx):
        try:
            return parse_device(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)

    def get_metavar(self, param, ctx=None):
        return "cpu|cuda[:N]"


DEVICE_HELP = ("Where to judge: cuda, cuda:N or N (a CUDA device, named in the header and "
               "reports), or cpu (a CPU-capable implementation against the references; the "
               "drift check, which needs the production kernels, is then not run).")


def device_option(default: str = "cuda:0", help_: str = DEVICE_HELP):
    return click.option("--device", "device", type=DeviceType(), default=default,
                        show_default=True, help=help_)


# --- --arch (build, probe) ------------------------------------------------------------------

FALLBACK_ARCH = "sm_100a"
ARCH_HELP = ("Build target [default: this machine's GPU (sm_90a on an H100 or H200, sm_100a on a "
             f"B200); with no supported GPU, {FALLBACK_ARCH}]. No GPU is needed to "
             "cross-compile.")


def arch_option(fn):
    return click.option("--arch", type=click.Choice(ARCHES), default=None, help=ARCH_HELP)(fn)


def gpu_arch() -> str | None:
    """The build target of the current GPU; None without one (or one we do not build for)."""
    import torch

    if not torch.cuda.is_available():
        return None
    from csagate.kernels._dsl import device_arch

    arch = device_arch()
    return arch if arch in ARCHES else None


def resolve_arch(arch: str | None) -> str:
    """``--arch`` of `build` and `probe`: as given, else this machine's GPU's, else sm_100a
    (said on stderr, so a cross-compile is never silent)."""
    if arch is not None:
        return arch
    found = gpu_arch()
    if found is not None:
        return found
    console.err().print(f"no supported GPU here: cross-compiling for {FALLBACK_ARCH} "
                        "(--arch sm_90a for an H100 or H200)")
    return FALLBACK_ARCH


KERNEL_RATIO_HELP = ("The kernel families: a ratio, or all. The small ratios (2, 4, 8, 16, 32): "
                     "the coff 1/2 x d 65/128/512 they serve (vec=1, vec=2, drift d); ratio=128: "
                     "the kernels of the dispatch tables.")


def keys_of(ratio: str, arch: str) -> list:
    """Every kernel key of the families ``--ratio`` names, for ``arch``, in build order."""
    from csagate.kernels.registry import keys_for, sort_keys

    return sort_keys({key for r in ratios_of(ratio) for key in keys_for(r, arch)})


def require_dsl() -> None:
    """Exit 3 with one line when nvidia-cutlass-dsl does not import."""
    from csagate.kernels._dsl import dsl_available

    ok, why = dsl_available()
    if not ok:
        console.abort(why, ExitCode.COULD_NOT_EVALUATE)


# --- the report options ---------------------------------------------------------------------

NEEDS_MATPLOTLIB = "needs matplotlib: pip install 'csagate[report]'"


def json_option(help_: str, callback=None):
    """``--json PATH`` ('-': stdout): a report file, checked with the command's other report
    paths (``report_files.check_report_paths``) before any work, or by ``callback``."""
    return click.option("--json", "json_path", metavar="PATH", callback=callback, help=help_)


def junit_option(help_: str):
    """``--junit-xml PATH`` ('-': stdout), checked like ``--json``."""
    return click.option("--junit-xml", "junit_path", metavar="PATH", help=help_)


def report_option(help_: str):
    """``--report DIR``: a folder that exists or can be created (its parent must exist, as a
    report file's must), where a file can be created; checked with the other report paths."""
    return click.option("--report", "report_dir",
                        type=click.Path(file_okay=False, path_type=Path), metavar="DIR",
                        help=help_)


def json_flag(help_: str):
    """``--json`` of the listing commands: print what they list as JSON on stdout."""
    return click.option("--json", "as_json", is_flag=True, help=help_)

