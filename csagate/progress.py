"""Progress on stderr for the commands that build, judge or fuzz: a bar on a terminal, plain
status lines when stderr is a log. ``StderrProgress`` takes ``(done, total, label)`` calls (the
gate, the fuzz loop, a backend's build); ``progress_bar`` is the rich bar of ``build`` and
``probe``, one task per kernel list."""

from __future__ import annotations

from csagate import console


class StderrProgress:
    """A progress bar on a terminal's stderr; one status line per call when stderr is a log.

    Called as ``(done, total, label)``: ``done`` items finished, ``label`` the latest step.
    """

    def __init__(self, title: str):
        self.title = title
        self.err = console.err()
        self._bar = None
        self._task = None

    def __enter__(self):
        if self.err.is_terminal:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self._bar = Progress(TextColumn(self.title), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TextColumn("{task.description}"),
                                 console=self.err, transient=True)
            self._bar.__enter__()
            self._task = self._bar.add_task("", total=None)
        return self

    def __call__(self, done: int, total: int, label: str) -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=done, total=total, description=label)
        else:
            self.err.print(f"{self.title} [{done}/{total}] {label}")

    def __exit__(self, *exc):
        if self._bar is not None:
            self._bar.__exit__(*exc)
        return False


def progress_bar(total: int, what: str):
    """A rich progress bar on stderr when it is a terminal; otherwise one status line."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    err = console.err()
    if not err.is_terminal:
        err.print(f"{what}: {total} kernels")
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                    TextColumn("{task.fields[tag]}"), console=err, transient=True,
                    disable=not err.is_terminal)
