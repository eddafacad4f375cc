"""``csagate run``: build, drift check, the named gates, coverage, verdict.

``--ratio 128`` (default) runs the ratio=128 contract (21 cases + 3 hardening cases),
``--ratio 4`` the production ratio=4 kernels' contract, ``--ratio all`` both, one after the
other, and exits with the worse code. Status and progress go to stderr, the verdict table to
stdout. Exit 0 pass, 1 contract failure, 2 usage error, 3 could not evaluate (no GPU, no
nvidia-cutlass-dsl, a build failure): the exit-3 checks run before cutlass is imported and
each prints one line.

By default the gate judges its own kernels (``csagate.gates.backend.KernelBackend``);
``--impl`` judges another implementation (``csagate impls``) against the same contract, the
drift check still judging the reference with the gate's kernels. ``contracts``,
``preflight``, ``kernel_backend`` and ``impl_backend`` are module-level functions so the CLI
tests can stand in for the GPU.
"""

from __future__ import annotations

import difflib
import os
import sys
from pathlib import Path
from time import perf_counter

import click

from csagate import __version__, console
from csagate.exitcodes import ExitCode
from csagate.impl_choice import impl_option, report_option

QUICK_CASES = 2
DSL_PIN = "nvidia-cutlass-dsl==4.8.1"


RATIOS = ("128", "2", "4", "8", "16", "32", "all")  # gates.contracts.CONTRACTS, and all


def contracts(ratio: str):
    """The contract families ``--ratio`` names (``all``: every family, ratio=128 first)."""
    from csagate.gates.contracts import CONTRACTS

    return tuple(CONTRACTS.values()) if ratio == "all" else (CONTRACTS[int(ratio)],)


def preflight(device_index: int) -> None:
    """Exit 3 with one line unless a supported CUDA GPU and the DSL are here (GPU checked first,
    before cutlass is imported)."""
    import torch

    if not torch.cuda.is_available():
        built = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU only"
        console.abort(f"no CUDA GPU visible (torch {torch.__version__}, {built}): nothing can be "
                      "evaluated; run on a machine with an NVIDIA H200 (sm_90a) or B200 "
                      "(sm_100a) and a CUDA build of torch", ExitCode.COULD_NOT_EVALUATE)
    count = torch.cuda.device_count()
    if device_index >= count:
        raise click.BadParameter(f"device {device_index} does not exist ({count} CUDA "
                                 f"device(s) visible: 0..{count - 1})", param_hint="--device")
    from csagate.kernels._dsl import ARCHES, device_arch, dsl_available

    arch = device_arch(device_index)
    if arch not in ARCHES:
        name = torch.cuda.get_device_name(device_index)
        console.abort(f"{name} is {arch}; the kernels are built for {', '.join(ARCHES)} "
                      "(H200, B200): run on one of those", ExitCode.COULD_NOT_EVALUATE)
    ok, why = dsl_available()
    if not ok:
        console.abort(f"{why}; install it with `pip install {DSL_PIN}`",
                      ExitCode.COULD_NOT_EVALUATE)


def kernel_backend(device_index: int):
    from csagate.gates.backend import KernelBackend

    return KernelBackend(device_index)


def impl_backend(impl, device_index: int):
    """The gate's backend for an ``--impl`` implementation on this device."""
    import torch

    from csagate.gates.implementation import as_backend

    return as_backend(impl, torch.device("cuda", device_index))


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


def _check_names(ctx, param, names):
    if not names:
        return names
    valid = [c.name for k in contracts(ctx.params.get("ratio", "128")) for c in k.all_cases]
    for name in names:
        if name not in valid:
            close = difflib.get_close_matches(name, valid, n=3)
            hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            raise click.BadParameter(
                f"unknown case {name!r}.{hint} Valid names (`csagate cases`): "
                + ", ".join(valid))
    return names


def _select(cases, names, quick):
    if quick:
        return tuple(cases[:QUICK_CASES])
    if names:
        return tuple(c for c in cases if c.name in set(names))  # contract order
    return tuple(cases)


class Reports:
    """The ``--json`` / ``--junit-xml`` files of one run, written on every exit path: the verdict
    (exit 0/1), or "could not evaluate" with the one-line reason (exit 3)."""

    def __init__(self, json_path: Path | None, junit_path: Path | None, *, selection: dict,
                 total: int, full: bool):
        self.json_path, self.junit_path = json_path, junit_path
        self.selection, self.total, self.full = selection, total, full
        self.started = perf_counter()
        self.env: dict = _known_env()

    def _wrote(self, path: Path) -> None:
        console.err().print(f"wrote {path}")

    def verdict(self, verdict, extra: dict) -> None:
        from csagate import render

        if self.json_path is not None:
            render.write_json(self.json_path, verdict, extra)
            self._wrote(self.json_path)
        if self.junit_path is not None:
            render.write_junit(self.junit_path, verdict)
            self._wrote(self.junit_path)

    def could_not_evaluate(self, reason: str) -> None:
        from csagate import render

        seconds = perf_counter() - self.started
        if self.json_path is not None:
            render.write_error_json(
                self.json_path, reason, env=self.env, total=self.total, full=self.full,
                extra={"csagate_version": __version__, "selection": self.selection,
                       "wall_seconds": {"total": seconds}})
            self._wrote(self.json_path)
        if self.junit_path is not None:
            render.write_error_junit(self.junit_path, reason, self.env, seconds)
            self._wrote(self.junit_path)


def _known_env() -> dict:
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


def _report_path(path: Path | None, ratio: int, several: bool) -> Path | None:
    """With ``--ratio all`` each family writes its own report: ``v.json`` -> ``v.r4.json``."""
    if path is None or not several:
        return path
    return path.with_name(f"{path.stem}.r{ratio}{path.suffix}")


@click.command("run", help="Run the numerics gate on this GPU: the drift check, the named cases "
               "through the gates (G1 determinism, G2 tolerance, G3 fp64 parity, zeros), the "
               "hardening cases, schedule coverage and bucket edges. The verdict has one mark "
               "per gate and case; -v adds the numbers. --json/--junit-xml are written on every "
               "exit path (exit 3: a \"could not evaluate\" report with the reason).",
               epilog=ExitCode.help_text())
@click.option("--ratio", type=click.Choice(RATIOS), default="128", show_default=True,
              is_eager=True,  # --case names are checked against the ratio's cases
              help="The contract family: 128 (21 cases + 3 hardening), 4 (the production "
                   "ratio=4 kernels), 2, 8, 16, 32 (the other small ratios), or all (every "
                   "family; the worse exit code).")
@click.option("--case", "names", multiple=True, metavar="NAME", callback=_check_names,
              help="Run only this named case (repeatable; `csagate cases` lists them). "
                   "Coverage is then not asserted.")
@click.option("--quick", is_flag=True,
              help=f"Drift check and the first {QUICK_CASES} cases only (coverage not asserted).")
@click.option("--device", "device_index", type=click.IntRange(min=0), default=0,
              show_default=True, help="CUDA device index.")
@click.option("-v", "--verbose", is_flag=True,
              help="Also print the detail tables: schedules, differing elements / max |diff| "
                   "per tensor, dAPE max, seconds per case.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write every recorded number, per case, and the environment to this file "
                   "(--ratio all: one file per family, NAME.r128.json and NAME.r4.json).")
@click.option("--junit-xml", "junit_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write a JUnit XML report (one testcase per named case) to this file.")
@impl_option
@report_option
def command(ratio: str, names: tuple[str, ...], quick: bool, device_index: int, verbose: bool,
            json_path: Path | None, junit_path: Path | None, impl, report_dir) -> None:
    if quick and names:
        raise click.UsageError("--quick and --case are exclusive: --quick already picks the "
                               f"first {QUICK_CASES} cases")
    for path, hint in ((json_path, "--json"), (junit_path, "--junit-xml")):
        if path is not None and not path.resolve().parent.is_dir():
            raise click.BadParameter(f"directory {str(path.resolve().parent)!r} does not exist",
                                     param_hint=hint)
    started = perf_counter()
    families = [(k, _select(k.all_cases, names, quick)) for k in contracts(ratio)]
    families = [(k, cases) for k, cases in families if cases or not names]
    several = len(families) > 1
    reports = {}
    for k, cases in families:
        selection = {"ratio": k.ratio, "requested": ratio, "quick": quick, "cases": list(names),
                     "device": device_index, "impl": impl.name}
        reports[k.ratio] = Reports(_report_path(json_path, k.ratio, several),
                                   _report_path(junit_path, k.ratio, several),
                                   selection=selection, total=len(cases),
                                   full=len(cases) == len(k.all_cases))
    try:
        code = _evaluate(families, device_index, reports, verbose, started, impl, report_dir)
    except console.Aborted as exc:
        if exc.exit_code == ExitCode.COULD_NOT_EVALUATE:
            for rep in reports.values():
                rep.could_not_evaluate(exc.message)
        raise
    except (click.ClickException, click.exceptions.Exit):
        raise  # a usage error (--device out of range): no report, exit 2
    except Exception as exc:  # anything else: still a report, still exit 3
        if os.environ.get("CSAGATE_DEBUG"):
            console.err().print_exception()
        message = f"could not evaluate: {console.one_line(exc)}"
        console.err().print(f"csagate: {message}", style="bold red")
        for rep in reports.values():
            rep.could_not_evaluate(message)
        raise click.exceptions.Exit(int(ExitCode.COULD_NOT_EVALUATE)) from exc
    raise click.exceptions.Exit(int(code))


def _evaluate(families, device_index: int, reports: dict, verbose: bool, started: float,
              impl, report_dir: Path | None) -> ExitCode:
    """Preflight, build, then each family's gate, verdict and reports; the worse exit code.
    Exit 3 goes through ``console.abort``."""
    preflight(device_index)

    from csagate import render
    from csagate.gates.backend import BuildError, one_line
    from csagate.gates.runner import build_targets, run_gate
    from csagate.impl_choice import backends

    err = console.err()
    backend, drift_backend = backends(impl, device_index, kernel_backend, impl_backend)
    env = backend.describe()
    for rep in reports.values():
        rep.env.update(env)
    err.print(f"csagate {__version__}: {env.get('gpu', env.get('device', '?'))} "
              f"({env.get('arch', '?')}), torch {env.get('torch', '?')}, "
              f"nvidia-cutlass-dsl {env.get('nvidia_cutlass_dsl', '?')}")
    build_start = perf_counter()
    targets: list = []
    for k, cases in families:
        targets += [t for t in build_targets(cases, k.drift) if t not in targets]
    drift_targets = targets if backend is drift_backend else \
        list(dict.fromkeys(t for k, _ in families for t in build_targets((), k.drift)))
    try:
        with StderrProgress("build") as progress:
            records = drift_backend.build(tuple(drift_targets), progress=progress)
            if backend is not drift_backend:
                records += backend.build(tuple(targets), progress=progress)
    except BuildError as exc:
        console.abort(f"{exc} (nothing was judged)", ExitCode.COULD_NOT_EVALUATE)
    build_seconds = perf_counter() - build_start
    hits = sum(1 for r in records if getattr(r, "hit", False))
    err.print(f"built {len(records)} kernel(s) ({hits} from the cache) for {len(targets)} "
              f"config(s) in {build_seconds:.1f} s")

    code = ExitCode.PASS
    several = len(families) > 1
    for k, cases in families:
        try:
            with StderrProgress(f"gate ratio={k.ratio}" if several else "gate") as progress:
                verdict = run_gate(backend, k, cases=cases, progress=progress,
                                   drift_backend=drift_backend)
        except Exception as exc:  # the gate itself broke (cases that raise are FAIL rows)
            if os.environ.get("CSAGATE_DEBUG"):
                err.print_exception()
            console.abort(f"the gate could not finish: {one_line(exc)}",
                          ExitCode.COULD_NOT_EVALUATE)
        render.print_verdict(verdict, console.out(), verbose=verbose)
        from csagate.where import print_where

        print_where(verdict, console.out())
        rep = reports[k.ratio]
        extra = {
            "csagate_version": __version__,
            "selection": rep.selection,
            "env": {"python": sys.version.split()[0]},
            "seeds": _seeds(),
            "build": {"targets": [list(t) for t in targets], "kernels": len(records),
                      "cache_hits": hits, "seconds": build_seconds, "records": records},
            "wall_seconds": {"build": build_seconds, "gate": verdict.seconds,
                             "total": perf_counter() - started},
        }
        rep.verdict(verdict, extra)
        if report_dir is not None:
            from csagate.report import write_report

            for line in write_report(report_dir, verdict, extra, several=several):
                err.print(line)
        if not verdict.ok:
            code = ExitCode.CONTRACT_FAILURE
    return code


def _seeds() -> dict[str, int]:
    from csagate.reference.inputs import GRAD_SEED, INPUT_SEED, PAD_GRAD_SEED, PAD_TOKEN_SEED

    return {"input": INPUT_SEED, "grad": GRAD_SEED, "pad_grad": PAD_GRAD_SEED,
            "pad_token": PAD_TOKEN_SEED}
