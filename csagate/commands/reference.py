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

from csagate import console, options
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
@options.device_option(help_="Where the drift check runs (with --check): cuda or cuda:N (it "
                             "needs the production ratio=4 kernels, so not the CPU).")
def command(check: bool, device) -> None:
    if check:
        _check(device)
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


def _check(device) -> None:
    from csagate import render
    from csagate.gates.errors import CannotEvaluate, Unusable
    from csagate.gates.judging import judging
    from csagate.progress import StderrProgress

    contract = options.contracts("128")[0]
    if device.cpu:
        console.abort("the drift check needs the production ratio=4 kernels: a CUDA GPU, not "
                      "the CPU (nothing was judged)", ExitCode.COULD_NOT_EVALUATE)
    try:
        judged = judging(options.load_impl("csagate"), device)
        console.err().print(f"drift check: {contract.drift.name}")
        with StderrProgress("build") as progress:
            result = judged.drift_check(contract, progress)
    except (Unusable, CannotEvaluate) as exc:
        console.stop(exc, " (nothing was judged)")
    render.print_drift(result, console.out())
    raise click.exceptions.Exit(int(ExitCode.PASS if result.ok else ExitCode.CONTRACT_FAILURE))
