"""The click command group. Subcommands live one per module in ``csagate.commands`` and are
imported only when invoked, so ``--help`` and ``cases`` never import torch or cutlass."""

from __future__ import annotations

import importlib
import os
import sys

import click

from csagate import __version__, console
from csagate.exitcodes import ExitCode

COMMANDS = {
    "run": "Run the numerics gate (--ratio 128, 4 or all) on this GPU; report the verdict.",
    "cases": "List the drift check and the named gate cases (--ratio 128, 4 or all).",
    "build": "Compile (or cross-compile) every kernel a ratio can select.",
    "probe": "Register probe: ptxas -v on every kernel's PTX (spills, stack, ex2.approx).",
    "schedules": "Print the ratio=128 dispatch tables and the kernels they can select.",
    "bench": "Benchmark the fused kernels against the eager reference and the roofline.",
    "cache": "The disk cache of compiled kernels: info (where, how many), clear.",
    "reference": "Show the in-place eager reference; --check runs the drift check alone.",
    "impls": "List the implementations --impl can judge here, and why the others cannot.",
    "compare": "Run the same inputs through two implementations (--impl A --impl B).",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return list(COMMANDS)

    def get_command(self, ctx, name):
        if name not in COMMANDS:
            return None
        module = importlib.import_module(f"csagate.commands.{name}")
        return module.command

    def format_commands(self, ctx, formatter):
        rows = [(name, help_) for name, help_ in COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]},
             epilog=ExitCode.help_text())
@click.version_option(__version__, "-V", "--version", prog_name="csagate")
@click.option("--color/--no-color", default=None,
              help="Force or forbid colour [default: on a terminal; NO_COLOR is honoured].")
def cli(color: bool | None):
    """csagate: the numerics contract gate for the CSA compressor kernels.

    Builds the ratio=128 CuTe DSL kernels, checks the in-place reference against the
    production ratio=4 backward, runs the 21 named cases through the gates (G1 determinism,
    G2 tolerance vs fp32, G3 fp64-oracle parity, zeros, the overflow NaN pattern) and schedule
    coverage, and reports the verdict as a table and through the exit code.

    An unexpected error prints one line and exits 3; CSAGATE_DEBUG=1 shows the traceback.
    """
    console.reset(color=color)


def main() -> None:
    """The ``csagate`` entry point: click's usage errors exit 2; any unexpected exception is
    one line on stderr and exit 3 (could not evaluate), with the traceback under
    CSAGATE_DEBUG=1."""
    try:
        cli(prog_name="csagate")
    except Exception as exc:
        if os.environ.get("CSAGATE_DEBUG"):
            raise
        console.err().print(f"csagate: internal error, could not evaluate: "
                            f"{console.one_line(exc)} (CSAGATE_DEBUG=1 shows the traceback)",
                            style="bold red")
        sys.exit(int(ExitCode.COULD_NOT_EVALUATE))
