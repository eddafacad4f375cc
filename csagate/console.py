"""The two consoles: results on stdout, status and progress on stderr. NO_COLOR and the root
``--color/--no-color`` are honoured."""

from __future__ import annotations

import os
import sys
from typing import NoReturn

import click
from rich.console import Console
from rich.table import Table

from csagate.exitcodes import ExitCode

_out: Console | None = None
_err: Console | None = None
_force: bool | None = None   # --color / --no-color; None: a terminal decides


def _kwargs() -> dict:
    if _force is False or (_force is None and os.environ.get("NO_COLOR")):
        return {"no_color": True}
    if _force is True:
        return {"force_terminal": True, "no_color": False}
    return {}


def _make(name: str) -> Console:
    """The one Console of stdout (results, kept whole) or stderr (status, soft-wrapped)."""
    stream = sys.stdout if name == "out" else sys.stderr
    return Console(file=stream, markup=False, emoji=False, highlight=False,
                   soft_wrap=name == "err", **_kwargs())


def out() -> Console:
    global _out
    if _out is None:
        _out = _make("out")
    return _out


def err() -> Console:
    global _err
    if _err is None:
        _err = _make("err")
    return _err


def new_table(title: str, columns, *, marks=(), right=()) -> Table:
    """A table whose cells are never cut: ``marks`` (status words, indices, numbers) never wrap
    and keep their width; every other column folds (wraps at spaces, then folds long words)
    instead of eliding with "…". ``right`` columns are right-justified. A header may hold a
    newline to keep a mark column narrow."""
    table = Table(title=title, title_justify="left")
    for col in columns:
        table.add_column(col, justify="right" if col in right else "left",
                         no_wrap=col in marks, overflow="fold")
    return table


def schedule_text(schedule) -> str:
    """Every field of a schedule dataclass, ``name=value`` (booleans T/F), space-separated so
    a narrow column wraps between fields, never inside one."""
    import dataclasses

    if not dataclasses.is_dataclass(schedule):
        return str(schedule)
    values = ((f.name, getattr(schedule, f.name)) for f in dataclasses.fields(schedule))
    return " ".join(f"{name}={('T' if v else 'F') if isinstance(v, bool) else v}"
                    for name, v in values)


def print_table(table, console: Console | None = None) -> None:
    """Print a table at the console's width (the terminal's, else COLUMNS, else 80), never
    cutting a cell: a column that may not wrap (a status word, an index) keeps its full width,
    and every other column folds onto more lines instead of eliding with "…"."""
    console = console or out()
    for column in table.columns:
        if column.overflow == "ellipsis":
            column.overflow = "fold"
        if column.no_wrap:
            cells = [column.header, *column.cells]
            column.min_width = max(console.measure(c).maximum for c in cells)
    console.print(table)


def reset(color: bool | None = None) -> None:
    """Forget the consoles (CliRunner swaps sys.stdout between invocations); ``color``:
    the root ``--color/--no-color`` (None: colour on a terminal unless NO_COLOR is set)."""
    global _out, _err, _force
    _out = _err = None
    _force = color


def one_line(exc: BaseException) -> str:
    """``Type: first line of the message``: how an exception is shown in one line."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


class Aborted(click.exceptions.Exit):
    """What :func:`abort` raises: the exit code, and the one line it printed as ``message``
    (``csagate run`` puts it in the reports of an exit-3 run)."""

    def __init__(self, message: str, code: ExitCode):
        super().__init__(int(code))
        self.message = message


def abort(message: str, code: ExitCode) -> NoReturn:
    """One clear line on stderr, then exit with ``code``: never a traceback."""
    err().print(f"csagate: {message}", style="bold red" if code else None)
    raise Aborted(message, code)
