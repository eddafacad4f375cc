"""The summary of a ``csagate fuzz`` run: what was covered, what failed, how to replay it."""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from csagate import console as _console


def _span(values) -> str:
    values = sorted(values)
    if not values:
        return "-"
    return str(values[0]) if len(values) == 1 else f"{values[0]}..{values[-1]}"


def headline(run) -> str:
    """``FUZZ PASS 52/52 trials (seed 7), self-test 40/40``; FAIL, INCONCLUSIVE (some trial
    judged nothing), NOTHING JUDGED (no trial judged anything); ``interrupted`` when Ctrl-C
    ended it."""
    from csagate.gates.verdict import FAIL, INCONCLUSIVE, NOTHING_JUDGED, PASS

    n = len(run.trials)
    tests = f", self-test {run.selftest.summary}" if run.selftest is not None else ""
    cut = " (interrupted)" if run.stopped == "interrupted" else ""
    state = run.state
    if state == PASS:
        return f"FUZZ PASS {n}/{n} trials (seed {run.seed}){tests}{cut}"
    if state == FAIL:
        distinct = len(run.failures)
        return (f"FUZZ FAIL {run.failed}/{n} trials failed (seed {run.seed}): {distinct} "
                f"distinct shrunk failure{'s' if distinct != 1 else ''}{tests}{cut}")
    if state == INCONCLUSIVE:
        return (f"FUZZ INCONCLUSIVE {run.inconclusive}/{n} trials judged nothing "
                f"(seed {run.seed}){tests}{cut}")
    assert state == NOTHING_JUDGED
    return f"FUZZ NOTHING JUDGED {n} trials (seed {run.seed}){tests}{cut}"


def summary_table(run, covered: dict, *, impl: str, device: str):
    table = _console.new_table(f"csagate fuzz: {impl} on {device}", ("", "value"),
                               marks=("",))
    stop = {"budget": "budget reached", "interrupted": "interrupted (Ctrl-C)"}.get(
        run.stopped, "as asked")
    dims = covered["head_dims"]
    rows = (
        ("seed", str(run.seed)),
        ("trials", f"{len(run.trials)} ({stop})"),
        ("passed", str(run.passed)),
        ("failed", f"{run.failed} ({len(run.failures)} distinct after shrinking)"),
        ("ratios", ", ".join(map(str, covered["ratios"])) or "-"),
        ("configs", f"{len(covered['configs'])} (ratio, coff, head dim)"),
        ("head dims", f"{len(dims)} in {_span(dims)} ({len(covered['odd_head_dims'])} odd)"),
        ("segments", f"{_span(covered['segments'])} per pack, up to "
                     f"{covered['max_tokens']} tokens"),
        ("padded / scaled / peaked / deterministic",
         f"{covered['with_padding']} / {covered['scaled']} / {covered['peaked']} "
         f"/ {covered['deterministic']}"),
        ("seconds", f"{run.seconds:.1f}"),
    )
    for name, value in rows:
        table.add_row(name, value)
    return table


def failures_table(run):
    table = _console.new_table("failures, shrunk", ("#", "case", "fails", "trials"),
                               marks=("#",), right=("#",), names=("case",))
    from csagate.gates.fuzz import failing

    for i, f in enumerate(run.failures):
        trials = ", ".join(map(str, f.trials[:6])) + (" ..." if len(f.trials) > 6 else "")
        table.add_row(str(i + 1), f.shrunk.case.name, ", ".join(failing(f.shrunk.result)),
                      trials)
    return table


def print_summary(run, covered: dict, files: dict[int, str], console: Console, *, impl: str,
                  device: str, impl_spec: str) -> None:
    """The summary table, the shrunk failures, the headline, and how to replay each one."""
    _console.print_table(summary_table(run, covered, impl=impl, device=device), console)
    if run.failures:
        _console.print_table(failures_table(run), console)
    style = "bold green" if run.ok else ("bold red" if run.failed else "bold yellow")
    console.print(Text(headline(run), style=style), soft_wrap=True)
    if not run.failures:
        return
    if not files:
        _console.print_wrapped(console, "--out DIR writes each shrunk failure as a case file "
                                        "that `csagate run --case-file` replays")
    for i, path in files.items():
        _console.print_wrapped(console, f"  {i + 1}: csagate run --case-file {path} --impl "
                                        f"{impl_spec} --device {device}", hang="      ")
