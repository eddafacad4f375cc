"""The click command group. Subcommands live one per module in ``csagate.commands`` and are
imported only when invoked, so ``--help``, ``cases`` and a rejected ``run --case`` never import
torch or cutlass (the contracts and cases are plain data).

Every subcommand also takes ``--color/--no-color`` (after its name, as well as before it). The
commands that compile kernels first check ``CSAGATE_CACHE_DIR`` (exit 2, one line, when it
cannot be a folder), and a disabled disk cache is one ``csagate: warning:`` line.
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys
import warnings
from pathlib import Path
from typing import NoReturn

import click

from csagate import __version__, console
from csagate.exitcodes import ExitCode
from csagate.gates.errors import one_line


def _ratios_text() -> str:
    """``128, 4, 2, 8, 16, 32 or all``: the families of the contracts registry (plain data)."""
    from csagate.gates.contracts import CONTRACTS

    return ", ".join(str(r) for r in CONTRACTS) + " or all"


COMMANDS = {
    "run": f"Run the numerics gate (--ratio {_ratios_text()}) on this GPU; report the verdict.",
    "cases": "List the drift check and the named gate cases (-v: why each case exists).",
    "build": "Compile (or cross-compile) every kernel a ratio can select.",
    "probe": "Register probe: ptxas -v on every kernel's PTX (spills, stack, ex2.approx).",
    "schedules": "Print the ratio=128 dispatch tables and the kernels they can select.",
    "bench": "Benchmark the fused kernels against the eager reference and the roofline.",
    "cache": "The disk cache of compiled kernels: info (where, how many), clear, prune.",
    "reference": "Show the in-place eager reference; --check runs the drift check alone.",
    "impls": "List the implementations --impl can judge here, and why the others cannot.",
    "compare": "Run the same inputs through two implementations (--impl A --impl B).",
    "fuzz": "Fuzz an implementation with seeded random packs; shrink and save failures.",
}


# The commands that compile kernels: the DSL keeps its PTX under CSAGATE_CACHE_DIR.
COMPILING = ("run", "build", "probe", "bench", "fuzz")


def check_cache_dir() -> None:
    """Exit 2 with one line when ``CSAGATE_CACHE_DIR`` cannot be a folder (a file, a parent
    that is a file, an uncreatable path) or is a folder no file can be created in; the disk
    cache's own rules (a symlink, another
    owner, group/other-writable) only turn it off, with one warning."""
    root = os.environ.get("CSAGATE_CACHE_DIR")
    if root is None:
        return
    if not root.strip():
        console.abort("CSAGATE_CACHE_DIR is set but empty: point it at a folder, or unset it",
                      ExitCode.USAGE)
    from csagate.kernels.diskcache import root_problem

    path = Path(root)
    if os.path.lexists(path) and not path.is_dir():
        console.abort(f"CSAGATE_CACHE_DIR={root} is not a directory: point it at a folder, or "
                      "unset it", ExitCode.USAGE)
    if path.is_dir():
        from csagate.kernels.diskcache import write_problem

        problem = write_problem(path)
        if problem:
            console.abort(f"CSAGATE_CACHE_DIR={root} is not writable: the compiler keeps its "
                          f"PTX there ({problem}); point it at a writable folder, or unset it",
                          ExitCode.USAGE)
    problem = None if path.is_dir() else root_problem(path)
    if problem:
        console.abort(f"CSAGATE_CACHE_DIR={root}: {problem}", ExitCode.USAGE)


def _set_color(ctx, param, value):
    if value is not None:
        console.reset(color=value)


def _color_option() -> click.Option:
    return click.Option(["--color/--no-color"], default=None, expose_value=False,
                        callback=_set_color, help="Force or forbid colour (as before the "
                        "command name).")


def _checked(command: click.Command) -> click.Command:
    """``command`` that checks CSAGATE_CACHE_DIR after parsing, before any work, and ends
    quietly with exit 0 when the reader of its output goes away (click would exit 1)."""
    invoke = command.invoke

    def checked_invoke(ctx):
        check_cache_dir()
        try:
            return invoke(ctx)
        except BrokenPipeError:   # a write outside the consoles (click.echo)
            _closed_pipe()

    command.invoke = checked_invoke
    return command


def check_env() -> None:
    """Exit 2 with one line naming the variable when a csagate environment variable holds a
    value it does not accept (``CSAGATE_DEBUG=maybe``, ``CSAGATE_DISK_CACHE=banana``)."""
    from csagate.kernels.env import EnvError, check_all

    try:
        check_all()
    except EnvError as exc:
        console.abort(str(exc), ExitCode.USAGE)


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return list(COMMANDS)

    def resolve_command(self, ctx, args):
        """An unknown command name is a usage error that names the closest commands."""
        name = args[0] if args else None
        if name is not None and name not in COMMANDS and not name.startswith("-"):
            close = difflib.get_close_matches(name, list(COMMANDS), n=3, cutoff=0.6)
            hint = f" Did you mean {' or '.join(close)}?" if close else ""
            ctx.fail(f"No such command {name!r}.{hint} (`csagate --help` lists them)")
        return super().resolve_command(ctx, args)

    def get_command(self, ctx, name):
        if name not in COMMANDS:
            return None
        module = importlib.import_module(f"csagate.commands.{name}")
        command = module.command
        if not getattr(command, "_csagate_ready", False):
            if not any(p.name == "color" for p in command.params):
                command.params.append(_color_option())
            if name in COMPILING:
                _checked(command)
            command._csagate_ready = True
        return command

    def format_commands(self, ctx, formatter):
        rows = [(name, help_) for name, help_ in COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def _show_warning(message, category, filename, lineno, file=None, line=None):
    """A csagate warning (the disk cache turned off) as one line; any other warning as Python
    shows it."""
    from csagate.kernels.diskcache import CacheWarning

    if issubclass(category, CacheWarning):
        console.warning(str(message))
    else:
        _PYTHON_SHOWWARNING(message, category, filename, lineno, file, line)


_PYTHON_SHOWWARNING = warnings.showwarning


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]},
             epilog=ExitCode.help_text())
@click.version_option(__version__, "-V", "--version", prog_name="csagate")
@click.option("--color/--no-color", default=None,
              help="Force or forbid colour [default: on a terminal; NO_COLOR is honoured].")
def cli(color: bool | None):
    """csagate: the numerics contract gate for the CSA compressor kernels.

    Builds the CuTe DSL kernels, checks the in-place reference against the production ratio=4
    backward, runs the named cases (`csagate cases` lists them) through the gates (G1
    determinism, G2 tolerance vs fp32, G3 fp64-oracle parity, zeros, the overflow NaN
    pattern, the op check), checks schedule coverage and the bucket edges, and reports the
    verdict as a table and through the exit code.

    An unexpected error prints one line and exits 3; CSAGATE_DEBUG=1 shows the traceback
    (the exit code stays 3).
    """
    console.reset(color=color)
    check_env()
    warnings.showwarning = _show_warning


def main() -> None:
    """The ``csagate`` entry point: click's usage errors exit 2; Ctrl-C (KeyboardInterrupt) in
    any command is one line, ``csagate: interrupted``, and exit 130; any unexpected exception
    is one line on stderr and exit 3 (could not evaluate), with the traceback under
    CSAGATE_DEBUG=1 (still exit 3).

    click runs outside its standalone mode so that an interrupt reaches this function instead
    of becoming click's "Aborted!" and exit 1; its usage errors are shown as click shows them.
    """
    from csagate.kernels.env import EnvError, debug

    try:
        code = cli.main(prog_name="csagate", standalone_mode=False)
    except KeyboardInterrupt:
        _interrupted()
    except click.exceptions.Abort as exc:
        if isinstance(exc.__cause__, KeyboardInterrupt):   # click's wrapping of a Ctrl-C
            _interrupted()
        console.err().print("Aborted!")
        sys.exit(1)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except Exception as exc:
        try:
            show = debug()
        except EnvError:  # already refused by the group (exit 2) unless it failed earlier
            show = False
        if show:
            console.err().print_exception()
        else:
            console.err().print(f"csagate: internal error, could not evaluate: "
                                f"{one_line(exc)} (CSAGATE_DEBUG=1 shows the "
                                "traceback)", style="bold red")
        sys.exit(int(ExitCode.COULD_NOT_EVALUATE))
    sys.exit(code if isinstance(code, int) else int(ExitCode.PASS))


def _closed_pipe() -> NoReturn:
    """The reader of stdout went away (``csagate schedules | head -1``): not an error of
    csagate's. Exit 0 without a traceback, stdout pointed at /dev/null so that Python's flush
    at exit does not raise again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    raise click.exceptions.Exit(int(ExitCode.PASS))


def _interrupted() -> NoReturn:
    """Ctrl-C: one line, exit 130; no traceback, no verdict."""
    console.err().print("csagate: interrupted", style="bold red")
    sys.exit(int(ExitCode.INTERRUPTED))
