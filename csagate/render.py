"""Verdict renderers: the rich table (stdout), the JSON report and the JUnit XML report.

All three read the same :class:`csagate.gates.verdict.Verdict`; none of them judges anything. The
table has one row per named gate in the contract's order: the drift check first, the cases,
schedule coverage last; then the headline (``GATE PASS 21/21`` / ``GATE FAIL k/21``) and the
reasons, one line each.
"""

from __future__ import annotations

import dataclasses
import json
import math
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from csagate import console as _console
from csagate.gates.verdict import (
    ERROR,
    FAIL,
    NOT_ASSERTED,
    PASS,
    RECORDED,
    SKIP,
    UNTRUSTED,
    CaseResult,
    CoverageResult,
    GateResult,
    Selection,
    Verdict,
)

SCHEMA = "csagate.verdict/1"

_STYLE = {PASS: "green", FAIL: "bold red", ERROR: "bold red", SKIP: "yellow",
          RECORDED: "cyan", UNTRUSTED: "yellow", NOT_ASSERTED: "yellow"}
_WORD = {PASS: "PASS", FAIL: "FAIL", ERROR: "ERROR", SKIP: "skip", RECORDED: "rec",
         UNTRUSTED: "UNTRUSTED", NOT_ASSERTED: "NOT ASSERTED"}

COLUMNS = ("#", "gate", "config", "schedules fwd / bwd", "G1", "G2", "G3", "zeros",
           "fwd diff / max", "dKV diff / max", "dScore diff / max", "dAPE max", "s", "result")


# --- table ---------------------------------------------------------------------------------


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
    case = result.case
    return case.config if case.ratio == 128 else f"r{case.ratio} {case.config}"


def _schedules(result: CaseResult) -> str:
    fwd = ",".join(result.schedules("fwd")) or "-"
    bwd = ",".join(result.schedules("bwd")) or "-"
    return f"{fwd} / {bwd}"


def _case_row(index: int, result: CaseResult, *, drift: bool = False) -> list:
    cmp_gate = "drift" if drift else "G2"
    return [
        str(index), result.name, _config(result), _schedules(result),
        *(_status(result.gate_status(g)) for g in ("G1", "G2", "G3", "zeros")),
        _diff_cell(result.result(cmp_gate, "out")),
        _diff_cell(result.result(cmp_gate, "dkv")),
        _diff_cell(result.result(cmp_gate, "dscore")),
        _diff_cell(result.result(cmp_gate, "dape"), count=False),
        f"{result.seconds:.1f}", _result(result),
    ]


def _result(result: CaseResult) -> Text:
    if result.status == ERROR:  # a raising case is a FAIL row with the error's one line
        return Text(f"FAIL: {result.error}", style=_STYLE[ERROR])
    return _status(result.status)


def _coverage_row(cov: CoverageResult) -> list:
    return ["", "coverage", "all", cov.summary, *([_status("")] * 4), "-", "-", "-", "-", "",
            _status(cov.status)]


def verdict_table(verdict: Verdict) -> Table:
    env = verdict.env
    where = ", ".join(str(env[k]) for k in ("gpu", "arch") if env.get(k))
    title = f"csagate ratio={verdict.ratio} gate" + (f" on {where}" if where else "")
    table = Table(title=title, title_justify="left")
    for col in COLUMNS:
        right = col in ("#", "s") or "diff" in col or "max" in col
        table.add_column(col, justify="right" if right else "left", no_wrap=True)
    table.add_row(*_case_row(0, verdict.drift, drift=True))
    for i, result in enumerate(verdict.cases, start=1):
        table.add_row(*_case_row(i, result))
    table.add_row(*_coverage_row(verdict.coverage))
    return table


def drift_table(result: CaseResult) -> Table:
    table = Table(title="csagate reference drift check", title_justify="left")
    for col in ("gate", "config", "schedule", "dKV diff / max", "dScore diff / max",
                "dAPE max", "s", "result"):
        right = col == "s" or "max" in col
        table.add_column(col, justify="right" if right else "left", no_wrap=True)
    table.add_row(result.name, _config(result), ",".join(result.schedules("bwd")) or "-",
                  _diff_cell(result.result("drift", "dkv")),
                  _diff_cell(result.result("drift", "dscore")),
                  _diff_cell(result.result("drift", "dape"), count=False),
                  f"{result.seconds:.1f}", _result(result))
    return table


def print_table(table: Table, console: Console) -> None:
    _console.print_table(table, console)


def print_verdict(verdict: Verdict, console: Console) -> None:
    print_table(verdict_table(verdict), console)
    console.print(Text(verdict.headline, style="bold green" if verdict.ok else "bold red"),
                  soft_wrap=True)
    for reason in verdict.reasons:
        console.print(f"  - {reason}", soft_wrap=True)


def print_drift(result: CaseResult, console: Console) -> None:
    print_table(drift_table(result), console)
    console.print(Text(f"DRIFT {'PASS' if result.ok else 'FAIL'}",
                       style="bold green" if result.ok else "bold red"), soft_wrap=True)
    for reason in result.reasons:
        console.print(f"  - {reason}", soft_wrap=True)


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
        "schedules": {d: list(result.schedules(d)) for d in ("fwd", "bwd")},
        "selections": [_selection_json(s) for s in result.selections],
        "gates": [_gate_json(g) for g in result.gates],
        "recorded": result.recorded,
        "reasons": list(result.reasons),
    }


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
        }
        if d in cov.table:
            out[d]["table"] = dataclasses.asdict(cov.table[d])
    out["edges"] = None if cov.edges is None else dataclasses.asdict(cov.edges)
    return out


def verdict_json(verdict: Verdict, extra: dict[str, Any] | None = None) -> dict:
    """Every recorded number, per case, plus the environment (``extra`` adds CLI facts)."""
    doc = {
        "schema": SCHEMA,
        "verdict": "PASS" if verdict.ok else "FAIL",
        "headline": verdict.headline,
        "ratio": verdict.ratio,
        "passed": verdict.passed,
        "total": verdict.total,
        "hardening_passed": verdict.hardening_passed,
        "hardening_total": verdict.hardening_total,
        "full_contract": verdict.full,
        "reasons": list(verdict.reasons),
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


def write_json(path: Path, verdict: Verdict, extra: dict[str, Any] | None = None) -> None:
    text = json.dumps(verdict_json(verdict, extra), indent=2, allow_nan=False)
    Path(path).write_text(text + "\n")


# --- JUnit XML ---------------------------------------------------------------------------------


def _testcase(suite: ET.Element, classname: str, name: str, seconds: float) -> ET.Element:
    return ET.SubElement(suite, "testcase", classname=classname, name=name,
                         time=f"{seconds:.3f}")


def _case_testcase(suite: ET.Element, result: CaseResult) -> str:
    tc = _testcase(suite, f"csagate.gate.{result.case.kind}", result.name, result.seconds)
    if result.status == ERROR:
        ET.SubElement(tc, "error", message=result.error, type="error").text = result.error
    elif result.status == UNTRUSTED:
        ET.SubElement(tc, "skipped", message=result.error or "not trusted")
    elif result.status == FAIL:
        reasons = result.reasons
        ET.SubElement(tc, "failure", message=reasons[0] if reasons else "failed",
                      type=",".join(sorted({g.gate for g in result.failures}))
                      ).text = "\n".join(reasons)
    lines = [f"{g.gate} {g.tensor}: {g.status}: {g.reason}" for g in result.gates]
    if lines:
        ET.SubElement(tc, "system-out").text = "\n".join(lines)
    return result.status


def junit_xml(verdict: Verdict) -> ET.ElementTree:
    """One testcase per named gate: the drift check, every case, coverage."""
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    suite = ET.Element("testsuite", name=f"csagate.ratio{verdict.ratio}")
    props = ET.SubElement(suite, "properties")
    for key, value in sorted(verdict.env.items()):
        ET.SubElement(props, "property", name=str(key), value=str(value))
    statuses = [_case_testcase(suite, verdict.drift)]
    statuses += [_case_testcase(suite, c) for c in verdict.cases]

    cov = verdict.coverage
    tc = _testcase(suite, "csagate.gate.coverage", "coverage", 0.0)
    if cov.status == FAIL:
        ET.SubElement(tc, "failure", message=cov.reasons[0], type="coverage").text = \
            "\n".join(cov.reasons)
    elif cov.status != PASS:
        ET.SubElement(tc, "skipped", message=f"coverage {cov.status}: {cov.summary}")
    ET.SubElement(tc, "system-out").text = cov.summary
    statuses.append(cov.status)

    for status in statuses:
        counts["tests"] += 1
        if status == FAIL:
            counts["failures"] += 1
        elif status == ERROR:
            counts["errors"] += 1
        elif status != PASS:
            counts["skipped"] += 1
    for key, value in counts.items():
        suite.set(key, str(value))
    suite.set("time", f"{verdict.seconds:.3f}")
    root = ET.Element("testsuites", name="csagate", time=f"{verdict.seconds:.3f}",
                      **{k: str(v) for k, v in counts.items()})
    root.append(suite)
    return ET.ElementTree(root)


def write_junit(path: Path, verdict: Verdict) -> None:
    tree = junit_xml(verdict)
    ET.indent(tree)
    tree.write(path, encoding="utf-8", xml_declaration=True)
