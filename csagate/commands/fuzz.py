"""``csagate fuzz``: seeded random packs over an implementation's envelope, every contract check
per trial, failures shrunk and written as replayable case files.

The generator, the shrinker and the loop are ``csagate.gates.fuzz``; this module checks the
options (before any work), picks the driver, shows progress and the summary, and writes the
case files and reports. Exit codes as ``csagate run``: 0 every trial passed, 1 a trial failed
(or, on a GPU, the reference drift check did), 2 usage error, 3 could not evaluate.
"""

from __future__ import annotations

import json
import secrets
import xml.etree.ElementTree as ET
from pathlib import Path
from time import perf_counter

import click

from csagate import __version__, console, options
from csagate.exitcodes import ExitCode
from csagate.gates.contracts import CONTRACT_VERSION
from csagate.options import FiniteFloat
from csagate.progress import StderrProgress
from csagate.render import STDOUT
from csagate.report_files import check_report_paths, report_dir_problem

DEFAULT_BUDGET = 60.0
SCHEMA = "csagate.fuzz/1"


def _out_dir(ctx, param, value: Path | None):
    """``--out DIR``: a folder that exists or can be created, in which a file can be created
    (checked before the first trial, like ``--json``), else exit 2."""
    if value is not None:
        if value.exists() and not value.is_dir():
            raise click.BadParameter(f"{str(value)!r} exists and is not a directory",
                                     param_hint="--out")
        if not value.exists() and not value.resolve().parent.is_dir():
            raise click.BadParameter(f"directory {str(value.resolve().parent)!r} does not "
                                     "exist", param_hint="--out")
        problem = report_dir_problem(value)
        if problem:
            raise click.BadParameter(problem, param_hint="--out")
    return value


@click.command("fuzz", help="Fuzz an implementation against the contract: seeded random packs "
               "over its whole envelope (ratios, coff 1/2, head dims odd and small, 1-7 "
               "segments mixing empty, short, exact-multiple and tail segments, capacity rows, "
               "token padding, input scales x1/x8/x64), each judged by every check of its "
               "ratio's contract. A failure is shrunk to a minimal pack and, with --out, "
               "written as a case file that `csagate run --case-file FILE` replays. Trial i of "
               "seed S is the same pack on every machine.",
               epilog=ExitCode.help_text() + " Exit 1: some trial failed.")
@options.impl_option()
@options.ratio_option("all", "Draw from this contract family's ratio only (all: every ratio the "
                      "implementation and the kernels share).")
@click.option("--trials", type=click.IntRange(min=1), metavar="N",
              help="Run exactly N trials (exclusive with --budget).")
@click.option("--budget", type=FiniteFloat(0, low_open=True), metavar="SECONDS",
              help=f"Start trials until SECONDS have passed (default {DEFAULT_BUDGET:g}; a "
                   "shrink that started finishes).")
@click.option("--seed", type=click.IntRange(min=0), metavar="S",
              help="The seed (default: a fresh one, printed and recorded).")
@options.device_option()
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              callback=_out_dir, metavar="DIR",
              help="Write each distinct shrunk failure to DIR as a case file (created).")
@click.option("--shrink-calls", type=click.IntRange(min=0), default=200, show_default=True,
              metavar="N", help="At most N judge calls per shrink (0: no shrinking).")
@options.json_option("Write the trials, the failures and what was covered as JSON ('-': "
                     "stdout).")
@options.junit_option("Write a JUnit XML report, one testcase per trial ('-': stdout).")
def command(impl, ratio: str, trials: int | None, budget: float | None,
            seed: int | None, device, out_dir: Path | None, shrink_calls: int,
            json_path: str | None, junit_path: str | None) -> None:
    if trials is not None and budget is not None:
        raise click.UsageError("--trials and --budget are exclusive: give one (default: "
                               f"--budget {DEFAULT_BUDGET:g})")
    check_report_paths({"--json": json_path, "--junit-xml": junit_path}, [0])
    impl_spec = options.impl_spec()
    if trials is None and budget is None:
        budget = DEFAULT_BUDGET
    seed = secrets.randbelow(2**31) if seed is None else seed
    env = _envelope(impl, ratio)
    reports = FuzzReports(json_path, junit_path, {
        "seed": seed, "implementation": impl_spec, "device": str(device), "ratio": ratio,
        "trials": trials, "budget": budget, "envelope": env.text()})
    try:
        code = _run(impl, impl_spec, env, device, seed, trials, budget, out_dir, shrink_calls,
                    reports, STDOUT in (json_path, junit_path))
    except console.Aborted as exc:
        if exc.exit_code == ExitCode.COULD_NOT_EVALUATE:
            reports.could_not_evaluate(exc.message)
        raise
    raise click.exceptions.Exit(int(code))


def _envelope(impl, ratio: str):
    from csagate.gates.errors import NothingToJudge
    from csagate.gates.judging import envelope

    try:
        return envelope(impl, None if ratio == "all" else (int(ratio),))
    except NothingToJudge as exc:
        raise click.UsageError(str(exc)) from None


def _driver(impl, device):
    """The driver ``impl`` is fuzzed with (``gates.judging``), after the self-tests; on a GPU
    the drift check runs first (exit 1 if it fails)."""
    from csagate.gates.contracts import R4
    from csagate.gates.errors import CannotEvaluate, Unusable
    from csagate.gates.judging import judging

    try:
        judged = judging(impl, device)
        tests = judged.selftests()
        console.err().print(f"self-test {tests.summary} passed on {tests.device} "
                            f"({tests.seconds:.2f} s)", soft_wrap=True)
        result = judged.drift_check(R4)
    except (Unusable, CannotEvaluate) as exc:
        console.stop(exc, " (nothing was judged)")
    if result is not None and not result.ok:
        console.abort(f"the reference drift check failed ({result.status}"
                      f"{': ' + result.error if result.error else ''}): nothing the fuzz "
                      "could say would be trusted", ExitCode.CONTRACT_FAILURE)
    return judged.driver


def _run(impl, impl_spec, env, device, seed, trials, budget, out_dir, shrink_calls, reports,
         to_stdout) -> ExitCode:
    from csagate.gates import fuzz
    from csagate.gates.errors import BuildError

    err = console.err()
    driver = _driver(impl, device)
    mode = f"{trials} trials" if trials is not None else f"budget {budget:g} s"
    console.print_wrapped(err, f"csagate fuzz {__version__}: {impl.name} on {device}, seed "
                               f"{seed}, {mode}; envelope: {env.text()}")
    judge = fuzz.Judge(driver)
    sizes = fuzz.CPU_SIZES if device.cpu else fuzz.CUDA_SIZES
    try:
        with StderrProgress("fuzz") as progress:
            run = fuzz.fuzz(judge, env, seed=seed, trials=trials, budget=budget, sizes=sizes,
                            shrink_calls=shrink_calls, progress=progress)
    except BuildError as exc:
        console.abort(f"{exc} (nothing was judged)", ExitCode.COULD_NOT_EVALUATE)
    files = _write_case_files(run, out_dir, impl_spec) if out_dir is not None else {}
    shown = err if to_stdout else console.out()
    from csagate import fuzz_render

    fuzz_render.print_summary(run, fuzz.coverage(run), files, shown, impl=impl.name,
                              device=str(device), impl_spec=impl_spec)
    reports.write(run, fuzz.coverage(run), files)
    if run.stopped == "interrupted":   # Ctrl-C: what was found is written, then exit 130
        where = f"; {len(files)} case file(s) in {out_dir}" if files else ""
        console.abort(f"interrupted after {len(run.trials)} trial(s){where}",
                      ExitCode.INTERRUPTED)
    return exit_code(run)


def exit_code(run) -> ExitCode:
    """0 every trial passed, 1 some trial failed, 3 some (or every) trial judged nothing."""
    from csagate.gates.verdict import FAIL, PASS

    return {PASS: ExitCode.PASS, FAIL: ExitCode.CONTRACT_FAILURE}.get(
        run.state, ExitCode.COULD_NOT_EVALUATE)


def _write_case_files(run, out_dir: Path, impl_spec: str) -> dict[int, str]:
    """One case file per distinct shrunk failure; {failure index: path}."""
    from csagate.gates import casefile
    from csagate.gates.fuzz import failing

    if not run.failures:
        return {}
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for i, f in enumerate(run.failures):
        path = out_dir / casefile.file_name(f.shrunk.case, run.seed, f.trial.index)
        origin = {"seed": run.seed, "trial": f.trial.index, "trials": list(f.trials),
                  "case": casefile.case_dict(f.trial.case), "failing": list(f.trial.failing),
                  "shrink_steps": f.shrunk.steps, "shrink_calls": f.shrunk.calls}
        casefile.write(path, f.shrunk.case, failing=failing(f.shrunk.result),
                       implementation=impl_spec, origin=origin)
        paths[i] = str(path)
    return paths


class FuzzReports:
    """``--json`` and ``--junit-xml`` of one fuzz run, written on exit 0/1 and exit 3."""

    def __init__(self, json_path: str | None, junit_path: str | None, selection: dict):
        self.json_path, self.junit_path, self.selection = json_path, junit_path, selection
        self.started = perf_counter()

    def _put(self, path: str, text: str) -> None:
        if path == STDOUT:
            click.echo(text, nl=False)
        else:
            Path(path).write_text(text)
            console.wrote(path)

    def _doc(self, **fields) -> dict:
        return {"schema": SCHEMA, "csagate_version": __version__,
                "contract_version": CONTRACT_VERSION, **self.selection, **fields}

    def write(self, run, covered: dict, files: dict[int, str]) -> None:
        from csagate.gates.casefile import case_dict
        from csagate.gates.fuzz import failing

        failures = [{"trial": f.trial.index, "trials": f.trials,
                     "original": case_dict(f.trial.case), "original_failing": f.trial.failing,
                     "shrunk": case_dict(f.shrunk.case), "failing": failing(f.shrunk.result),
                     "shrink_steps": f.shrunk.steps, "shrink_calls": f.shrunk.calls,
                     "case_file": files.get(i)} for i, f in enumerate(run.failures)]
        from csagate.render import VERDICT_WORD

        code = ExitCode.INTERRUPTED if run.stopped == "interrupted" else exit_code(run)
        doc = self._doc(verdict=VERDICT_WORD[run.state], exit_code=int(code),
                        stopped=run.stopped, trials_run=len(run.trials), passed=run.passed,
                        failed=run.failed, inconclusive=run.inconclusive,
                        selftest=None if run.selftest is None else run.selftest.record(),
                        distinct_failures=len(run.failures),
                        seconds=run.seconds, coverage=covered, failures=failures,
                        trial_results=[{"index": t.index, "name": t.case.name,
                                        "status": t.status, "failing": t.failing,
                                        "seconds": t.seconds} for t in run.trials])
        if self.json_path is not None:
            self._put(self.json_path, json.dumps(doc, indent=2, allow_nan=False) + "\n")
        if self.junit_path is not None:
            self._put(self.junit_path, _junit(run, files, self.selection))

    def could_not_evaluate(self, reason: str) -> None:
        if self.json_path is not None:
            doc = self._doc(verdict="COULD NOT EVALUATE",
                            exit_code=int(ExitCode.COULD_NOT_EVALUATE), reason=reason,
                            seconds=perf_counter() - self.started)
            self._put(self.json_path, json.dumps(doc, indent=2) + "\n")
        if self.junit_path is not None:
            suite = ET.Element("testsuite", name="csagate.fuzz", tests="1", failures="0",
                               errors="1", skipped="0")
            tc = ET.SubElement(suite, "testcase", classname="csagate.fuzz",
                               name="could not evaluate", time="0.000")
            ET.SubElement(tc, "error", message=reason, type="could not evaluate").text = reason
            self._put(self.junit_path, _xml(suite))


def _xml(suite: ET.Element) -> str:
    root = ET.Element("testsuites", name="csagate", **{k: suite.get(k, "0") for k in
                                                       ("tests", "failures", "errors")})
    root.append(suite)
    tree = ET.ElementTree(root)
    ET.indent(tree)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def _junit(run, files: dict[int, str], selection: dict) -> str:
    """One testcase per trial; a failing one names its shrunk case and case file."""
    shrunk_of = {i: (k, f) for k, f in enumerate(run.failures) for i in f.trials}
    suite = ET.Element("testsuite", name="csagate.fuzz", tests=str(len(run.trials)),
                       failures=str(run.failed), errors=str(run.inconclusive), skipped="0",
                       time=f"{run.seconds:.3f}")
    props = ET.SubElement(suite, "properties")
    for key, value in sorted({**selection, "csagate_version": __version__,
                              "contract_version": CONTRACT_VERSION}.items()):
        ET.SubElement(props, "property", name=key, value=str(value))
    for t in run.trials:
        tc = ET.SubElement(suite, "testcase", classname=f"csagate.fuzz.r{t.case.ratio}",
                           name=t.case.name, time=f"{t.seconds:.3f}")
        if t.status == "inconclusive":
            ET.SubElement(tc, "error", message="judged nothing", type="inconclusive")
        elif t.status != "pass":
            k, f = shrunk_of[t.index]
            text = (f"{', '.join(t.failing)}; shrunk to {f.shrunk.case.name}"
                    + (f" ({files[k]})" if k in files else ""))
            ET.SubElement(tc, "failure", message=text, type=t.status).text = text
    return _xml(suite)
