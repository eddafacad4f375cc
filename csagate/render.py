"""Verdict renderers: the rich table (stdout), the JSON report and the JUnit XML report.

All three read the same :class:`csagate.gates.verdict.Verdict`; none of them judges anything. The
table has one row per named case in the contract's order: the drift check first, the cases,
schedule coverage last, with one mark per gate (G1, G2, G3, zeros) and the result; ``-v`` adds
the numbers (``detail_table``). Then the headline (``GATE PASS 21/21 + 3/3 hardening + ...``)
and every reason, wrapped at the console's width. A case name is never split: it is the string
``--case`` takes. The JSON and JUnit reports name the package's and the contract's versions.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from csagate import __version__
from csagate import console as _console
from csagate.exitcodes import ExitCode
from csagate.gates import verdict as V
from csagate.gates.contracts import CONTRACT_VERSION
from csagate.gates.errors import short_error

if TYPE_CHECKING:  # annotations only: the renderers read the verdict's records
    from csagate.gates.verdict import CaseResult, CoverageResult, GateResult, Selection, Verdict

SCHEMA = "csagate.verdict/1"
COULD_NOT_EVALUATE = "COULD NOT EVALUATE"   # the verdict of an exit-3 run

# A verdict's state (``Verdict.state``) as the reports' word and the process's exit code: only
# a pass is 0; a run that judged nothing, wholly or in some case, could not evaluate (3).
VERDICT_WORD = {V.PASS: "PASS", V.FAIL: "FAIL", V.NOTHING_JUDGED: "NOTHING JUDGED",
                V.INCONCLUSIVE: "INCONCLUSIVE"}


def exit_code(verdict: Verdict) -> ExitCode:
    return {V.PASS: ExitCode.PASS, V.FAIL: ExitCode.CONTRACT_FAILURE}.get(
        verdict.state, ExitCode.COULD_NOT_EVALUATE)

_STYLE = {V.PASS: "green", V.FAIL: "bold red", V.ERROR: "bold red", V.SKIP: "yellow",
          V.RECORDED: "cyan", V.UNTRUSTED: "yellow", V.NOT_ASSERTED: "yellow", V.NA: "dim",
          V.INCONCLUSIVE: "yellow"}
_WORD = {V.PASS: "PASS", V.FAIL: "FAIL", V.ERROR: "ERROR", V.SKIP: "skip", V.RECORDED: "rec",
         V.UNTRUSTED: "UNTRUSTED", V.NOT_ASSERTED: "NOT ASSERTED", V.NA: "n/a",
         V.INCONCLUSIVE: "inc"}

# The compact verdict: one mark per gate. The marks, the result and the case name never wrap
# or shrink (the name's prefix is its config). The longest name of either family fits 80
# columns; the numbers are in ``detail_table`` (-v).
COLUMNS = ("#", "case", "G1", "G2", "G3", "zeros", "result")
MARKS = ("#", "G1", "G2", "G3", "zeros", "result")
NAMES = ("case",)
# The coverage cell of a subset run, kept short (its row says "not asserted" in words).
_COVERAGE_WORD = {V.NOT_ASSERTED: "n/a"}
DETAIL_COLUMNS = ("#", "case", "fwd diff / max", "dKV diff / max", "dScore diff / max",
                  "dAPE max", "s")
SCHEDULE_COLUMNS = ("#", "case", "fwd schedules", "bwd schedules")


# --- table ---------------------------------------------------------------------------------


new_table = _console.new_table


def _status(status: str) -> Text:
    if not status:
        return Text("-")
    return Text(_WORD.get(status, status), style=_STYLE.get(status, ""))


def _diff_cell(result: GateResult | None, *, count: bool = True) -> str:
    if result is None:
        return "-"
    n = result.numbers
    if "n_mismatch" in n:  # overflow case: NaN-mask equality
        return "NaN mask ok" if not n["n_mismatch"] else f"NaN mask {n['n_mismatch']} off"
    if "max_abs" not in n:
        return "-"
    if not count:
        return f"{n['max_abs']:.2e}"
    return f"{n['n_diff']} / {n['max_abs']:.2e}"


def _config(result: CaseResult) -> str:
    from csagate.kernels.registry import config_label

    return config_label(result.case.ratio, result.case.config)


def _schedules(result: CaseResult, direction: str) -> str:
    return ", ".join(result.schedules(direction)) or "-"


def _result(result: CaseResult) -> Text:
    if result.status == V.ERROR:  # a raising case is a FAIL row; its error is in the reasons
        return Text("FAIL", style=_STYLE[V.ERROR])
    return _status(result.status)


def _case_row(index: int, result: CaseResult) -> list:
    return [str(index), result.name,
            *(_status(result.gate_status(g)) for g in ("G1", "G2", "G3", "zeros")),
            _result(result)]


def _detail_row(index: int, result: CaseResult, *, drift: bool = False) -> list:
    cmp_gate = "drift" if drift else "G2"
    return [
        str(index), result.name,
        _diff_cell(result.result(cmp_gate, "out")),
        _diff_cell(result.result(cmp_gate, "dkv")),
        _diff_cell(result.result(cmp_gate, "dscore")),
        _diff_cell(result.result(cmp_gate, "dape"), count=False),
        f"{result.seconds:.1f}",
    ]


def verdict_table(verdict: Verdict) -> Table:
    """One row per named case in the contract's order (drift check first, coverage last): one
    mark per gate and the result."""
    env = verdict.env
    where = ", ".join(str(env[k]) for k in ("gpu", "arch") if env.get(k))
    title = f"csagate ratio={verdict.ratio} gate" + (f" on {where}" if where else "")
    table = new_table(title, COLUMNS, marks=MARKS, right=("#",), names=NAMES, compact=True)
    table.add_row(*_case_row(0, verdict.drift))
    for i, result in enumerate(verdict.cases, start=1):
        table.add_row(*_case_row(i, result))
    cov = verdict.coverage
    label = (f"coverage not asserted (subset run): {cov.summary}" if cov.status == V.NOT_ASSERTED
             else f"coverage ({cov.summary})")
    word = _COVERAGE_WORD.get(cov.status)
    table.add_row("", _console.prose(label), *([_status("")] * 4),
                  Text(word, style=_STYLE[cov.status]) if word else _status(cov.status))
    return table


DETAIL_TITLE = ("detail: differing elements / max |diff| (row 0: vs the reference; others: G2 "
                "vs fp32)")


def detail_table(verdict: Verdict) -> Table:
    """The numbers behind the marks: differing elements / max |diff| per tensor (the drift row
    against the reference, the other rows G2 against fp32), dAPE max |diff|, seconds. A case
    name and a number are never split: the names column is as wide as its longest name, the
    number columns as their widest number (``print_detail`` prints lines where that does not
    fit)."""
    table = new_table(DETAIL_TITLE, DETAIL_COLUMNS, marks=DETAIL_COLUMNS[2:] + ("#",),
                      right=DETAIL_COLUMNS[2:] + ("#",), names=("case",), compact=True)
    for i, result in enumerate((verdict.drift, *verdict.cases)):
        table.add_row(*_detail_row(i, result, drift=i == 0))
    return table


def print_detail(verdict: Verdict, console: Console) -> None:
    """The detail table where it fits the console's width; else the same numbers as one
    wrapped line per case (``0 drift/...: fwd -, dKV 0/0.00e+00, ...``), wrapped between
    numbers, never inside a name or a number."""
    table = detail_table(verdict)
    if _console.table_fits(table, console):
        _console.print_table(table, console)
        return
    print_lines(console, DETAIL_TITLE + ":")
    labels = ("fwd", "dKV", "dScore", "dAPE", "s")
    for i, result in enumerate((verdict.drift, *verdict.cases)):
        row = _detail_row(i, result, drift=i == 0)
        numbers = ", ".join(f"{label} {cell.replace(' / ', '/')}"
                            for label, cell in zip(labels, row[2:], strict=True))
        print_lines(console, f"{row[0]} {row[1]}: {numbers}", indent="  ", hang="      ")


def schedules_table(verdict: Verdict) -> Table:
    """The kernels (schedule tags) each case selected, per direction."""
    table = new_table("detail: selected schedules", SCHEDULE_COLUMNS, marks=("#",),
                      right=("#",))
    for i, result in enumerate((verdict.drift, *verdict.cases)):
        table.add_row(str(i), result.name, _schedules(result, "fwd"), _schedules(result, "bwd"))
    return table


def drift_table(result: CaseResult) -> Table:
    """The drift check alone (``csagate reference --check``), one line per fact."""
    table = new_table("csagate reference drift check", ("", "value"), marks=("",))
    for key, value in (
        ("case", result.name), ("config", _config(result)),
        ("schedule", _schedules(result, "bwd")),
        ("dKV diff / max", _diff_cell(result.result("drift", "dkv"))),
        ("dScore diff / max", _diff_cell(result.result("drift", "dscore"))),
        ("dAPE max", _diff_cell(result.result("drift", "dape"), count=False)),
        ("s", f"{result.seconds:.1f}"), ("result", _result(result)),
    ):
        table.add_row(key, value)
    return table


def print_lines(console: Console, text: str, style: str | None = None, *,
                indent: str = "", hang: str = "") -> None:
    """``text`` wrapped at the console's width (never cut), continuation lines under ``hang``."""
    _console.print_wrapped(console, text, style, indent=indent, hang=hang or indent)


def print_verdict(verdict: Verdict, console: Console, *, verbose: bool = False) -> None:
    """The compact verdict, the detail table with ``verbose``, the headline, every reason."""
    _console.print_table(verdict_table(verdict), console)
    if verbose:
        print_detail(verdict, console)
        _console.print_table(schedules_table(verdict), console)
    if verdict.selftest is not None:
        print_lines(console, f"self-test {verdict.selftest.summary}: the gate's own checks "
                             f"gave their known answers on {verdict.selftest.device}")
    style = {V.PASS: "bold green", V.FAIL: "bold red"}.get(verdict.state, "bold yellow")
    print_lines(console, verdict.headline, style)
    for reason in verdict.reasons:
        print_lines(console, short_error(reason), indent="  - ", hang="    ")


def print_drift(result: CaseResult, console: Console) -> None:
    _console.print_table(drift_table(result), console)
    print_lines(console, f"DRIFT {'PASS' if result.ok else 'FAIL'}",
                "bold green" if result.ok else "bold red")
    for reason in result.reasons:
        print_lines(console, reason, indent="  - ", hang="    ")


# --- JSON ------------------------------------------------------------------------------------


def _jsonable(x: Any) -> Any:
    """Plain JSON values; non-finite floats become the strings "inf", "-inf", "nan"."""
    if isinstance(x, float):
        if math.isfinite(x):
            return x
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if isinstance(x, bool | int | str) or x is None:
        return x
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple | set | frozenset):
        return [_jsonable(v) for v in x]
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return _jsonable(dataclasses.asdict(x))
    return str(x)


def _selection_json(sel: Selection) -> dict:
    sched = sel.schedule
    fields = dataclasses.asdict(sched) if dataclasses.is_dataclass(sched) else str(sched)
    return {"direction": sel.direction, "config": sel.config, "tag": sel.tag,
            "schedule": fields}


def _gate_json(g: GateResult) -> dict:
    return {"gate": g.gate, "tensor": g.tensor, "status": g.status, "reason": g.reason,
            "numbers": g.numbers}


def case_json(result: CaseResult) -> dict:
    c = result.case
    return {
        "name": c.name, "kind": c.kind, "why": c.why, "config": c.config, "ratio": c.ratio,
        "coff": c.coff, "d": c.d, "lens": list(c.lens), "tokens": c.tokens, "rows": c.rows,
        "scale": c.scale, "pad_rows": c.pad_rows, "pad_tokens": c.pad_tokens,
        "inputs": c.inputs,
        "seeds": {"input": c.input_seed, "grad": c.grad_seed, "pad_token": c.pad_seed},
        "status": result.status, "error": result.error, "seconds": result.seconds,
        "gate_status": {g: result.gate_status(g) or None for g in ("G1", "G2", "G3", "zeros")},
        "gate_counts": gate_counts(result.gates),
        "schedules": {d: list(result.schedules(d)) for d in ("fwd", "bwd")},
        "selections": [_selection_json(s) for s in result.selections],
        "gates": [_gate_json(g) for g in result.gates],
        "recorded": result.recorded,
        "reasons": list(result.reasons),
    }


def gate_counts(gates) -> dict[str, int]:
    """How many gate rows have each status: an ``n/a`` row (a direction the implementation
    does not provide) is counted as n/a, never as a pass."""
    counts: dict[str, int] = {}
    for g in gates:
        counts[g.status] = counts.get(g.status, 0) + 1
    return counts


def coverage_json(cov: CoverageResult) -> dict:
    out: dict[str, Any] = {"status": cov.status, "summary": cov.summary,
                           "reasons": list(cov.reasons)}
    for d in ("fwd", "bwd"):
        out[d] = {
            "covered": cov.covered(d),
            "expected_count": len(cov.expected.get(d, ())),
            "expected": [s.name for s in cov.expected.get(d, ())],
            "selected": [s.name for s in cov.selected.get(d, ())],
            "missing": [s.name for s in cov.missing(d)],
            "unexpected": [s.name for s in cov.unexpected(d)],
            "beyond": [s.name for s in cov.beyond(d)],
        }
        if d in cov.table:
            out[d]["table"] = dataclasses.asdict(cov.table[d])
    out["edges"] = None if cov.edges is None else dataclasses.asdict(cov.edges)
    return out


def versions() -> dict[str, str]:
    """Which csagate and which contract judged: in every JSON report and JUnit suite."""
    return {"csagate_version": __version__, "contract_version": CONTRACT_VERSION}


def verdict_json(verdict: Verdict, extra: dict[str, Any] | None = None) -> dict:
    """Every recorded number, per case, plus the environment (``extra`` adds CLI facts)."""
    doc = {
        "schema": SCHEMA,
        **versions(),
        "verdict": VERDICT_WORD[verdict.state],
        "exit_code": int(exit_code(verdict)),
        "reason": None if verdict.state in (V.PASS, V.FAIL) else verdict.reasons[-1],
        "headline": verdict.headline,
        "ratio": verdict.ratio,
        "passed": verdict.passed,
        "total": verdict.total,
        "hardening_passed": verdict.hardening_passed,
        "hardening_total": verdict.hardening_total,
        "full_contract": verdict.full,
        "judged_cases": verdict.judged,
        "selftest": None if verdict.selftest is None else verdict.selftest.record(),
        "gate_counts": gate_counts(g for c in verdict.cases for g in c.gates),
        "reasons": list(verdict.reasons),
        "scope": verdict.scope,
        "env": dict(verdict.env),
        "gate_seconds": verdict.seconds,
        "drift": case_json(verdict.drift),
        "cases": [case_json(c) for c in verdict.cases],
        "coverage": coverage_json(verdict.coverage),
    }
    for key, value in (extra or {}).items():
        if key == "env":
            doc["env"].update(value)
        else:
            doc[key] = value
    return _jsonable(doc)


def error_json(reason: str, *, env: dict[str, Any], total: int, full: bool,
               extra: dict[str, Any] | None = None) -> dict:
    """The report of a run that could not evaluate (exit 3): the one-line reason, what is known
    of the environment, and the keys of a verdict left empty (no case was judged)."""
    doc = {
        "schema": SCHEMA,
        **versions(),
        "verdict": COULD_NOT_EVALUATE,
        "exit_code": int(ExitCode.COULD_NOT_EVALUATE),
        "reason": reason,
        "headline": f"GATE {COULD_NOT_EVALUATE}: {reason}",
        "passed": 0,
        "total": total,
        "full_contract": full,
        "reasons": [reason],
        "env": dict(env),
        "drift": None,
        "cases": [],
        "coverage": None,
        **(extra or {}),
    }
    return _jsonable(doc)


def write_json(path: Path, verdict: Verdict, extra: dict[str, Any] | None = None) -> None:
    _write_json(path, verdict_json(verdict, extra))


STDOUT = "-"   # a report path that means standard output


def _write_text(path: Path | str, text: str) -> None:
    if str(path) == STDOUT:
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        Path(path).write_text(text)


def _write_json(path: Path | str, doc: dict) -> None:
    _write_text(path, json.dumps(doc, indent=2, allow_nan=False) + "\n")


def write_error_json(path: Path, reason: str, **kwargs) -> None:
    _write_json(path, error_json(reason, **kwargs))


# --- JUnit XML ---------------------------------------------------------------------------------


def _testcase(suite: ET.Element, classname: str, name: str, seconds: float) -> ET.Element:
    return ET.SubElement(suite, "testcase", classname=classname, name=name,
                         time=f"{seconds:.3f}")


def _case_testcase(suite: ET.Element, result: CaseResult) -> str:
    tc = _testcase(suite, f"csagate.case.{result.case.kind}", result.name, result.seconds)
    if result.status == V.ERROR:
        ET.SubElement(tc, "error", message=result.error, type="error").text = result.error
    elif result.status in (V.UNTRUSTED, V.NA):
        ET.SubElement(tc, "skipped", message=result.error or "not trusted")
    elif result.status == V.INCONCLUSIVE:
        text = result.reasons[0]
        ET.SubElement(tc, "error", message=text, type="inconclusive").text = text
    elif result.status == V.FAIL:
        reasons = result.reasons
        ET.SubElement(tc, "failure", message=reasons[0] if reasons else "failed",
                      type=",".join(sorted({g.gate for g in result.failures}))
                      ).text = "\n".join(reasons)
    lines = [f"{g.gate} {g.tensor}: {g.status}: {g.reason}" for g in result.gates]
    if lines:
        ET.SubElement(tc, "system-out").text = "\n".join(lines)
    return result.status


def junit_xml(verdict: Verdict) -> ET.ElementTree:
    """One testcase per named case: the drift check, every case, and coverage."""
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    suite = ET.Element("testsuite", name=f"csagate.ratio{verdict.ratio}")
    _properties(suite, verdict.env)
    statuses = [_case_testcase(suite, verdict.drift)]
    statuses += [_case_testcase(suite, c) for c in verdict.cases]

    cov = verdict.coverage
    tc = _testcase(suite, "csagate.gate.coverage", "coverage", 0.0)
    if cov.status == V.FAIL:
        ET.SubElement(tc, "failure", message=cov.reasons[0], type="coverage").text = \
            "\n".join(cov.reasons)
    elif cov.status != V.PASS:
        ET.SubElement(tc, "skipped", message=f"coverage {cov.status}: {cov.summary}")
    ET.SubElement(tc, "system-out").text = cov.summary
    statuses.append(cov.status)
    if verdict.state == V.NOTHING_JUDGED:   # every case skipped must not read as green
        tc = _testcase(suite, "csagate.run", "nothing judged", 0.0)
        text = verdict.reasons[-1]
        ET.SubElement(tc, "error", message=text, type="nothing judged").text = text
        statuses.append(V.ERROR)

    for status in statuses:
        counts["tests"] += 1
        if status == V.FAIL:
            counts["failures"] += 1
        elif status in (V.ERROR, V.INCONCLUSIVE):
            counts["errors"] += 1
        elif status != V.PASS:
            counts["skipped"] += 1
    for key, value in counts.items():
        suite.set(key, str(value))
    suite.set("time", f"{verdict.seconds:.3f}")
    root = ET.Element("testsuites", name="csagate", time=f"{verdict.seconds:.3f}",
                      **{k: str(v) for k, v in counts.items()})
    root.append(suite)
    return ET.ElementTree(root)


def _properties(suite: ET.Element, env: dict[str, Any]) -> None:
    props = ET.SubElement(suite, "properties")
    for key, value in sorted({**env, **versions()}.items()):
        ET.SubElement(props, "property", name=str(key), value=str(value))


def error_junit(reason: str, env: dict[str, Any], seconds: float = 0.0, *,
                ratio: int | None = 128) -> ET.ElementTree:
    """An exit-3 run: one testcase "could not evaluate" holding an ``<error>`` with the reason,
    in the suite of the family that could not be judged."""
    counts = {"tests": "1", "failures": "0", "errors": "1", "skipped": "0"}
    suite = ET.Element("testsuite", name=f"csagate.ratio{ratio}", time=f"{seconds:.3f}",
                       **counts)
    _properties(suite, env)
    tc = _testcase(suite, "csagate.run", "could not evaluate", seconds)
    ET.SubElement(tc, "error", message=reason, type="could not evaluate").text = reason
    root = ET.Element("testsuites", name="csagate", time=f"{seconds:.3f}", **counts)
    root.append(suite)
    return ET.ElementTree(root)


def _write_xml(path: Path | str, tree: ET.ElementTree) -> None:
    ET.indent(tree)
    if str(path) == STDOUT:
        _write_text(path, ET.tostring(tree.getroot(), encoding="unicode", xml_declaration=True)
                    + "\n")
    else:
        tree.write(path, encoding="utf-8", xml_declaration=True)


def write_junit(path: Path, verdict: Verdict) -> None:
    _write_xml(path, junit_xml(verdict))


def write_error_junit(path: Path | str, reason: str, env: dict[str, Any], seconds: float = 0.0,
                      *, ratio: int | None = 128) -> None:
    _write_xml(path, error_junit(reason, env, seconds, ratio=ratio))


# --- the kernels of build --json and probe --json ------------------------------------------------

KERNELS_SCHEMA = "csagate.kernels/1"


def kernel_json(key) -> dict:
    """The fields `build --json` and `probe --json` share for one kernel."""
    sched = key.schedule
    schedule = {"tag": getattr(sched, "tag", str(sched))}
    if dataclasses.is_dataclass(sched):
        schedule |= dataclasses.asdict(sched)
    return {"tag": key.tag, "kind": key.kind, "direction": key.direction, "ratio": key.ratio,
            "config": key.config, "coff": key.coff, "d": key.d, "arch": key.arch,
            "deterministic": key.deterministic, "schedule": schedule}


def kernels_doc(command: str, ratio: str, arch: str, kernels: list[dict], **extra) -> str:
    """The one JSON shape of `build --json` and `probe --json`."""
    return json.dumps({"schema": KERNELS_SCHEMA, "command": command, "ratio": ratio,
                       "arch": arch, **extra, "kernels": kernels})
