"""``csagate reference``: show the in-place eager reference; ``--check`` runs the drift check.

The reference is the numerics authority, so it is meant to be read: this prints its source
(syntax-highlighted on a terminal, plain when piped) and where it lives. ``--check`` runs the
gate's first step alone: the production ratio=4 backward against the reference (bitwise
dKV/dScore, dAPE within 1e-3). Exit 0 pass, 1 drift, 3 could not evaluate.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import click

from csagate import console
from csagate.exitcodes import ExitCode

# Printed by ``csagate reference``: where the contract lives (a repository path; docs/ is not in
# the wheel).
CONTRACT_LINE = "docs/CONTRACT.md in the csagate repository (the source of truth)"


def reference_dir() -> Path:
    """The ``reference`` package directory, found without importing it (no torch import)."""
    spec = importlib.util.find_spec("csagate.reference")
    if spec is None or spec.origin is None:
        raise click.ClickException("the reference package is not importable")
    return Path(spec.origin).parent


@click.command("reference", help="Show the in-place eager reference (the numerics authority); "
               "--check runs the reference drift check alone.", epilog=ExitCode.help_text())
@click.option("--check", is_flag=True,
              help="Run the drift check: production ratio=4 backward vs the reference.")
@click.option("--device", "device_index", type=click.IntRange(min=0), default=0,
              show_default=True, help="CUDA device index (with --check).")
def command(check: bool, device_index: int) -> None:
    if check:
        _check(device_index)
        return
    where = reference_dir()
    source = where / "compressor.py"
    out = console.out()
    out.print(f"# reference: {source}")
    out.print(f"# inputs:    {where / 'inputs.py'}")
    out.print(f"# contract:  {CONTRACT_LINE}")
    text = source.read_text()
    if out.is_terminal:
        from rich.syntax import Syntax

        out.print(Syntax(text, "python", line_numbers=True, word_wrap=True))
    else:
        click.echo(text, nl=False)


def _check(device_index: int) -> None:
    from csagate import family_choice
    from csagate.device_choice import Device
    from csagate.impl_choice import drivers, load_impl
    from csagate.progress import StderrProgress

    drift = family_choice.contracts("128")[0].drift
    backend = drivers(load_impl("csagate"), Device("cuda", device_index)).drift

    from csagate import render
    from csagate.gates.backend import BuildError
    from csagate.gates.runner import build_targets, run_drift

    try:
        with StderrProgress("build") as progress:
            backend.build(build_targets((), drift), progress=progress)
    except BuildError as exc:
        console.abort(f"{exc} (nothing was judged)", ExitCode.COULD_NOT_EVALUATE)
    console.err().print(f"drift check: {drift.name}")
    result = run_drift(backend, drift)
    render.print_drift(result, console.out())
    raise click.exceptions.Exit(int(ExitCode.PASS if result.ok else ExitCode.CONTRACT_FAILURE))
