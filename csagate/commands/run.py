"""``csagate run``: build, drift check, the named gates, coverage, verdict.

``--ratio 128`` (default) runs the ratio=128 contract (21 cases + 3 hardening cases),
``--ratio 4`` the production ratio=4 kernels' contract, ``--ratio all`` both, one after the
other, and exits with the worse code. Status and progress go to stderr, the verdict table to
stdout. Exit 0 pass, 1 contract failure, 2 usage error, 3 could not evaluate (no GPU, no
nvidia-cutlass-dsl, a build failure): the exit-3 checks run before cutlass is imported and
each prints one line.

The gate only ever judges the real kernels (``csagate.gates.backend.KernelBackend``): no option
here selects anything else. ``contracts``, ``preflight`` and ``kernel_backend`` are
module-level functions so the CLI tests can stand in for the GPU.
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


RATIOS = ("128", "4", "all")


def contracts(ratio: str):
    """The contract families ``--ratio`` names (``all``: ratio=128, then ratio=4)."""
    from csagate.gates.contracts import R4, R128

    return {"128": (R128,), "4": (R4,), "all": (R128, R4)}[ratio]


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


def _report_path(path: Path | None, ratio: int, several: bool) -> Path | None:
    """With ``--ratio all`` each family writes its own report: ``v.json`` -> ``v.r4.json``."""
    if path is None or not several:
        return path
    return path.with_name(f"{path.stem}.r{ratio}{path.suffix}")


@click.command("run", help="Run the numerics gate on this GPU: drift check, the named cases "
               "(G1 determinism, G2 tolerance, G3 fp64 parity, exact zeros), the hardening "
               "cases, schedule coverage and bucket edges.",
               epilog=ExitCode.help_text())
@click.option("--ratio", type=click.Choice(RATIOS), default="128", show_default=True,
              is_eager=True,  # --case names are checked against the ratio's cases
              help="The contract family: 128 (21 cases + 3 hardening), 4 (the production "
                   "ratio=4 kernels), or all (both; the worse exit code).")
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
    families = [(k, _select(k.all_cases, names, quick)) for k in contracts(ratio)]
    families = [(k, cases) for k, cases in families if cases or not names]

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
    targets: list = []
    for k, cases in families:
        targets += [t for t in build_targets(cases, k.drift) if t not in targets]
    try:
        with StderrProgress("build") as progress:
            records = backend.build(tuple(targets), progress=progress)
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
                verdict = run_gate(backend, k, cases=cases, progress=progress)
        except Exception as exc:  # the gate itself broke (cases that raise are FAIL rows)
            err.print_exception()
            console.abort(f"the gate could not finish: {one_line(exc)}",
                          ExitCode.COULD_NOT_EVALUATE)

        render.print_verdict(verdict, console.out())
        extra = {
            "csagate_version": __version__,
            "selection": {"ratio": k.ratio, "requested": ratio, "quick": quick,
                          "cases": list(names), "device": device_index},
            "env": {"python": sys.version.split()[0]},
            "seeds": _seeds(),
            "build": {"targets": [list(t) for t in targets], "kernels": len(records),
                      "cache_hits": hits, "seconds": build_seconds, "records": records},
            "wall_seconds": {"build": build_seconds, "gate": verdict.seconds,
                             "total": perf_counter() - started},
        }
        json_out = _report_path(json_path, k.ratio, several)
        if json_out is not None:
            render.write_json(json_out, verdict, extra)
            err.print(f"wrote {json_out}")
        junit_out = _report_path(junit_path, k.ratio, several)
        if junit_out is not None:
            render.write_junit(junit_out, verdict)
            err.print(f"wrote {junit_out}")
        if not verdict.ok:
            code = ExitCode.CONTRACT_FAILURE
    raise click.exceptions.Exit(int(code))


def _seeds() -> dict[str, int]:
    from csagate.reference.inputs import GRAD_SEED, INPUT_SEED, PAD_GRAD_SEED, PAD_TOKEN_SEED

    return {"input": INPUT_SEED, "grad": GRAD_SEED, "pad_grad": PAD_GRAD_SEED,
            "pad_token": PAD_TOKEN_SEED}
