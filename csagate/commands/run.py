"""``csagate run``: build, drift check, the named gates, coverage, verdict.

``--ratio 128`` (default) runs the ratio=128 contract, ``--ratio 4`` the production ratio=4
kernels' contract, ``--ratio all`` every family, one after the other, and exits with the worse
code (``csagate cases`` lists each family's cases). Status and progress go to stderr, the
verdict table to stdout, or to stderr when ``--json -`` / ``--junit-xml -`` takes stdout (which
then holds the report alone). Exit 0 pass, 1 contract failure, 2 usage error (bad options and
report paths are found before anything runs), 3 could not evaluate (no GPU, no
nvidia-cutlass-dsl, a build failure): the exit-3 checks run before cutlass is imported and each
prints one message.

By default the gate judges its own kernels (the built-in ``csagate``); ``--impl`` judges
another implementation (``csagate impls``) against the same contract, the drift check still
judging the reference with the gate's kernels. ``csagate.gates.judging`` decides where and
with what (one preflight), and this module maps its typed errors to exit codes; the families
come from ``csagate.options.contracts``, looked up at call time so the CLI tests can pick
small contracts.
"""

from __future__ import annotations

import sys
from pathlib import Path
from time import perf_counter

import click

from csagate import __version__, console, options
from csagate.exitcodes import ExitCode
from csagate.gates.contracts import CONTRACTS  # plain data: no torch
from csagate.gates.errors import one_line
from csagate.kernels.env import debug
from csagate.options import NEEDS_MATPLOTLIB
from csagate.progress import StderrProgress
from csagate.render import STDOUT
from csagate.report_files import Reports, check_report_paths, report_path

QUICK_CASES = 2


def _ratio_help() -> str:
    families = ", ".join(f"{k.ratio} ({options.case_counts(k)})" for k in CONTRACTS.values())
    return (f"The contract family: {families}, or all (every family; the worse exit code). "
            "`csagate cases` lists them.")


def _check_names(ctx, param, names):
    if names:
        options.check_case_names(names, ctx.params.get("ratio", "128"))
    return names


def _load_case_files(ctx, param, paths):
    from csagate.gates.casefile import CaseFileError, load

    found = []
    for path in paths:
        try:
            found.append(load(path))
        except CaseFileError as exc:
            raise click.BadParameter(str(exc), param_hint="--case-file") from exc
    return tuple(found)


def _from_case_files(files) -> list:
    """(contract, cases) per ratio the case files name, in CONTRACTS' order."""
    by_ratio: dict[int, list] = {}
    for f in files:
        by_ratio.setdefault(f.contract_ratio, [])
        if f.case not in by_ratio[f.contract_ratio]:
            by_ratio[f.contract_ratio].append(f.case)
    return [(CONTRACTS[r], tuple(by_ratio[r])) for r in CONTRACTS if r in by_ratio]


def _select(cases, names, quick):
    if quick:
        return tuple(cases[:QUICK_CASES])
    if names:
        return tuple(c for c in cases if c.name in set(names))  # contract order
    return tuple(cases)


def _header(env: dict, device_index: int | str) -> str:
    """The run's first status line: what judges, where (``device_index`` "cpu": the CPU)."""
    if device_index == "cpu":
        return (f"csagate {__version__}: {env.get('implementation', '?')} on the CPU, torch "
                f"{env.get('torch', '?')}; drift check not run (no production kernels here)")
    where = ", ".join(str(x) for x in (env.get("arch"), f"cuda:{device_index}") if x)
    return (f"csagate {__version__}: {env.get('gpu', env.get('device', '?'))} ({where}), "
            f"torch {env.get('torch', '?')}, nvidia-cutlass-dsl "
            f"{env.get('nvidia_cutlass_dsl', '?')}")


# The options of `csagate run`, in --help order; the command's keyword arguments are their names.
RUN_OPTIONS = (
    options.ratio_option("128", _ratio_help(), eager=True),
    click.option("--case", "names", multiple=True, metavar="NAME", callback=_check_names,
                 help="Run only this named case (repeatable; `csagate cases` lists them). "
                      "Coverage is then not asserted."),
    click.option("--quick", is_flag=True,
                 help=f"Drift check and the first {QUICK_CASES} cases only (coverage not "
                      "asserted)."),
    options.device_option(),
    click.option("--case-file", "case_files", multiple=True, metavar="FILE",
                 callback=_load_case_files,
                 help="Replay a case file (`csagate fuzz --out` writes them; repeatable) under "
                      "its ratio's contract instead of the named cases. A bad file is one line, "
                      "exit 2."),
    click.option("-v", "--verbose", is_flag=True,
                 help="Also print the detail tables: schedules, differing elements / max |diff| "
                      "per tensor, dAPE max, seconds per case."),
    options.json_option("Write every recorded number, per case, and the environment to PATH "
                        "('-': stdout, and the verdict table goes to stderr; --ratio all: one "
                        "file per family, NAME.r128.json, NAME.r4.json)."),
    options.junit_option("Write a JUnit XML report (one testcase per named case) to PATH ('-': "
                         "stdout)."),
    options.impl_option(),
    options.report_option("Write DIR/verdict.json, one PNG heatmap of the error per failing "
                          f"case and tensor ({NEEDS_MATPLOTLIB}) and DIR/index.html with the "
                          "verdict and the pictures."),
)


def _with_options(fn):
    for option in reversed(RUN_OPTIONS):
        fn = option(fn)
    return fn


@click.command("run", help="Run the numerics gate on this GPU: the drift check, the named cases "
               "through the gates (G1 determinism, G2 tolerance, G3 fp64 parity, zeros, the op "
               "check), the hardening and deterministic cases, schedule coverage and bucket "
               "edges. The verdict has one mark per gate and case; -v adds the numbers. "
               "--json/--junit-xml are checked before anything runs and written on every exit "
               "path (exit 3: a \"could not evaluate\" report with the reason).",
               epilog=ExitCode.help_text())
@_with_options
def command(ratio: str, names: tuple[str, ...], quick: bool, device, case_files, verbose: bool,
            json_path: str | None, junit_path: str | None, impl, report_dir) -> None:
    if quick and names:
        raise click.UsageError("--quick and --case are exclusive: --quick already picks the "
                               f"first {QUICK_CASES} cases")
    if case_files and (quick or names):
        raise click.UsageError("--case-file replays its own cases: leave out --case and --quick")
    started = perf_counter()
    if case_files:
        families = _from_case_files(case_files)
    else:
        families = [(k, _select(k.all_cases, names, quick))
                    for k in options.contracts(ratio)]
        families = [(k, cases) for k, cases in families if cases or not names]
    several = len(families) > 1      # one report per family, named by its ratio
    families = _judgeable(families, impl, bool(names or case_files))
    check_report_paths({"--json": json_path, "--junit-xml": junit_path, "--report": report_dir},
                       [k.ratio for k, _ in families])
    reports = {}
    for k, cases in families:
        selection = {"ratio": k.ratio, "requested": ratio, "quick": quick, "cases": list(names),
                     "device": "cpu" if device.cpu else device.index, "impl": impl.name}
        if case_files:
            selection["case_files"] = list(dict.fromkeys(f.path for f in case_files
                                                         if f.case in cases))
        reports[k.ratio] = Reports(report_path(json_path, k.ratio, several),
                                   report_path(junit_path, k.ratio, several),
                                   selection=selection, total=len(cases),
                                   full=len(cases) == len(k.all_cases),
                                   report_dir=report_dir, several=several)
    to_stdout = STDOUT in (json_path, junit_path)
    try:
        code = _evaluate(families, device, reports, verbose, started, to_stdout,
                         impl=impl, report_dir=report_dir, several=several)
    except console.Aborted as exc:
        if exc.exit_code == ExitCode.COULD_NOT_EVALUATE:
            for rep in reports.values():
                rep.could_not_evaluate(exc.message)
        raise
    except (click.ClickException, click.exceptions.Exit):
        raise  # a usage error (--device out of range): no report, exit 2
    except Exception as exc:  # anything else: still a report, still exit 3
        if debug():
            console.err().print_exception()
        message = f"could not evaluate: {one_line(exc)}"
        console.err().print(f"csagate: {message}", style="bold red")
        for rep in reports.values():
            rep.could_not_evaluate(message)
        raise click.exceptions.Exit(int(ExitCode.COULD_NOT_EVALUATE)) from exc
    raise click.exceptions.Exit(int(code))


def _judgeable(families, impl, chosen: bool):
    """The families with at least one case that applies to ``impl`` (``judging.applicable``);
    a usage error (exit 2, before any work) when no selected case applies: a run that could
    judge nothing is never started. With several families (``--ratio all``) one that nothing
    applies to is left out with a line on stderr."""
    from csagate.gates.errors import NothingToJudge
    from csagate.gates.judging import applicable, why_not

    try:
        kept, left = applicable(impl, families, chosen=chosen)
    except NothingToJudge as exc:
        raise click.UsageError(str(exc)) from None
    for k, cases in left:
        console.err().print(f"ratio={k.ratio}: nothing applies to {impl.name} "
                            f"({why_not(impl, cases[0])}): not judged", soft_wrap=True)
    return kept


def _evaluate(families, device, reports: dict, verbose: bool, started: float,
              to_stdout: bool = False, *, impl, report_dir: Path | None,
              several: bool) -> ExitCode:
    """How ``impl`` is judged here (``gates.judging``: one preflight), the self-tests, the
    memory the cases need, the build, then each family's gate, verdict and reports; the worse
    exit code. What stops it before a verdict goes through ``console.stop``."""
    from csagate import render
    from csagate.gates.errors import CannotEvaluate, Unusable, one_line
    from csagate.gates.judging import judging
    from csagate.gates.runner import run_gate
    from csagate.where import print_where

    err = console.err()
    try:
        judged = judging(impl, device)
    except (Unusable, CannotEvaluate) as exc:
        console.stop(exc, " (nothing was judged)")
    device_index = judged.where
    env = {**judged.driver.describe(), "device_index": device_index}
    for rep in reports.values():
        rep.env.update(env)
    render.print_lines(err, _header(env, device_index), hang="  ")
    try:
        tests = judged.selftests()
        err.print(f"self-test {tests.summary} passed on {tests.device} ({tests.seconds:.2f} s)",
                  soft_wrap=True)
        judged.memory([c for _, cases in families for c in cases])
        with StderrProgress("build") as progress:
            build = judged.build(families, progress)
    except CannotEvaluate as exc:
        console.stop(exc, " (nothing was judged)")
    if build["records"] or judged.drift is not None:   # on the CPU: nothing built, no line
        err.print(f"built {build['kernels']} kernel(s) ({build['cache_hits']} from the cache) "
                  f"for {len(build['targets'])} config(s) in {build['seconds']:.1f} s")

    code = ExitCode.PASS
    for k, cases in families:
        try:
            with StderrProgress(f"gate ratio={k.ratio}" if several else "gate") as progress:
                verdict = run_gate(judged.driver, k, cases=cases, progress=progress,
                                   drift_driver=judged.drift, drift_na=judged.drift_na)
        except Exception as exc:  # the gate itself broke (cases that raise are FAIL rows)
            if debug():
                err.print_exception()
            console.abort(f"the gate could not finish: {one_line(exc)}",
                          ExitCode.COULD_NOT_EVALUATE)
        shown = err if to_stdout else console.out()
        render.print_verdict(verdict, shown, verbose=verbose)
        print_where(verdict, shown)
        rep = reports[k.ratio]
        extra = {
            "selection": rep.selection,
            "device": {"index": device_index, "name": env.get("gpu"), "arch": env.get("arch")},
            "env": {"python": sys.version.split()[0], "device_index": device_index},
            "seeds": _seeds(),
            "build": build,
            "wall_seconds": {"build": build["seconds"], "gate": verdict.seconds,
                             "total": perf_counter() - started},
        }
        rep.verdict(verdict, extra)
        if report_dir is not None:
            from csagate.report import write_report

            for line in write_report(report_dir, verdict, extra, several=several):
                console.print_wrapped(err, line)
        code = ExitCode.worse(code, render.exit_code(verdict))
    return code


def _seeds() -> dict[str, int]:
    from csagate.reference.seeds import GRAD_SEED, INPUT_SEED, PAD_GRAD_SEED, PAD_TOKEN_SEED

    return {"input": INPUT_SEED, "grad": GRAD_SEED, "pad_grad": PAD_GRAD_SEED,
            "pad_token": PAD_TOKEN_SEED}
