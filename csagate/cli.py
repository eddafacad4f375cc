"""The click command group. Subcommands live one per module in ``csagate.commands`` and are
imported only when invoked, so ``--help`` and ``cases`` never import torch or cutlass."""

from __future__ import annotations

import importlib

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
    "reference": "Show the in-place eager reference; --check runs the drift check alone.",
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
def cli():
    """csagate: the numerics contract gate for the CSA compressor kernels.

    Builds the ratio=128 CuTe DSL kernels, checks the in-place reference against the
    production ratio=4 backward, runs the 21 named gates (determinism, tolerance vs fp32,
    fp64-oracle parity, the overflow NaN pattern) and schedule coverage, and reports the
    verdict as a table and through the exit code.
    """
    console.reset()


def main() -> None:
    cli(prog_name="csagate")
