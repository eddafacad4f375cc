"""What a gate run found, as frozen data: one record per check, per case, for coverage, overall.

Nothing here prints; ``csagate.render`` turns a :class:`Verdict` into a table, JSON or JUnit.
Every record keeps its numbers (``GateResult.numbers`` is the check's own record as a dict),
so the JSON report holds everything the gate measured.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from csagate.gates.cases import Case
from csagate.kernels.schedule import config_name

# Statuses. A GateResult is pass/fail/skip/recorded/inconclusive/n/a; a CaseResult
# pass/fail/error/untrusted/n/a/inconclusive; coverage pass/fail/not asserted/n/a.
PASS = "pass"
FAIL = "fail"
SKIP = "skip"              # not evaluated, with the reason recorded (overflow G3)
RECORDED = "recorded"      # measured, not gated (dAPE G3 on the scaled case)
ERROR = "error"            # the case raised; its one-line error is the reason
UNTRUSTED = "untrusted"    # not run: the reference drift check failed
NOT_ASSERTED = "not asserted"  # coverage of a subset run
NA = "n/a"                 # does not apply to the implementation judged (never a pass)
INCONCLUSIVE = "inconclusive"  # a gate (or a whole case) with no element judged: no conclusion
NOTHING_JUDGED = "nothing judged"  # a verdict no element of any output was judged for

# What a check judged: a gate result with one of these statuses compared at least one element.
JUDGED = (PASS, FAIL)

GATES = ("G1", "G2", "G3", "zeros", "isolation")
TENSORS = ("out", "dkv", "dscore", "dape")


@dataclass(frozen=True)
class GateResult:
    """One check on one tensor: e.g. G2 on dkv, with the check's numbers."""

    gate: str                  # "G1" | "G2" | "G3" | "zeros" | "isolation" | "drift"
    tensor: str                # "out" | "dkv" | "dscore" | "dape" | "dkv[token pad]" |
    #                            "out[NaN mask]" ...
    status: str
    numbers: dict[str, Any]
    reason: str = ""           # the check's one-line summary

    @property
    def ok(self) -> bool:
        return self.status != FAIL

    @property
    def judged(self) -> bool:
        """Whether this check compared at least one element (pass or fail)."""
        return self.status in JUDGED


@dataclass(frozen=True)
class Selection:
    """A kernel a run selected (or the tables can select): direction, config, schedule."""

    direction: str             # "fwd" | "bwd"
    coff: int
    d: int
    schedule: Any              # csagate.kernels.schedule.FwdSchedule / BwdSchedule (hashable)

    @property
    def config(self) -> str:
        return config_name(self.coff, self.d)

    @property
    def tag(self) -> str:
        return str(getattr(self.schedule, "tag", self.schedule))

    @property
    def name(self) -> str:
        return f"{self.direction} {self.config} {self.tag}"


@dataclass(frozen=True)
class CaseResult:
    """Every check of one case (or of the drift check), what it selected, how long it took."""

    case: Case
    status: str
    gates: tuple[GateResult, ...] = ()
    selections: tuple[Selection, ...] = ()
    recorded: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    error: str = ""            # one line, when the case raised

    @property
    def ok(self) -> bool:
        return self.status == PASS

    @property
    def applies(self) -> bool:
        """False for a case outside the judged implementation's envelope (``n/a``)."""
        return self.status != NA

    @property
    def name(self) -> str:
        return self.case.name

    def results(self, gate: str) -> tuple[GateResult, ...]:
        return tuple(g for g in self.gates if g.gate == gate)

    def result(self, gate: str, tensor: str) -> GateResult | None:
        for g in self.gates:
            if g.gate == gate and g.tensor == tensor:
                return g
        return None

    def gate_status(self, gate: str) -> str:
        """The column value of one gate: fail if any tensor failed, else pass/skip/recorded."""
        found = self.results(gate)
        if not found:
            return ""
        for status in (FAIL, PASS, RECORDED, SKIP, INCONCLUSIVE, NA):
            if any(g.status == status for g in found):
                return status
        return found[0].status

    @property
    def failures(self) -> tuple[GateResult, ...]:
        return tuple(g for g in self.gates if g.status == FAIL)

    def schedules(self, direction: str) -> tuple[str, ...]:
        tags = []
        for sel in self.selections:
            if sel.direction == direction and sel.tag not in tags:
                tags.append(sel.tag)
        return tuple(tags)

    @property
    def judged(self) -> int:
        """How many of its checks compared at least one element."""
        return sum(1 for g in self.gates if g.judged)

    @property
    def reasons(self) -> tuple[str, ...]:
        if self.status == ERROR:
            return (f"{self.name}: raised {self.error}",)
        if self.status == INCONCLUSIVE:
            return (f"{self.name}: judged nothing: every check was inconclusive or n/a",)
        if self.status in (UNTRUSTED, NA):
            return ()
        return tuple(f"{self.name}: {g.gate} {g.tensor}: {g.reason}" for g in self.failures)


def case_status(gates) -> str:
    """A judged case's status from its checks: fail if any failed, pass if at least one
    judged an element, else inconclusive (a case whose every check concluded nothing is not
    a pass)."""
    if any(g.status == FAIL for g in gates):
        return FAIL
    return PASS if any(g.judged for g in gates) else INCONCLUSIVE


@dataclass(frozen=True)
class CoverageResult:
    """Selected kernels per direction against every kernel of the tables' entries, and the
    bucket-edge probes (docs/CONTRACT.md section 5.4); ``table``/``edges`` are the checks' own
    records."""

    status: str
    expected: dict[str, tuple[Selection, ...]]
    selected: dict[str, tuple[Selection, ...]]
    table: dict[str, Any] = field(default_factory=dict)  # direction -> checks.TableCoverage
    edges: Any = None          # checks.BucketEdges; None when the contract declares no buckets

    def missing(self, direction: str) -> tuple[Selection, ...]:
        got = set(self.selected.get(direction, ()))
        return tuple(s for s in self.expected.get(direction, ()) if s not in got)

    def _outside(self, direction: str) -> tuple[Selection, ...]:
        want = set(self.expected.get(direction, ()))
        return tuple(s for s in self.selected.get(direction, ()) if s not in want)

    def _configs(self) -> set[tuple[int, int]]:
        return {(s.coff, s.d) for sels in self.expected.values() for s in sels}

    def unexpected(self, direction: str) -> tuple[Selection, ...]:
        """Selected kernels of the expected configs that no table entry holds."""
        beyond = set(self.beyond(direction))
        return tuple(s for s in self._outside(direction) if s not in beyond)

    def beyond(self, direction: str) -> tuple[Selection, ...]:
        """Selected kernels of configs beyond the expected ones (a case at an extra head dim):
        reported, neither expected nor a failure."""
        configs = self._configs()
        return tuple(s for s in self._outside(direction)
                     if configs and (s.coff, s.d) not in configs)

    def covered(self, direction: str) -> int:
        want = set(self.expected.get(direction, ()))
        return sum(1 for s in self.selected.get(direction, ()) if s in want)

    @property
    def ok(self) -> bool:
        return self.status != FAIL

    @property
    def summary(self) -> str:
        if self.status == NA:
            return "n/a: no dispatch hooks"
        text = ", ".join(f"{d} {self.covered(d)}/{len(self.expected.get(d, ()))}"
                         for d in ("fwd", "bwd"))
        if self.edges is not None:
            text += f", edges {self.edges.n_probes - self.edges.n_mismatch}/{self.edges.n_probes}"
        return text

    @property
    def reasons(self) -> tuple[str, ...]:
        if self.status != FAIL:
            return ()
        out = []
        for d in ("fwd", "bwd"):
            missing = self.missing(d)
            if missing:
                out.append("coverage (table entries): no case selects "
                           + ", ".join(s.name for s in missing))
            extra = self.unexpected(d)
            if extra:
                out.append("coverage (table entries): selected but in no table entry: "
                           + ", ".join(s.name for s in extra))
        if self.edges is not None and not self.edges.ok:
            out.append("bucket edges: " + self.edges.summary())
        return tuple(out)


@dataclass(frozen=True)
class Verdict:
    """The drift check, the cases in order, coverage; PASS only if all of them pass."""

    drift: CaseResult
    cases: tuple[CaseResult, ...]  # the named cases, then the hardening cases
    coverage: CoverageResult
    full: bool                 # False for a --case / --quick subset: coverage is not asserted
    env: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    ratio: int = 128           # the contract family
    scope: str = ""            # what was judged when not everything applies (the headline says)
    selftest: Any = None       # the known-answer self-tests run before it (selftest.SelfTests)

    def _of(self, hardening: bool) -> tuple[CaseResult, ...]:
        """hardening True: the hardening cases; False: the named (upstream) cases (the
        deterministic-mode cases, section 2.5, are counted apart: ``_kind``)."""
        if hardening:
            return self._kind("hardening")
        return tuple(c for c in self.cases if c.applies
                     and c.case.kind not in ("hardening", "deterministic"))

    def _kind(self, kind: str) -> tuple[CaseResult, ...]:
        """The applicable cases of one kind (``n/a`` cases are counted nowhere)."""
        return tuple(c for c in self.cases if c.case.kind == kind and c.applies)

    @property
    def deterministic_passed(self) -> int:
        return sum(1 for c in self._kind("deterministic") if c.ok)

    @property
    def deterministic_total(self) -> int:
        return len(self._kind("deterministic"))

    @property
    def passed(self) -> int:
        """Named (upstream) cases passed; the hardening cases are counted apart."""
        return sum(1 for c in self._of(False) if c.ok)

    @property
    def total(self) -> int:
        return len(self._of(False))

    @property
    def hardening_passed(self) -> int:
        return sum(1 for c in self._of(True) if c.ok)

    @property
    def hardening_total(self) -> int:
        return len(self._of(True))

    @property
    def drift_run(self) -> bool:
        """False when the drift check was not run (``n/a``: no production kernels here, e.g.
        on the CPU); the verdict then follows the cases, and the headline says so."""
        return self.drift.status != NA

    @property
    def judged(self) -> int:
        """The applicable cases that judged something (passed, failed or raised): the drift
        check, which judges the reference, is not counted."""
        return sum(1 for c in self.cases if c.status in (PASS, FAIL, ERROR))

    @property
    def inconclusive(self) -> tuple[CaseResult, ...]:
        return tuple(c for c in self.cases if c.status == INCONCLUSIVE)

    @property
    def failed(self) -> bool:
        """Something was judged and failed: the drift check (when run), a case (a failed
        gate, a raise, untrusted after a failed drift check), coverage or the bucket edges."""
        return ((self.drift_run and not self.drift.ok)
                or any(c.status in (FAIL, ERROR, UNTRUSTED) for c in self.cases)
                or self.coverage.status == FAIL
                or (self.full and self.coverage.status not in (PASS, NA)))

    @property
    def state(self) -> str:
        """``pass``, ``fail``, ``nothing judged`` (no case judged an element: every case
        n/a, none selected, or all inconclusive) or ``inconclusive`` (some case judged
        nothing). Only ``pass`` is green."""
        if self.failed:
            return FAIL
        if not self.judged:
            return NOTHING_JUDGED
        if self.inconclusive:
            return INCONCLUSIVE
        return PASS

    @property
    def ok(self) -> bool:
        return self.state == PASS

    @property
    def headline(self) -> str:
        """``GATE PASS 21/21 + 3/3 hardening``: the upstream count stays visible; a run that
        judged nothing says so in its first words."""
        word = {PASS: "PASS", FAIL: "FAIL", NOTHING_JUDGED: "NOTHING JUDGED",
                INCONCLUSIVE: "INCONCLUSIVE"}[self.state]
        line = f"GATE {word} {self.passed}/{self.total}"
        if self.hardening_total:
            line += f" + {self.hardening_passed}/{self.hardening_total} hardening"
        if self.deterministic_total:
            line += (f" + {self.deterministic_passed}/{self.deterministic_total} "
                     "deterministic")
        if not self.full:
            line += " (subset run: schedule coverage not asserted, not the full contract)"
        if self.scope:
            line += f" [{self.scope}]"
        if not self.drift_run:
            line += f" (drift check {self.drift.error or 'not run'})"
        return line

    @property
    def reasons(self) -> tuple[str, ...]:
        out = []
        if not self.drift.ok and self.drift_run:
            out.extend(self.drift.reasons)
            out.append(f"the reference drift check failed: the {len(self.cases)} cases are "
                       "not trusted and were not run")
        for case in self.cases:
            out.extend(case.reasons)
        out.extend(self.coverage.reasons)
        if self.state == NOTHING_JUDGED:
            na = [c for c in self.cases if c.status == NA]
            if not self.cases:
                out.append("no case was selected: nothing was judged")
            elif na and len(na) == len(self.cases):
                out.append(f"every selected case is n/a ({na[0].error.removeprefix('n/a: ')}"
                           + (f", and {len(na) - 1} more" if len(na) > 1 else "")
                           + "): nothing was judged")
            else:
                out.append("no selected case judged an element: nothing was judged")
        return tuple(out)
