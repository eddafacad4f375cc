"""``--impl`` and ``--report``: the options that pick the implementation a command judges and
where its report goes, checked before any work starts (a bad value is one line, exit 2)."""

from __future__ import annotations

from pathlib import Path

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


def _report(ctx, param, value: Path | None):
    if value is not None:
        if value.exists() and not value.is_dir():
            raise click.BadParameter(f"{str(value)!r} exists and is not a directory",
                                     param_hint="--report")
        if not value.resolve().parent.is_dir():
            raise click.BadParameter(f"directory {str(value.resolve().parent)!r} does not "
                                     "exist", param_hint="--report")
    return value


report_option = click.option(
    "--report", "report_dir", type=click.Path(file_okay=False, path_type=Path),
    callback=_report, metavar="DIR",
    help="Write DIR/verdict.json, one PNG heatmap of the error per failing case and tensor "
         "(needs matplotlib: pip install 'csagate[report]') and DIR/index.html with the "
         "verdict and the pictures.")


def checked_unavailable(impl, device):
    """Why ``impl`` cannot run on ``device`` (None: it can); exit 2 with one line when its own
    check exits or raises another BaseException (as loading it would)."""
    from csagate.gates.implementation import ImplError, unavailable

    try:
        return unavailable(impl, device)
    except ImplError as exc:
        console.abort(f"--impl {exc}", ExitCode.USAGE)


def backends(impl, device_index: int, kernel_backend, impl_backend):
    """(the backend judged, the backend of the drift check): the gate's kernels for both by
    default; exit 3 with one line when ``impl`` cannot run here (2 when its check exits)."""
    from csagate.gates.builtin_impls import Csagate

    drift = kernel_backend(device_index)
    if type(impl) is Csagate:
        return drift, drift
    backend = impl_backend(impl, device_index)
    why = checked_unavailable(impl, backend.device)
    if why:
        console.abort(f"{impl.name}: {why} (nothing was judged)", ExitCode.COULD_NOT_EVALUATE)
    return backend, drift
