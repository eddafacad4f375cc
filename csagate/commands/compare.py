"""``csagate compare --impl A --impl B``: the same inputs through two implementations.

Per case and output: max |A - B|, the count of differing elements, and each one's max error
against the fp64 oracle and the fp32 eager reference; the distribution of |A - B| in bf16
steps (p50, p90, p99, p99.9, max); and where ``out`` differs, by segment length and by the
window's place in its segment (first to last quarter). Three 80-column tables; ``--json``
writes every number, and ``--report DIR`` writes that document as DIR/compare.json, a picture
per case that differs (``csagate.pair_report``) and DIR/index.html. Without a bound a
difference is a measurement: exit 0 when it ran. With ``--max-abs`` (every output) and
``--bound TENSOR=VALUE`` (one output; wins over ``--max-abs``) it is a check: exit 1 when some
max |A - B| exceeds its bound (NaN in one only counts as infinite; a case where either side
raised counts as beyond). Exit 2 on a bad value (report paths are checked before anything
runs), 3 when either implementation cannot run here (no report is written then).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import click

from csagate import console, options
from csagate.exitcodes import ExitCode
from csagate.options import NEEDS_MATPLOTLIB, FiniteFloat
from csagate.pair_report import abs_text, steps_text, write_report
from csagate.render import STDOUT
from csagate.report_files import check_report_paths

COLUMNS = ("case / output", "|A-B|", "n diff", "A-fp64", "B-fp64", "A-fp32", "B-fp32")
STEP_COLUMNS = ("case / output", "p50", "p90", "p99", "p99.9", "max")
WHERE_COLUMNS = ("case / out rows", "elements", "n diff", "max steps", "p99 steps")
TENSORS = ("out", "dkv", "dscore", "dape")
EXITS = ("Exit codes: 0 compared (and, with a bound, every max |A - B| within it), 1 some "
         "max |A - B| beyond its bound (only with --max-abs/--bound), 2 usage error (no case "
         "in both envelopes included), 3 could not compare (an implementation cannot run "
         "here, no GPU, a failed self-test, every case raised), 130 interrupted (Ctrl-C).")


def _bound(ctx, param, values):
    """``--bound TENSOR=VALUE`` (repeatable) -> {tensor: bound}."""
    bounds: dict[str, float] = {}
    for value in values:
        name, sep, number = value.partition("=")
        name = name.strip().lower()
        if not sep or name not in TENSORS:
            raise click.BadParameter(f"{value!r}: give TENSOR=VALUE with TENSOR one of "
                                     f"{', '.join(TENSORS)} (e.g. dape=1e-3)")
        try:
            bounds[name] = FiniteFloat(0).convert(number.strip(), None, None)
        except click.BadParameter as exc:
            raise click.BadParameter(f"{value!r}: {exc.message}") from None
    return bounds


def bounds_of(max_abs: float | None, per_tensor: dict[str, float]) -> dict[str, float]:
    """The bound of each output (``--bound`` wins over ``--max-abs``); empty: no check."""
    found = {t: max_abs for t in TENSORS} if max_abs is not None else {}
    return found | per_tensor


def breaches(diffs, bounds: dict[str, float]) -> list[str]:
    """One line per output whose max |A - B| exceeds its bound (NaN: beyond), and per case
    that raised, when any bound is set."""
    if not bounds:
        return []
    found = []
    for d in diffs:
        if d.error:
            found.append(f"{d.case.name}: not compared ({d.error})")
        for x in d.tensors:
            bound = bounds.get(x.tensor)
            if bound is not None and not x.max_abs <= bound:
                found.append(f"{d.case.name} {x.tensor}: max |A-B| {abs_text(x.max_abs)} > "
                             f"{bound:g}")
    return found


def table(diffs, a: str, b: str):
    from rich import box

    t = console.new_table(f"compare A={a} B={b}: max |error|", COLUMNS,
                          marks=COLUMNS[1:], right=COLUMNS[1:])
    t.box = box.SIMPLE_HEAD
    for d in diffs:
        t.add_row(d.case.name, *([""] * 6))
        if d.error:
            t.add_row(f"  raised: {d.error}", *([""] * 6))
        for x in d.tensors:
            t.add_row(f"  {x.tensor}", abs_text(x.max_abs), str(x.n_diff),
                      *(abs_text(v) for v in (x.a_oracle, x.b_oracle, x.a_eager, x.b_eager)))
    return t


def steps_table(diffs, a: str, b: str):
    """|A - B| in bf16 steps per case and output: the quantiles and the max."""
    from rich import box

    t = console.new_table(f"compare A={a} B={b}: |A-B| in bf16 steps", STEP_COLUMNS,
                          marks=STEP_COLUMNS[1:], right=STEP_COLUMNS[1:])
    t.box = box.SIMPLE_HEAD
    for d in diffs:
        rows = [x for x in d.tensors if x.steps is not None]
        if not rows:
            continue
        t.add_row(d.case.name, *([""] * 5))
        for x in rows:
            q = x.steps
            t.add_row(f"  {x.tensor}", *(steps_text(v) for v in (q.p50, q.p90, q.p99, q.p999,
                                                                  q.max)))
    return t


def where_table(diffs, a: str, b: str):
    """Where ``out`` differs: per segment length bucket, then per window quarter."""
    from rich import box

    t = console.new_table(f"compare A={a} B={b}: where out differs", WHERE_COLUMNS,
                          marks=WHERE_COLUMNS[1:], right=WHERE_COLUMNS[1:])
    t.box = box.SIMPLE_HEAD
    for d in diffs:
        found = [w for x in d.tensors if x.tensor == "out" for w in x.where]
        if not found:
            continue
        t.add_row(d.case.name, *([""] * 4))
        for w in found:
            label = {"length": f"  length {w.group}", "window": f"  {w.group}",
                     "padding": "  padding rows"}[w.by]
            t.add_row(label, str(w.numel), str(w.n_diff), steps_text(w.max_steps),
                      steps_text(w.p99))
    return t


def _cases(ratio: str, names, a, b):
    cases = [c for k in options.contracts(ratio) for c in k.cases + k.hardening]
    if names:
        options.check_case_names(names, ratio, param_hint="--case")
        cases = [c for c in cases if c.name in set(names)]
    return [c for c in cases if a.supports.covers(c.ratio, c.coff, c.d)
            and b.supports.covers(c.ratio, c.coff, c.d)]


def _check(impls):
    if len(impls) != 2:
        raise click.UsageError(f"compare needs exactly two --impl, got {len(impls)}")
    return impls


def _drivers(impls, device):
    """The drivers of both implementations on ``device`` (``gates.judging``), after the
    self-tests there: exit 3 with one line when either cannot run here (2 when a check exits
    or the device does not exist)."""
    from csagate.gates.errors import CannotEvaluate, Unusable
    from csagate.gates.judging import judging

    try:
        judged = [judging(impl, device) for impl in impls]
        tests = judged[0].selftests()
    except (Unusable, CannotEvaluate) as exc:
        console.stop(exc, " (nothing was compared)")
    console.err().print(f"self-test {tests.summary} passed on {tests.device} "
                        f"({tests.seconds:.2f} s)", soft_wrap=True)
    return judged


@click.command("compare", help="Run the same inputs (the gate's cases) through two "
               "implementations and print, per case and output, max |A - B|, the count of "
               "differing elements, and each one's error against the fp64 oracle and the fp32 "
               "eager reference; then |A - B| in bf16 steps and where out differs. "
               "--max-abs / --bound turn it into a check (exit 1 beyond); --report DIR adds "
               "pictures.",
               epilog=EXITS)
@options.impl_option(multiple=True, help_="An implementation (twice: A, then B); as for "
                                           "`csagate run --impl`.")
@options.ratio_option("128", "The contract family whose cases are compared.")
@click.option("--case", "names", multiple=True, metavar="NAME",
              help="Only this case (repeatable).")
@options.device_option()
@options.json_option("Write every number to PATH ('-': stdout, the table then goes to "
                     "stderr); checked before anything runs.")
@options.report_option(
    "Write DIR/compare.json (the --json document), one PNG per case that differs: the "
    "quantiles of |A - B| in bf16 steps per output and where out differs "
    f"({NEEDS_MATPLOTLIB}), and DIR/index.html listing every case; checked before anything "
    "runs.")
@click.option("--max-abs", "max_abs", type=FiniteFloat(0), default=None,
              metavar="FLOAT", help="Exit 1 when max |A - B| of any output exceeds FLOAT.")
@click.option("--bound", "per_tensor", multiple=True, metavar="TENSOR=VALUE", callback=_bound,
              help=f"Exit 1 when max |A - B| of TENSOR ({', '.join(TENSORS)}) exceeds VALUE "
                   "(repeatable; wins over --max-abs for that output).")
def command(impl, ratio, names, device, json_path, report_dir, max_abs, per_tensor) -> None:
    a, b = _check(impl)
    check_report_paths({"--json": json_path, "--report": report_dir}, [0])
    bounds = bounds_of(max_abs, per_tensor)
    cases = _cases(ratio, names, a, b)
    if not cases:
        raise click.UsageError(f"nothing to compare: no selected case of --ratio {ratio} is in "
                               f"both envelopes ({a.name}: {a.supports.text()}; {b.name}: "
                               f"{b.supports.text()})")
    judged = _drivers((a, b), device)
    from csagate.gates.errors import CannotEvaluate
    from csagate.gates.pair_diff import compare
    from csagate.gates.runner import build_targets

    targets = build_targets(cases, None)
    try:
        judged[0].memory(cases)
        for j in judged:
            j.driver.build(targets)
    except CannotEvaluate as exc:    # the memory, or a build (BuildError)
        console.stop(exc, " (nothing was compared)")
    diffs = compare(judged[0].driver, judged[1].driver, cases)
    to_stdout = json_path == STDOUT
    shown = console.err() if to_stdout else console.out()
    for make in (table, steps_table, where_table):
        console.print_table(make(diffs, a.name, b.name), shown)
    beyond = breaches(diffs, bounds)
    text = document(a.name, b.name, ratio, bounds, beyond, diffs)
    if json_path is not None:
        if to_stdout:
            click.echo(text, nl=False)
        else:
            Path(json_path).write_text(text)
            console.wrote(json_path)
    if report_dir is not None:
        for line in write_report(report_dir, text):
            console.print_wrapped(console.err(), line)
    compared = sum(1 for d in diffs if not d.error)
    if bounds:
        for line in beyond:
            console.print_wrapped(shown, f"beyond the bound: {line}", indent="  ",
                                  hang="    ")
    shown.print(f"compare {a.name} vs {b.name}: {headline(compared, len(diffs), bounds, beyond)}",
                soft_wrap=True)
    if beyond:
        code = ExitCode.CONTRACT_FAILURE
    elif not compared:
        code = ExitCode.COULD_NOT_EVALUATE
    else:
        code = ExitCode.PASS
    raise click.exceptions.Exit(int(code))


def headline(compared: int, total: int, bounds: dict, beyond: list[str]) -> str:
    """What the comparison concluded: how many cases it compared, and against the bounds."""
    if not compared:
        return f"NOTHING COMPARED: every one of the {total} case(s) raised"
    text = f"compared {compared}/{total} case(s)"
    if not bounds:
        return text
    return text + (f"; BEYOND THE BOUND: {len(beyond)} output(s)" if beyond else
                   "; every output within its bound")


def document(a: str, b: str, ratio: str, bounds: dict[str, float], beyond: list[str],
             diffs) -> str:
    """The JSON document of ``--json`` and of ``--report``'s compare.json."""
    from csagate.render import _jsonable

    doc = {"schema": "csagate.compare/1", "a": a, "b": b, "ratio": ratio, "bounds": bounds,
           "beyond": beyond,
           "cases": [{"name": d.case.name, "error": d.error,
                      "tensors": [dataclasses.asdict(x) for x in d.tensors]} for d in diffs]}
    return json.dumps(_jsonable(doc), indent=2) + "\n"
