"""The two consoles: results on stdout, status and progress on stderr. NO_COLOR is honoured."""

from __future__ import annotations

import os
import sys

import click
from rich.console import Console

from csagate.exitcodes import ExitCode

_out: Console | None = None
_err: Console | None = None


def _color() -> bool | None:
    if os.environ.get("NO_COLOR"):
        return False
    return None


def out() -> Console:
    global _out
    if _out is None:
        _out = Console(file=sys.stdout, markup=False, emoji=False, highlight=False,
                       no_color=_color() is False, soft_wrap=False)
    return _out


def err() -> Console:
    global _err
    if _err is None:
        _err = Console(file=sys.stderr, markup=False, emoji=False, highlight=False,
                       no_color=_color() is False, soft_wrap=True)
    return _err


def print_table(table, console: Console | None = None) -> None:
    """Print a table; on a terminal rich fits it, in a log or pipe it keeps its full width."""
    console = console or out()
    if console.is_terminal:
        console.print(table)
        return
    natural = console.measure(table, options=console.options.update(max_width=10_000)).maximum
    width = console.width
    console.width = max(width, natural)
    try:
        console.print(table)
    finally:
        console.width = width


def reset() -> None:
    """Forget the consoles (CliRunner swaps sys.stdout between invocations)."""
    global _out, _err
    _out = _err = None


def abort(message: str, code: ExitCode) -> None:
    """One clear line on stderr, then exit with ``code``: never a traceback."""
    err().print(f"csagate: {message}", style="bold red" if code else None)
    raise click.exceptions.Exit(int(code))
