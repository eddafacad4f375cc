"""The two consoles: results on stdout, status and progress on stderr. NO_COLOR and the root
``--color/--no-color`` are honoured."""

from __future__ import annotations

import os
import sys
import textwrap
from typing import NoReturn

import click
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

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


class _Console(Console):
    """A rich Console whose closed pipe (``csagate schedules | head -1``: the reader went away)
    is the end of the output, not an error: exit 0 quietly (rich's own exits 1)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self.file.fileno())
        raise SystemExit(int(ExitCode.PASS))


def _make(name: str) -> Console:
    """The one Console of stdout (results, kept whole) or stderr (status, soft-wrapped)."""
    stream = sys.stdout if name == "out" else sys.stderr
    return _Console(file=stream, markup=False, emoji=False, highlight=False,
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


def new_table(title: str, columns, *, marks=(), right=(), names=(), compact=False) -> Table:
    """A table whose cells are never cut: ``marks`` (status words, indices, numbers) never wrap
    and keep their width; ``names`` (case names, the strings ``--case`` takes) are never split
    either: the column is as wide as its longest name, and only :func:`prose` cells in it wrap;
    every other column folds (wraps at spaces, then folds long words) instead of eliding with
    "…". ``right`` columns are right-justified. A header may hold a newline to keep a mark
    column narrow. ``compact``: no vertical rules (a header rule only), two spaces between
    columns, so a long name and every mark fit 80 columns."""
    style = {"box": box.SIMPLE_HEAD, "show_edge": False, "pad_edge": False,
             "collapse_padding": True} if compact else {}
    table = Table(title=title, title_justify="left", **style)
    for col in columns:
        table.add_column(col, justify="right" if col in right else "left",
                         no_wrap=col in marks or col in names, overflow="fold")
        if col in names:
            table.columns[-1].meta = {"names": True}
    return table


def prose(text: str, style: str = "") -> Text:
    """A cell of running text (a case's ``why``) that wraps inside a ``names`` column."""
    return Text(text, style=style, no_wrap=False, overflow="fold")


class Ident:
    """A table cell holding an identifier (a kernel tag) that a narrow column breaks only
    after a ``sep`` (``fwd_c1d128_`` / ``v4t4x32_fastexp``), never inside a word; a word
    wider than the column alone folds."""

    def __init__(self, text: str, sep: str = "_", style: str = ""):
        self.text, self.sep, self.style = text, sep, style

    def parts(self) -> list[str]:
        pieces = self.text.split(self.sep)
        return [p + self.sep for p in pieces[:-1]] + [pieces[-1]]

    def lines(self, width: int) -> list[str]:
        """The parts packed greedily into lines of at most ``width`` cells."""
        from rich.cells import cell_len

        lines = [""]
        for part in self.parts():
            if lines[-1] and cell_len(lines[-1] + part) > width:
                lines.append("")
            lines[-1] += part
        return lines

    def __str__(self) -> str:
        return self.text

    def __rich_measure__(self, console, options):
        from rich.cells import cell_len
        from rich.measure import Measurement

        widest = max(cell_len(p) for p in self.parts())
        return Measurement(widest, cell_len(self.text)).with_maximum(options.max_width)

    def __rich_console__(self, console, options):
        yield Text("\n".join(self.lines(options.max_width)), style=self.style,
                   overflow="fold")


def schedule_text(schedule) -> str:
    """Every field of a schedule dataclass, ``name=value`` (booleans T/F), space-separated so
    a narrow column wraps between fields, never inside one."""
    import dataclasses

    if not dataclasses.is_dataclass(schedule):
        return str(schedule)
    values = ((f.name, getattr(schedule, f.name)) for f in dataclasses.fields(schedule))
    return " ".join(f"{name}={('T' if v else 'F') if isinstance(v, bool) else v}"
                    for name, v in values)


def _is_prose(cell) -> bool:
    return isinstance(cell, Text) and cell.no_wrap is False


def _fix_widths(table, console: Console) -> None:
    """The widths ``print_table`` gives the columns that may not wrap."""
    for column in table.columns:
        if column.overflow == "ellipsis":
            column.overflow = "fold"
        if column.no_wrap:
            cells = [c for c in (column.header, *column.cells) if not _is_prose(c)]
            column.min_width = max(console.measure(c).maximum for c in cells)
            if getattr(column, "meta", None):
                column.max_width = column.min_width


def table_fits(table, console: Console) -> bool:
    """Whether ``table`` fits the console's width with every column that may not wrap (names,
    marks, numbers) whole: its width laid out on an unbounded line."""
    import io

    from rich.cells import cell_len

    wide = Console(file=io.StringIO(), width=10_000, color_system=None, markup=False,
                   emoji=False, highlight=False)
    _fix_widths(table, wide)
    wide.print(table)
    needed = max((cell_len(line.rstrip()) for line in wide.file.getvalue().splitlines()),
                 default=0)
    return needed <= console.width


def print_table(table, console: Console | None = None) -> None:
    """Print a table at the console's width (the terminal's, else COLUMNS, else 80), never
    cutting a cell: a column that may not wrap (a status word, an index) keeps its full width,
    a names column is exactly as wide as its longest name (its prose cells wrap), and every
    other column folds onto more lines instead of eliding with "…"."""
    console = console or out()
    _fix_widths(table, console)
    console.print(table)


def reset(color: bool | None = None) -> None:
    """Forget the consoles (CliRunner swaps sys.stdout between invocations); ``color``:
    the root ``--color/--no-color`` (None: colour on a terminal unless NO_COLOR is set)."""
    global _out, _err, _force
    _out = _err = None
    _force = color


class Aborted(click.exceptions.Exit):
    """What :func:`abort` raises: the exit code, and the one line it printed as ``message``
    (``csagate run`` puts it in the reports of an exit-3 run)."""

    def __init__(self, message: str, code: ExitCode):
        super().__init__(int(code))
        self.message = message


def abort(message: str, code: ExitCode) -> NoReturn:
    """One clear message on stderr (wrapped at the console's width), then exit with ``code``:
    never a traceback."""
    print_wrapped(err(), f"csagate: {message}", style="bold red" if code else None)
    raise Aborted(message, code)


def stop(exc: Exception, suffix: str = "") -> NoReturn:
    """The one line and the exit code of what stopped the gate before a verdict: a usage
    error (``gates.errors.Unusable``, an adapter's ``ImplError``: exit 2) or nothing can be
    judged here (``gates.errors.CannotEvaluate``: exit 3, ``suffix`` appended)."""
    from csagate.gates.errors import CannotEvaluate

    if isinstance(exc, CannotEvaluate):
        abort(f"{exc}{suffix}", ExitCode.COULD_NOT_EVALUATE)
    abort(str(exc), ExitCode.USAGE)


def print_wrapped(console: Console, text: str, style: str | None = None, *, indent: str = "",
                  hang: str = "  ") -> None:
    """``text`` wrapped at the console's width (never cut), continuation lines under ``hang``."""
    width = max(console.width, 20)
    lines = textwrap.wrap(text, width=width, initial_indent=indent, subsequent_indent=hang,
                          break_on_hyphens=False, break_long_words=False) or [""]
    for line in lines:
        console.print(Text(line, style=style or ""), soft_wrap=True)


def wrote(what) -> None:
    """``wrote PATH`` on stderr: a path too long for the line goes whole to the next one."""
    print_wrapped(err(), f"wrote {what}")


def warning(message: str) -> None:
    """One ``csagate: warning:`` message on stderr (what a library warning becomes)."""
    print_wrapped(err(), f"csagate: warning: {message}", style="yellow")
