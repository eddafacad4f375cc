"""``csagate run``: build, drift check, the 21 named gates, coverage, verdict.

Status and progress go to stderr, the verdict table to stdout. Exit 0 pass, 1 contract failure,
2 usage error, 3 could not evaluate (no GPU, no nvidia-cutlass-dsl, a build failure): the
exit-3 checks run before cutlass is imported and each prints one line.

The gate only ever judges the real kernels (``csagate.gates.backend.KernelBackend``): no option here
selects anything else. ``contract``, ``preflight`` and ``kernel_backend`` are module-level
functions so the CLI tests can stand in for the GPU.
"""

from __future__ import annotations

import difflib
import sys
from pathlib import Path
from time import perf_counter

import click

from csagate import __version__, console
from csagate.exitcodes import ExitCode

QUICK_CASES = 2
DSL_PIN = "nvidia-cutlass-dsl==4.8.1"


def contract():
    """The drift case and the 21 named cases, in the contract's order."""
    from csagate.gates.cases import CASES, DRIFT

    return DRIFT, CASES


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
    _, cases = contract()
    valid = [c.name for c in cases]
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


@click.command("run", help="Run the ratio=128 numerics gate on this GPU: drift check, the 21 "
               "named gates (G1 determinism, G2 tolerance, G3 fp64 parity), schedule coverage.",
               epilog=ExitCode.help_text())
@click.option("--ratio", type=click.Choice(["128"]), default="128", show_default=True,
              help="The contract family (the gate is defined for ratio=128).")
@click.option("--case", "names", multiple=True, metavar="NAME", callback=_check_names,
              help="Run only this named case (repeatable; `csagate cases` lists them). "
                   "Coverage is then not asserted.")
@click.option("--quick", is_flag=True,
              help=f"Drift check and the first {QUICK_CASES} cases only (coverage not asserted).")
@click.option("--device", "device_index", type=click.IntRange(min=0), default=0,
              show_default=True, help="CUDA device index.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write every recorded number, per case, and the environment to this file.")
@click.option("--junit-xml", "junit_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write a JUnit XML report (one testcase per named gate) to this file.")
def command(ratio: str, names: tuple[str, ...], quick: bool, device_index: int,
            json_path: Path | None, junit_path: Path | None) -> None:
    if quick and names:
        raise click.UsageError("--quick and --case are exclusive: --quick already picks the "
                               f"first {QUICK_CASES} cases")
    for path, hint in ((json_path, "--json"), (junit_path, "--junit-xml")):
        if path is not None and not path.resolve().parent.is_dir():
            raise click.BadParameter(f"directory {str(path.resolve().parent)!r} does not exist",
                                     param_hint=hint)
    started = perf_counter()
    drift, all_cases = contract()
    cases = _select(all_cases, names, quick)
    full = len(cases) == len(all_cases)

    preflight(device_index)

    from csagate import render
    from csagate.gates.backend import BuildError, one_line
    from csagate.gates.runner import build_targets, run_gate

    err = console.err()
    backend = kernel_backend(device_index)
    env = backend.describe()
    err.print(f"csagate {__version__}: {env.get('gpu', env.get('device', '?'))} "
              f"({env.get('arch', '?')}), torch {env.get('torch', '?')}, "
              f"nvidia-cutlass-dsl {env.get('nvidia_cutlass_dsl', '?')}")
    build_start = perf_counter()
    targets = build_targets(cases, drift)
    try:
        with StderrProgress("build") as progress:
            records = backend.build(targets, progress=progress)
    except BuildError as exc:
        console.abort(f"{exc} (nothing was judged)", ExitCode.COULD_NOT_EVALUATE)
    build_seconds = perf_counter() - build_start
    hits = sum(1 for r in records if getattr(r, "hit", False))
    err.print(f"built {len(records)} kernel(s) ({hits} from the cache) for {len(targets)} "
              f"config(s) in {build_seconds:.1f} s")

    try:
        with StderrProgress("gate") as progress:
            verdict = run_gate(backend, cases, drift=drift, full=full, progress=progress)
    except Exception as exc:  # the gate itself broke (cases that raise are FAIL rows)
        err.print_exception()
        console.abort(f"the gate could not finish: {one_line(exc)}",
                      ExitCode.COULD_NOT_EVALUATE)

    render.print_verdict(verdict, console.out())
    extra = {
        "csagate_version": __version__,
        "selection": {"ratio": int(ratio), "quick": quick, "cases": list(names),
                      "device": device_index},
        "env": {"python": sys.version.split()[0]},
        "seeds": _seeds(),
        "build": {"targets": [list(t) for t in targets], "kernels": len(records),
                  "cache_hits": hits, "seconds": build_seconds, "records": records},
        "wall_seconds": {"build": build_seconds, "gate": verdict.seconds,
                         "total": perf_counter() - started},
    }
    if json_path is not None:
        render.write_json(json_path, verdict, extra)
        err.print(f"wrote {json_path}")
    if junit_path is not None:
        render.write_junit(junit_path, verdict)
        err.print(f"wrote {junit_path}")
    raise click.exceptions.Exit(int(ExitCode.PASS if verdict.ok else ExitCode.CONTRACT_FAILURE))


def _seeds() -> dict[str, int]:
    from csagate.reference.inputs import GRAD_SEED, INPUT_SEED, PAD_GRAD_SEED, PAD_TOKEN_SEED

    return {"input": INPUT_SEED, "grad": GRAD_SEED, "pad_grad": PAD_GRAD_SEED,
            "pad_token": PAD_TOKEN_SEED}
