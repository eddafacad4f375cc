"""``--impl`` and ``--report``: the options that pick the implementation a command judges and
where its report goes, checked before any work starts (a bad value is one line, exit 2); and
:func:`drivers`, where ``run`` and ``fuzz`` find out whether it can be judged on ``--device``
(one preflight, one message) and get the drivers the gate runs it and the drift check with.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from csagate import console
from csagate.exitcodes import ExitCode

IMPL_HELP = ("The implementation judged: a name from `csagate impls` (default: csagate, the "
             "gate's own kernels), path/to/file.py:NAME or module:NAME.")


def load_impl(value: str):
    """The implementation object ``value`` names; ``click.BadParameter`` (exit 2) if none."""
    from csagate.gates.implementation import ImplError, load, resolve

    try:
        return load(resolve(value))
    except ImplError as exc:
        raise click.BadParameter(str(exc), param_hint="--impl") from exc


def _impl(ctx, param, value):
    if isinstance(value, tuple):
        return tuple(load_impl(v) for v in value)
    return load_impl(value)


impl_option = click.option("--impl", "impl", default="csagate", show_default=True,
                           metavar="NAME", callback=_impl, help=IMPL_HELP)


NEEDS_MATPLOTLIB = "needs matplotlib: pip install 'csagate[report]'"


def report_dir_option(help_text: str):
    """``--report DIR`` (``report_dir``) with a command's own ``help_text``; the command
    checks the folder with its other report paths (``report_files.check_report_paths``)
    before any work."""
    return click.option("--report", "report_dir",
                        type=click.Path(file_okay=False, path_type=Path),
                        metavar="DIR", help=help_text)


report_option = report_dir_option(
    "Write DIR/verdict.json, one PNG heatmap of the error per failing case and tensor "
    f"({NEEDS_MATPLOTLIB}) and DIR/index.html with the verdict and the pictures.")


def checked_unavailable(impl, device):
    """Why ``impl`` cannot run on ``device`` (None: it can); exit 2 with one line when its own
    check exits or raises another BaseException (as loading it would)."""
    from csagate.gates.plugin import ImplError, unavailable

    try:
        return unavailable(impl, device)
    except ImplError as exc:
        console.abort(f"--impl {exc}", ExitCode.USAGE)


@dataclass(frozen=True)
class Judged:
    """What a command judges with: the implementation's driver, the drift check's (the gate's
    own kernels; None where it is not run), why the drift check is not run, and where."""

    driver: Any
    drift: Any | None
    drift_na: str | None
    where: int | str            # the CUDA device index, or "cpu"


def preflight(device, kernels):
    """The CUDA device ``device`` names, checked once: it exists (else a usage error, exit 2)
    and ``kernels`` (the gate's own, which the drift check needs) run there, else exit 3 with
    their one-line reason. No GPU is found before cutlass is imported."""
    import torch

    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        if device.index >= count:
            raise click.BadParameter(f"device {device.index} does not exist ({count} CUDA "
                                     f"device(s) visible: 0..{count - 1})",
                                     param_hint="--device")
    where = torch.device("cuda", device.index)
    why = checked_unavailable(kernels, where)
    if why:
        console.abort(f"{why} (nothing was judged)", ExitCode.COULD_NOT_EVALUATE)
    return where


def route(impl, device, kernels=None, where=None) -> Judged:
    """The drivers ``impl`` is judged with on ``device``, no checks made: on the CPU its
    driver and no drift check; on a GPU (``where``, default ``cuda:<index>``) its driver and
    the gate's own kernels' (``kernels``, default the built-in) for the drift check, one driver
    for both when ``impl`` is an instance of their class."""
    import torch

    from csagate.device_choice import DRIFT_NA
    from csagate.gates.driver import Driver
    from csagate.gates.implementation import load_builtin

    if device.cpu:
        return Judged(Driver(impl, torch.device("cpu")), None, DRIFT_NA, "cpu")
    where = where if where is not None else torch.device("cuda", device.index)
    kernels = kernels if kernels is not None else load_builtin()
    if type(impl) is type(kernels):
        driver = Driver(impl, where)
        return Judged(driver, driver, None, device.index)
    return Judged(Driver(impl, where), Driver(kernels, where), None, device.index)


def drivers(impl, device) -> Judged:
    """How ``impl`` is judged on ``device`` (``csagate.device_choice.Device``): the checks
    first, then :func:`route`. On the CPU: exit 3 when it cannot run there. On a GPU: the
    preflight (the gate's own kernels, which the drift check needs), then exit 3 with one line
    when ``impl`` cannot run there (2 when its check exits)."""
    import torch

    from csagate.gates.implementation import load_builtin

    if device.cpu:
        why = checked_unavailable(impl, torch.device("cpu"))
        if why:
            console.abort(f"{impl.name} cannot run on the CPU: {why} (nothing was judged)",
                          ExitCode.COULD_NOT_EVALUATE)
        return route(impl, device)
    kernels = load_builtin()
    where = preflight(device, kernels)
    if type(impl) is not type(kernels):
        why = checked_unavailable(impl, where)
        if why:
            console.abort(f"{impl.name}: {why} (nothing was judged)",
                          ExitCode.COULD_NOT_EVALUATE)
    return route(impl, device, kernels, where)


def require_selftests(device):
    """The gate's known-answer self-tests on ``device`` (``gates.selftest``, once per
    process): exit 3 naming the first wrong answer, before anything is built or judged; a
    line on stderr when they pass."""
    from csagate.gates import selftest

    try:
        tests = selftest.ensure(device)
    except selftest.SelfTestFailed as exc:
        console.abort(str(exc), ExitCode.COULD_NOT_EVALUATE)
    console.err().print(f"self-test {tests.summary} passed on {tests.device} "
                        f"({tests.seconds:.2f} s)", soft_wrap=True)
    return tests


def require_memory(cases, device) -> None:
    """Exit 3 with the numbers when the largest of ``cases`` needs more memory than
    ``device`` has (``gates.memory``), before anything is built or judged."""
    from csagate.gates.memory import too_large

    problem = too_large(cases, device)
    if problem:
        console.abort(f"{problem} (nothing was judged)", ExitCode.COULD_NOT_EVALUATE)
