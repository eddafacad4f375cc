"""The report files of ``csagate run`` (``--json``, ``--junit-xml``): checked before anything
runs, written on every exit path. ``bench``, ``compare`` and ``fuzz`` check theirs here too.

A report path is a usage error (exit 2, one line naming the option) when it is empty, names a
directory or an existing file that is not a regular one (``/dev/full``), lies in a directory
that does not exist or is not one, cannot be opened for appending (``/proc/version``, a
read-only folder), or is the path of the other report. ``-`` is stdout: it takes one report of
one family (``--ratio all`` writes one report per family, so it needs a name). ``--report DIR``
must be a folder (or creatable as one) where a file can be created.
"""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path
from time import perf_counter

import click

from csagate import console
from csagate.render import STDOUT


def report_path(path: str | None, ratio: int, several: bool) -> str | None:
    """With ``--ratio all`` each family writes its own report: ``v.json`` -> ``v.r4.json``."""
    if path is None or not several or path == STDOUT:
        return path
    p = Path(path)
    return str(p.with_name(f"{p.stem}.r{ratio}{p.suffix}"))


def _creatable(path: Path) -> str | None:
    """Why ``path`` cannot be written as a report file, or None. Creates nothing that stays:
    a probe file that did not exist is removed again."""
    if path.is_dir():
        return f"{str(path)!r} is a directory"
    if path.exists() and not path.is_file():
        return f"{str(path)!r} is not a regular file (a device, a pipe or a socket)"
    if str(path.resolve()).startswith(("/proc/", "/sys/")):
        return f"{str(path)!r} is a kernel pseudo-file (/proc, /sys), not a report file"
    parent = path.parent
    if not parent.exists():
        return f"directory {str(parent)!r} does not exist"
    if not parent.is_dir():
        return f"{str(parent)!r} is not a directory"
    existed = path.exists()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError as exc:
        why = exc.strerror or errno.errorcode.get(exc.errno, "error")
        return f"cannot create {str(path)!r} ({why})"
    os.close(fd)
    if not existed:
        path.unlink(missing_ok=True)
    return None


def report_dir_problem(directory: Path) -> str | None:
    """Why ``--report DIR`` cannot hold the report (None when it can): not a folder, or no
    file can be created in it or in the folder it would be created in."""
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        return f"{str(directory)!r} exists and is not a directory"
    parent = directory.resolve().parent
    if not directory.exists() and not parent.exists():   # as --json: its folder must exist
        return (f"directory {str(parent)!r} does not exist (the report folder is created, "
                "its parent is not)")
    probe = directory
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        return f"{str(probe)!r} is not a directory, so {str(directory)!r} cannot be created"
    from csagate.kernels.diskcache import write_problem  # stdlib only

    problem = write_problem(probe)
    if problem:
        return problem if probe == directory else \
            f"{str(directory)!r} cannot be created: {problem}"
    return None


def check_report_dir(directory: Path | None, option: str = "--report") -> None:
    if directory is None:
        return
    problem = report_dir_problem(directory)
    if problem:
        raise click.BadParameter(problem, param_hint=option)


def check_report_paths(options: dict[str, str | Path | None], ratios: list[int]) -> None:
    """Every report path of this run can be written, and no two are the same (exit 2); the
    ``--report`` entry is a folder."""
    several = len(ratios) > 1
    seen: dict[str, str] = {}
    for option, given in options.items():
        if given is None:
            continue
        if option == "--report":
            check_report_dir(Path(given), option)
            continue
        if given == "" or not given.strip():
            raise click.BadParameter("an empty path (give a file name, or '-' for stdout)",
                                     param_hint=option)
        if given == STDOUT and several:
            raise click.BadParameter("'-' (stdout) holds one report; --ratio all writes one "
                                     "per family: give a file name", param_hint=option)
        for ratio in ratios:
            path = report_path(given, ratio, several)
            key = STDOUT if path == STDOUT else os.path.realpath(path)
            if key in seen:
                raise click.BadParameter(f"{path!r} is also the path of {seen[key]}: give each "
                                         "report its own file", param_hint=option)
            seen[key] = option
            if path != STDOUT:
                problem = _creatable(Path(path))
                if problem:
                    raise click.BadParameter(problem, param_hint=option)


def checked_file(ctx, param, value):
    """A click callback: a report file (no ``-``) that can be written, else exit 2."""
    if value is None:
        return value
    option = param.opts[0] if param is not None else "--json"
    if value == STDOUT:
        raise click.BadParameter("'-' (stdout) is not taken here: give a file name",
                                 param_hint=option)
    check_report_paths({option: value}, [0])
    return value


class Reports:
    """The ``--json`` / ``--junit-xml`` files of one family's run, written on every exit path:
    the verdict (exit 0/1), or "could not evaluate" with the one-line reason (exit 3)."""

    def __init__(self, json_path: str | None, junit_path: str | None, *, selection: dict,
                 total: int, full: bool, report_dir: Path | None = None,
                 several: bool = False):
        self.json_path, self.junit_path = json_path, junit_path
        # --report DIR: its verdict.json and index.html hold the reason on exit 3
        self.report_dir = None if report_dir is None else \
            Path(report_dir) / (f"r{selection.get('ratio')}" if several else "")
        self.selection, self.total, self.full = selection, total, full
        self.started = perf_counter()
        self.env: dict = known_env()

    def _wrote(self, path: str, what: str) -> None:
        if path == STDOUT:
            console.wrote(f"the {what} report to stdout")
        else:
            console.wrote(path)

    def verdict(self, verdict, extra: dict) -> None:
        from csagate import render

        if self.json_path is not None:
            render.write_json(self.json_path, verdict, extra)
            self._wrote(self.json_path, "JSON")
        if self.junit_path is not None:
            render.write_junit(self.junit_path, verdict)
            self._wrote(self.junit_path, "JUnit XML")

    def could_not_evaluate(self, reason: str) -> None:
        from csagate import render

        seconds = perf_counter() - self.started
        if self.json_path is not None:
            render.write_error_json(
                self.json_path, reason, env=self.env, total=self.total, full=self.full,
                extra={"selection": self.selection, "wall_seconds": {"total": seconds}})
            self._wrote(self.json_path, "JSON")
        if self.junit_path is not None:
            render.write_error_junit(self.junit_path, reason, self.env, seconds,
                                     ratio=self.selection.get("ratio"))
            self._wrote(self.junit_path, "JUnit XML")
        if self.report_dir is not None:
            self.report_dir.mkdir(parents=True, exist_ok=True)
            path = self.report_dir / "verdict.json"
            render.write_error_json(
                path, reason, env=self.env, total=self.total, full=self.full,
                extra={"selection": self.selection, "wall_seconds": {"total": seconds}})
            (self.report_dir / "index.html").write_text(error_page(reason, self.selection))
            self._wrote(str(path), "JSON")


def known_env() -> dict:
    """What is known before a backend exists (no torch/cutlass import: both may be missing)."""
    import platform
    from importlib import metadata

    env = {"python": sys.version.split()[0], "platform": platform.platform()}
    for dist, key in (("torch", "torch"), ("nvidia-cutlass-dsl", "nvidia_cutlass_dsl")):
        try:
            env[key] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            env[key] = "not installed"
    return env


def error_page(reason: str, selection: dict) -> str:
    """The ``--report`` page of a run that could not evaluate: the one-line reason."""
    import html

    title = f"csagate ratio={selection.get('ratio')}: could not evaluate"
    return ("<!doctype html><html><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(title)}</title></head><body>"
            f"<h1 style=\"color:#9a6700\">{html.escape(title)}</h1>"
            f"<p>{html.escape(reason)}</p><p>Nothing was judged (exit 3); "
            "<code>verdict.json</code> holds the reason and the environment.</p>"
            "</body></html>\n")
