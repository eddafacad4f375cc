"""The gate run (docs/CONTRACT.md sections 5 and 7): drift check, the cases in order, coverage.

:func:`run_gate` takes the driver and a :class:`~csagate.gates.contracts.Contract` (the CLI
passes the real kernels and ``R128`` or ``R4``; the CPU tests pass small contracts and faulty
reference drivers) and returns a :class:`~csagate.gates.verdict.Verdict`. Everything that
differs between the ratio=128 and ratio=4 families (cases, G2 rule per tensor, G3's eager
path, coverage source, bucket edges) is the contract's data. Inputs and references are built
on the driver's device, so in production the fp32 eager and the fp64 oracle run on the GPU.

Per case:

* the forward and the backward run 3 times each into fresh buffers: run 1 zero-filled,
  runs 2 and 3 NaN-filled (``dape`` is always zero-filled: it accumulates);
* G1 compares the runs' bit patterns (out, dKV, dScore) and forbids NaN, except in the
  tensors where the case's inputs make eager NaN too (``NAN_EXPECTED``);
* ``zeros``: every never-consumed slot of dKV/dScore is exactly zero in every run (a slot
  the kernel leaves unwritten shows up as NaN in runs 2-3); padding cases also report the
  token-padding rows [cu[B], T) on their own;
* G2 (the contract's rule per tensor) and G3 judge run 1 against the fp32 eager reference and
  the fp64 oracle, with the scaled case's bounds (dKV and dScore a token range at a time, as
  the references' pieces come: ``gates.piecewise``; neither reference is ever held whole);
  the overflow case replaces them by full NaN-mask equality and a recorded G3 skip; cases
  with some non-finite inputs (partial overflow, padding-only inf/NaN) add NaN-mask equality
  (``X[NaN mask]``) and judge G2 where eager is not NaN and G3 where it is finite;
* ``isolation`` (padding-only inf/NaN): the gradients equal a backward of the same pack
  without the non-finite values, and the reference itself keeps them out (docs/CONTRACT.md
  section 2.3).

A case that raises is an ``error`` row with the exception's one-line text; the run goes on.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from time import perf_counter
from typing import Any

import torch
from csagate.gates import comparators, limits
from csagate.gates import coverage as cov_checks
from csagate.gates.cases import Case
from csagate.gates.contracts import Contract
from csagate.gates.driver import Driver, ProgressFn, Target
from csagate.gates.errors import one_line
from csagate.gates.join import join
from csagate.gates.locate import locate_failures
from csagate.gates.memory import tensor_bytes
from csagate.gates.piecewise import Check, Pending, Slice, done, judge, reference_pieces
from csagate.gates.plugin import Applies, applies_to
from csagate.gates.verdict import (
    ERROR,
    FAIL,
    INCONCLUSIVE,
    NA,
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
    case_status,
)
from csagate.reference import (
    backward,
    make_grad_out,
    make_pack,
    never_consumed_mask,
    overflow_pack,
    pad_nonfinite_slots,
    partial_overflow_slots,
    peaked,
    with_values,
)

RUNS = 3
# dAPE through the op vs the direct path: both accumulate with fp32 atomics in a run-dependent
# order; at unit scale their difference is a few fp32 ulps of values <= ~1 (the dAPE replay
# delta recorded per case is ~1e-6), so 1e-5 absolute catches a wrong op and not the order.
OP_DAPE_NOISE = 1e-5
GRADS = ("dkv", "dscore")
OUTPUTS = ("out", "dkv", "dscore")
DIRECTIONS = ("fwd", "bwd")
TENSORS = ("out", "dkv", "dscore", "dape")
# The tensors in which a case's inputs make eager NaN too: G1 allows NaN there only.
NAN_EXPECTED = {"random": (), "overflow": OUTPUTS, "partial_overflow": OUTPUTS,
                "pad_nonfinite": ("out",), "zero_ape": (), "peaked": ()}
# Input kinds judged like random draws (G2 and G3 everywhere, no NaN allowed).
FINITE_INPUTS = ("random", "zero_ape", "peaked")


def build_targets(cases: Sequence[Case], drift: Case | None) -> tuple[Target, ...]:
    """The (ratio, coff, d) build units the drift check and ``cases`` need, in first-use order."""
    targets: list[Target] = []
    for case in ((drift,) if drift else ()) + tuple(cases):
        target = (case.ratio, case.coff, case.d)
        if target not in targets:
            targets.append(target)
    return tuple(targets)


def run_gate(driver: Driver, contract: Contract, *, cases: Sequence[Case] | None = None,
             progress: ProgressFn | None = None, drift_driver: Driver | None = None,
             drift_na: str | None = None) -> Verdict:
    """Drift check, then every case (a failure never hides the others), then coverage.

    ``cases`` (default: the contract's cases and hardening cases) may be a subset, in the
    contract's order; coverage is then not asserted. If the drift check fails, the cases are
    reported as untrusted and not run. ``drift_driver`` (default ``driver``): the kernels the
    drift check judges the reference with, when ``driver`` is another implementation. What
    does not apply to ``driver`` (its ``applies``: a direction, the deterministic mode, the
    dispatch hooks, a case outside its envelope) is ``n/a``. ``drift_na`` (a reason): the
    drift check is not run (no production kernels here, e.g. on the CPU); it is ``n/a`` and
    the cases run.

    First the known-answer self-tests of the gate's machinery on ``driver.device``
    (``selftest.ensure``, once per process): :class:`~csagate.gates.selftest.SelfTestFailed`
    when one gives a wrong answer, and then there is no verdict.
    """
    from csagate.gates import selftest

    tests = selftest.ensure(driver.device)
    applies = applies_to(driver)
    start = perf_counter()
    cases = contract.all_cases if cases is None else tuple(cases)
    full = set(cases) == set(contract.all_cases)
    total = len(cases) + 2
    _tick(progress, 0, total, f"drift check {contract.drift.name}")
    drift_result = CaseResult(contract.drift, NA, error=drift_na) if drift_na else \
        run_drift(drift_driver or driver, contract.drift)
    trusted = drift_result.ok or drift_result.status == NA
    results = []
    for i, case in enumerate(cases, start=1):
        if not trusted:
            results.append(CaseResult(case, UNTRUSTED,
                                      error="not run: the reference drift check failed"))
            continue
        if not applies.covers(case):
            results.append(CaseResult(case, NA, error=applies.why_not(case)))
            continue
        _tick(progress, i, total, case.name)
        results.append(run_case(driver, case, contract))
    results = _compare_scaled(results)
    _tick(progress, total - 1, total, "schedule coverage")
    if not applies.dispatch:
        cov = CoverageResult(status=NA, expected={}, selected={})
    else:
        if not trusted:
            status = UNTRUSTED
        else:
            status = None if full else NOT_ASSERTED
        cov = coverage(driver, contract, results, status=status)
    _tick(progress, total, total, "done")
    return Verdict(drift=drift_result, cases=tuple(results), coverage=cov, full=full,
                   env=driver.describe(), seconds=perf_counter() - start,
                   ratio=contract.ratio, scope=applies.scope, selftest=tests)


def _compare_scaled(results: list[CaseResult]) -> list[CaseResult]:
    """Record (not gate) whether a scaled case differs in as many elements as its unit-scale
    twin: a power-of-two input scale is exact, so the counts should be identical."""
    out = []
    for r in results:
        twin = next((t for t in results if t.case.kind == "union" and t.status in (PASS, FAIL)
                     and (t.case.coff, t.case.d, t.case.lens) == (r.case.coff, r.case.d,
                                                                 r.case.lens)), None)
        if r.case.kind != "scaled" or twin is None or r.status not in (PASS, FAIL):
            out.append(r)
            continue
        counts = {}
        for name in OUTPUTS:
            mine, theirs = r.result("G2", name), twin.result("G2", name)
            if mine is not None and theirs is not None and "n_diff" in mine.numbers:
                counts[name] = [mine.numbers["n_diff"], theirs.numbers["n_diff"]]
        recorded = {**r.recorded, "unit_scale_twin": twin.name, "n_diff_scaled_vs_twin": counts,
                    "n_diff_same_as_twin": all(a == b for a, b in counts.values())}
        out.append(replace(r, recorded=recorded))
    return out


def _tick(progress: ProgressFn | None, done: int, total: int, label: str) -> None:
    if progress is not None:
        progress(done, total, label)


# --- the drift check -------------------------------------------------------------------------


def run_drift(driver: Driver, drift: Case) -> CaseResult:
    """Production ratio=4 backward vs the fp32 reference: bitwise dKV/dScore, dAPE within 1e-3."""
    start = perf_counter()
    try:
        pack = make_pack(drift.lens, ratio=drift.ratio, coff=drift.coff, d=drift.d,
                         seed=drift.input_seed, pad_rows=drift.pad_rows,
                         pad_tokens=drift.pad_tokens, pad_seed=drift.pad_seed,
                         device=driver.device)
        go = make_grad_out(pack.n_rows, drift.d, seed=drift.grad_seed, device=driver.device)
        dkv = torch.zeros_like(pack.kv)
        dscore = torch.zeros_like(pack.score)
        dape = torch.zeros_like(pack.ape)
        sel = driver.backward(*pack.inputs(), go, dkv, dscore, dape, ratio=drift.ratio,
                               coff=drift.coff)
        eager = backward(*pack.inputs(), go, ratio=drift.ratio, coff=drift.coff,
                         precision="fp32")
        gates = [
            _gate("drift", "dkv", comparators.bitwise(dkv, eager.dkv)),
            _gate("drift", "dscore", comparators.bitwise(dscore, eager.dscore)),
            _gate("drift", "dape",
                  comparators.tolerance(dape, eager.dape, bound=limits.DAPE_MAX_ABS, allowed=None)),
            _oracle_check(drift, driver.device),
        ]
        _sync(driver.device)
    except Exception as exc:  # a raising drift check is a failed one: nothing is trusted
        return CaseResult(drift, ERROR, seconds=perf_counter() - start, error=one_line(exc))
    finally:
        _release(driver.device, drift)
    status = PASS if all(g.ok for g in gates) else FAIL
    return CaseResult(drift, status, tuple(gates), tuple(s for s in (sel,) if s is not None),
                      seconds=perf_counter() - start)


# The second derivation's pack at the drift case's config (``reference.scalar``): tails, an
# empty and a short segment, capacity rows and token rows.
ORACLE_LENS, ORACLE_PAD_ROWS, ORACLE_PAD_TOKENS = (13, 0, 8, 3, 21), 2, 3


def _oracle_check(drift: Case, device) -> GateResult:
    """The fp64 oracle on ``device`` against its scalar derivation (``reference.scalar``), on a
    small pack at the drift case's config: G3's yardstick checked by an independent form."""
    from csagate.reference.scalar import check_oracle

    found = check_oracle(drift.ratio, drift.coff, drift.d, ORACLE_LENS, ORACLE_PAD_ROWS,
                         ORACLE_PAD_TOKENS, device=device)
    return GateResult("oracle", "fp64", PASS if found.ok else FAIL, asdict(found),
                      found.summary())


# --- one case --------------------------------------------------------------------------------


def run_case(driver: Driver, case: Case, contract: Contract) -> CaseResult:
    """All gates of one case; an exception becomes an ``error`` row with its one-line text."""
    start = perf_counter()
    selections: list[Selection] = []  # filled as kernels run: kept even if the case raises
    try:
        gates, recorded = _evaluate(driver, case, contract, selections)
        _sync(driver.device)
    except Exception as exc:  # out of memory, a launch error: report it, keep going
        return CaseResult(case, ERROR, selections=tuple(selections),
                          seconds=perf_counter() - start, error=one_line(exc))
    finally:
        _release(driver.device, case)
    return CaseResult(case, case_status(gates), tuple(gates), tuple(selections), recorded,
                      seconds=perf_counter() - start)


def _inputs(case: Case, device):
    """(pack, grad_out, the clean pack of a non-finite case or None, the non-finite slots)."""
    if case.inputs == "overflow":
        pack, go = overflow_pack(case.lens, ratio=case.ratio, coff=case.coff, d=case.d,
                                 device=device)
        return pack, go, None, ()
    pack = make_pack(case.lens, ratio=case.ratio, coff=case.coff, d=case.d,
                     seed=case.input_seed, pad_rows=case.pad_rows, pad_tokens=case.pad_tokens,
                     scale=case.scale, pad_seed=case.pad_seed, device=device)
    # All N rows get grad_out, capacity padding rows included: nonzero there on the fused
    # side; the reference excludes those rows by construction.
    go = make_grad_out(pack.n_rows, case.d, seed=case.grad_seed, scale=case.scale,
                       device=device)
    if case.inputs == "random":
        return pack, go, None, ()
    if case.inputs == "zero_ape":  # CSA2-style: trained without APE, s = f32(score)
        return replace(pack, ape=torch.zeros_like(pack.ape)), go, None, ()
    if case.inputs == "peaked":  # scores x16: e_k below 2^-64, subnormal and zero
        return peaked(pack), go, None, ()
    place = {"partial_overflow": partial_overflow_slots,
             "pad_nonfinite": pad_nonfinite_slots}[case.inputs]
    slots = place(case.lens, ratio=case.ratio, coff=case.coff, d=case.d)
    return with_values(pack, slots), go, pack, slots


case_inputs = _inputs   # the gate's inputs of a case (``csagate compare`` uses the same)


def _fill(run: int) -> float:
    return 0.0 if run == 0 else math.nan


def _record(selections: list[Selection], sel: Selection | None) -> None:
    if sel is not None and sel not in selections:
        selections.append(sel)


def _fused_backward(driver: Driver, case: Case, ins, go, fill: float):
    dev = driver.device
    n_tokens, width = ins[0].shape
    dkv = torch.full((n_tokens, width), fill, dtype=torch.bfloat16, device=dev)
    dscore = torch.full_like(dkv, fill)
    dape = torch.zeros((case.ratio, width), dtype=torch.float32, device=dev)
    sel = driver.backward(*ins, go, dkv, dscore, dape, ratio=case.ratio, coff=case.coff,
                          deterministic=case.deterministic)
    return sel, {"dkv": dkv, "dscore": dscore, "dape": dape}


def _through_op(driver: Driver, case: Case, ins, go, n_rows: int,
                first: dict[str, torch.Tensor]) -> list[GateResult]:
    """Gate ``op``: the torch op (forward, then the autograd backward) gives what the direct
    kernel path gave: out, dKV, dScore bitwise (NaN patterns too), dAPE within the fp32
    atomics' order noise (1e-5, scaled like dScore). The op adds no numerics.

    Each op tensor is compared with the direct path's buffer of the same name (``first``, run
    1), and the two must be distinct storage: an op tensor that aliases the direct path's
    buffer, or another op output, would compare a tensor with itself (an op that swapped dKV
    and dScore, say, could then pass), so it fails the gate instead."""
    out, (dkv, dscore, dape) = driver.through_op(*ins, go, n_rows=n_rows, ratio=case.ratio,
                                                  coff=case.coff)
    via_op = {"out": out, "dkv": dkv, "dscore": dscore, "dape": dape}
    gates = []
    for name in TENSORS:
        direct, got = first[name], via_op[name]
        shared = [f"the direct path's {name}"] if _same_storage(got, direct) else []
        shared += [f"the op's {other}" for other in TENSORS
                   if other != name and _same_storage(got, via_op[other])]
        if shared:
            gates.append(GateResult("op", name, FAIL, {"aliases": shared},
                                    f"the op's {name} shares storage with "
                                    f"{' and '.join(shared)}: nothing would be compared"))
        elif name == "dape":
            both_nan = torch.isnan(got) & torch.isnan(direct)  # NaN in one only still fails
            gates.append(_gate("op", name, comparators.tolerance(
                got, direct, bound=OP_DAPE_NOISE * case.scale ** 2, allowed=None,
                mask=~both_nan)))
        else:
            gates.append(_gate("op", name, comparators.bitwise_replay([direct, got],
                                                                      allow_nan=True)))
    return gates


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors are one object or views of one storage."""
    if a is b:
        return True
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() and a.numel() > 0


@dataclass
class _Runs:
    """What the implementation's ``RUNS`` runs leave: run 1 of every output, G1 and the zeros
    records of the later runs (judged as each run comes, then dropped: the gate holds two runs
    of a tensor at a time, not all of them), and every dAPE run (small)."""

    first: dict[str, torch.Tensor] = field(default_factory=dict)
    replay: dict[str, comparators.ReplayTracker] = field(default_factory=dict)
    zeros: dict[str, list] = field(default_factory=dict)   # label -> a Zeros record per run
    dape: list[torch.Tensor] = field(default_factory=list)

    def take(self, name: str, t: torch.Tensor, allow_nan: bool) -> None:
        if name not in self.first:
            self.first[name] = t
            self.replay[name] = comparators.ReplayTracker(t, allow_nan=allow_nan)
        else:
            self.replay[name].add(t)


def _fused_runs(driver: Driver, case: Case, ins, go, n_rows: int, applies: Applies,
                selections: list[Selection], masks: _ZeroMasks) -> _Runs:
    """The forward, then (if provided) the backward, ``RUNS`` times each into fresh buffers
    (run 1 zero-filled, the others NaN-filled); ``masks`` (the slots to hold exact zeros)
    judged in every run of dKV and dScore."""
    dev = driver.device
    nan_ok = NAN_EXPECTED[case.inputs]
    runs = _Runs()
    for run in range(RUNS):
        out = torch.full((n_rows, case.d), _fill(run), dtype=torch.bfloat16, device=dev)
        _record(selections, driver.forward(*ins, out, ratio=case.ratio, coff=case.coff))
        runs.take("out", out, "out" in nan_ok)
        del out
    if not applies.backward:
        return runs
    for run in range(RUNS):
        sel, grads = _fused_backward(driver, case, ins, go, _fill(run))
        _record(selections, sel)
        found = masks.exact_zeros(grads)
        for name in GRADS:
            for label in masks.labels:
                runs.zeros.setdefault(f"{name}{label}", []).append(found[name, label])
            runs.take(name, grads[name], name in nan_ok)
        if case.deterministic:
            runs.take("dape", grads["dape"], "dape" in nan_ok)
        runs.first.setdefault("dape", grads["dape"])
        runs.dape.append(grads["dape"])
        del grads
    return runs


@dataclass(frozen=True)
class _ZeroMasks:
    """The slots whose gradients must be exact zeros, by label: the never-consumed slots ("")
    and, with token padding, the padding rows [cu[B], T) ("[token pad]"); judged a token range
    at a time (the masks of the largest packs are a byte a slot)."""

    pack: Any
    labels: tuple[str, ...]

    def mask(self, label: str, start: int, end: int) -> torch.Tensor:
        pack = self.pack
        if label == "":
            return never_consumed_mask(pack.cu, ratio=pack.ratio, coff=pack.coff, d=pack.d,
                                       n_tokens=pack.n_tokens, tokens=(start, end))
        pad = torch.zeros((end - start, pack.kv.shape[1]), dtype=torch.bool,
                          device=pack.kv.device)
        pad[max(0, int(pack.cu[-1]) - start):] = True
        return pad

    def exact_zeros(self, grads) -> dict[tuple[str, str], comparators.Zeros]:
        """(tensor, label) -> the ``exact_zeros`` record of the whole tensor."""
        n_tokens, width = self.pack.kv.shape
        step = max(1, comparators.CHUNK // max(1, width))
        starts = list(range(0, n_tokens, step)) or [0]
        found: dict[tuple[str, str], list] = {}
        for start in starts:
            end = min(start + step, n_tokens)
            for label in self.labels:
                mask = self.mask(label, start, end)
                for name in GRADS:
                    found.setdefault((name, label), []).append(
                        comparators.exact_zeros(grads[name][start:end], mask))
        return {key: join(records, starts) for key, records in found.items()}


def _na(gate: str, tensor: str) -> GateResult:
    return GateResult(gate, tensor, NA, {}, "n/a: the implementation provides no backward")


def _evaluate(driver: Driver, case: Case, contract: Contract, selections: list[Selection]):
    dev = driver.device
    applies = applies_to(driver)
    pack, go, clean, slots = _inputs(case, dev)
    ins = pack.inputs()
    masks = _ZeroMasks(pack, ("", "[token pad]") if case.pad_tokens else ("",))
    runs = _fused_runs(driver, case, ins, go, pack.n_rows, applies, selections, masks)
    first = runs.first
    names = tuple(first)
    # The implementation's last calls (the clean pack's backward, the op) before the
    # references, whose working set would otherwise come on top of the op's buffers.
    isolation = case.inputs == "pad_nonfinite" and applies.backward
    fused_isolation: list[GateResult] = []
    if isolation:   # the implementation's gradients of the same pack without the values
        sel, clean_grads = _fused_backward(driver, case, clean.inputs(), go, 0.0)
        _record(selections, sel)
        fused_isolation = _isolation(first, clean_grads)
        del clean_grads
    op = _through_op(driver, case, ins, go, pack.n_rows, first) \
        if contract.via_op and applies.op else []

    pending = [done(_gate("G1", name, runs.replay[name].result())
                    if name in runs.replay else _na("G1", name))
               for name in OUTPUTS + (("dape",) if case.deterministic else ())]
    for name in GRADS:
        for label in masks.labels:
            tensor = f"{name}{label}"
            pending.append(done(_zeros(tensor, runs.zeros[tensor]) if tensor in runs.zeros
                                else _na("zeros", tensor)))
    if case.inputs == "overflow":
        pending.extend(_overflow_g2_g3(names))
    elif case.inputs in FINITE_INPUTS:
        pending.extend(_g2(contract, case, names, claims=applies.bitwise))
        pending.extend(_g3(case, names))
    else:
        pending.extend(_finite_g2_g3(contract, case, names, claims=applies.bitwise))
    if isolation:
        pending.extend([*map(done, fused_isolation), _isolation_eager()])
    elif case.inputs == "pad_nonfinite":
        pending.extend(done(_na("isolation", name)) for name in GRADS + ("dape",))
    pending.extend(map(done, op))
    pending.append(_recorded(case, pack, go, runs, slots))

    pieces = reference_pieces(ins, go, ratio=case.ratio, coff=case.coff,
                              clean_ins=clean.inputs() if isolation else None)
    results, (eager, oracle, _) = judge(pending, first, pieces)
    gates, recorded = results[:-1], results[-1]
    whole = {"out": (eager.out, oracle.out), "dape": (eager.dape, oracle.dape)}
    where = locate_failures(gates, first, whole, pack, lambda: reference_pieces(
        ins, go, ratio=case.ratio, coff=case.coff))
    if where:
        recorded["where"] = where
    return gates, recorded


def _recorded(case: Case, pack, go, runs: _Runs, slots) -> Pending:
    """The numbers kept beside the gates (not gated)."""
    first = runs.first
    outputs = [n for n in OUTPUTS if n in first]
    checks = ([Check(n, lambda x: comparators.bitwise_equal(x.fused, x.eager), all)
               for n in outputs]
              + [Check(n, lambda x: comparators.max_abs_error(x.fused, x.oracle), max)
                 for n in first]
              + [Check(n, lambda x: comparators.max_abs_error(x.eager, x.oracle), max)
                 for n in TENSORS]
              + ([Check(n, lambda x: comparators.count(torch.isnan(x.eager)), sum) for n in TENSORS]
                 if slots else []))

    def finish(*found) -> dict[str, Any]:
        found = iter(found)
        recorded: dict[str, Any] = {
            "n_rows": pack.n_rows,
            "n_tokens": pack.n_tokens,
            "bitwise_equal_to_eager": {n: next(found) for n in outputs},
            "err_fused": {n: next(found) for n in first},
            "err_eager": {n: next(found) for n in TENSORS},
        }
        if runs.dape:
            recorded["dape_replay_delta"] = comparators.replay_delta(runs.dape)
        if slots:
            recorded["nonfinite_slots"] = [{"tensor": t, "token": tok, "column": col,
                                            "value": str(v)} for t, tok, col, v in slots]
            recorded["eager_nan"] = {n: next(found) for n in TENSORS}
        if case.pad_rows:
            valid = int(pack.cuc[-1])
            recorded["pad_rows_grad_out_nonzero"] = bool((go[valid:] != 0).any())
        return recorded

    return Pending(tuple(checks), finish)


def _gate(gate: str, tensor: str, check, status: str | None = None,
          reason: str | None = None) -> GateResult:
    """A check's record as a gate result; a passing check that judged no element (an empty
    tensor, or a mask with nothing in it) concludes nothing: ``inconclusive``."""
    if status is None:
        status = PASS if check.ok else FAIL
        if status == PASS and getattr(check, "numel", None) == 0:
            status, reason = INCONCLUSIVE, "inconclusive: no element to judge"
    return GateResult(gate, tensor, status, asdict(check),
                      check.summary() if reason is None else reason)


def _judged(gate: str, tensor: str, check: Check) -> Pending:
    """The gate of one check's record."""
    return Pending((check,), lambda found: _gate(gate, tensor, found))


def _zeros(name: str, found: Sequence) -> GateResult:
    """Exact zeros in every run (``found``: each run's ``comparators.exact_zeros`` record);
    the first failing run is the one reported."""
    index = next((i for i, z in enumerate(found) if not z.ok), 0)
    z = found[index]
    numbers = {**asdict(z), "run": index + 1, "runs_checked": len(found)}
    if z.ok and z.n_masked == 0:   # a pack every slot of which some window reads
        return GateResult("zeros", name, INCONCLUSIVE, numbers,
                          "inconclusive: no never-consumed slot in this pack")
    reason = z.summary() if z.ok else f"run {index + 1}: {z.summary()}"
    return GateResult("zeros", name, PASS if z.ok else FAIL, numbers, reason)


def _not_nan(t: torch.Tensor) -> torch.Tensor:
    return ~torch.isnan(t)


def _g2(contract: Contract, case: Case, names: Sequence[str], masked: bool = False,
        claims: tuple[str, ...] = ()) -> list[Pending]:
    """The contract's rule per tensor vs fp32 eager; the scaled case scales the bounds. Then,
    per output in ``claims`` whose rule is not bitwise already, the implementation's own
    promise: bit for bit the fp32 reference (``out[claimed bitwise]``).

    ``masked``: judge the positions where eager is not NaN only."""
    out = []
    for name, rule in contract.g2:
        if name not in names:
            out.append(done(_na("G2", name)))
            continue

        def apply(x: Slice, rule=rule) -> Any:
            return rule.apply(x.fused, x.eager, scale=case.scale, window=case.coff * case.ratio,
                              mask=_not_nan(x.eager) if masked else None)

        out.append(_judged("G2", name, Check(name, apply, allowance=rule.allowance)))
        if name in claims and rule.check != "bitwise":
            out.append(_judged("G2", f"{name}[claimed bitwise]", Check(
                name, lambda x: comparators.bitwise(
                    x.fused, x.eager, mask=_not_nan(x.eager) if masked else None))))
    return out


def _g3(case: Case, names: Sequence[str], masked: bool = False) -> list[Pending]:
    """fp64-oracle parity against the contract's eager path; dAPE is gated on unit-scale cases
    only and recorded on scaled ones. ``masked``: where eager is finite only."""
    out = []
    for name in TENSORS:
        if name not in names:
            out.append(done(_na("G3", name)))
            continue
        check = Check(name, lambda x: comparators.oracle_parity(
            x.fused, x.eager, x.oracle, mask=torch.isfinite(x.eager) if masked else None))
        if name == "dape" and case.scale != 1.0:
            out.append(Pending((check,), lambda parity: _gate(
                "G3", "dape", parity, status=RECORDED,
                reason="recorded, not gated on a scaled case (atomic-order "
                       f"noise): {parity.summary()}")))
        else:
            out.append(_judged("G3", name, check))
    return out


def _finite_g2_g3(contract: Contract, case: Case, names: Sequence[str],
                  claims: tuple[str, ...] = ()) -> list[Pending]:
    """Some inputs non-finite: NaN masks equal eager's on all four outputs, G2 where eager is
    not NaN (an infinity, e.g. from a -inf kv a padding row reads, must be matched exactly)
    and G3 where eager is finite (docs/CONTRACT.md section 5.3)."""
    out = [_judged("G2", f"{name}[NaN mask]", Check(name, lambda x: comparators.nan_mask(
        x.fused, x.eager, require_full=False)))
           if name in names else done(_na("G2", f"{name}[NaN mask]")) for name in TENSORS]
    return (out + _g2(contract, case, names, masked=True, claims=claims)
            + _g3(case, names, masked=True))


def _isolation(fused, clean) -> list[GateResult]:
    """Non-finite values only the padding rows read reach no gradient: the fused gradients are
    finite and equal to the same pack's without them (dKV/dScore bitwise, as G1 makes them
    deterministic; dAPE, accumulated with atomics in another order, within G2's dAPE bound)."""
    out = [_gate("isolation", name, comparators.bitwise(fused[name], clean[name]))
           for name in GRADS]
    out.append(_gate("isolation", "dape", comparators.tolerance(
        fused["dape"], clean["dape"], bound=limits.DAPE_MAX_ABS, allowed=None)))
    return out


def _isolation_eager() -> Pending:
    """The reference keeps the padding-only values out too (else the case is not what it
    claims): its gradients are finite and bitwise those of the clean pack."""
    names = ("dkv", "dscore", "dape")
    checks = tuple(Check(name, lambda x: bool(torch.isfinite(x.eager).all())
                         and comparators.bitwise_equal(x.eager, x.clean), all)
                   for name in names)

    def finish(*found) -> GateResult:
        same = dict(zip(names, found))
        ok = all(same.values())
        return GateResult(
            "isolation", "eager", PASS if ok else FAIL, {"finite_and_equal": same},
            "the reference's gradients are finite and bitwise those of the clean pack" if ok
            else "the reference lets a padding-only value reach a gradient: the case is not "
                 "what it claims")

    return Pending(checks, finish)


def _overflow_g2_g3(names: Sequence[str]) -> list[Pending]:
    """G2 = NaN-mask equality with full eager masks; G3 skipped once the oracle is finite."""
    out = [_judged("G2", name, Check(name, lambda x: comparators.nan_mask(
        x.fused, x.eager, require_full=True))) if name in names else done(_na("G2", name))
           for name in TENSORS]
    for name in TENSORS:
        if name not in names:
            out.append(done(_na("G3", name)))
            continue
        checks = (Check(name, lambda x: bool(torch.isfinite(x.oracle).all()), all),)
        if name == "out":
            checks += (Check(name, lambda x: bool((x.oracle == 1.0).all()), all),)
        out.append(Pending(checks, lambda *found, name=name: _overflow_g3(name, *found)))
    return out


def _overflow_g3(name: str, finite: bool, is_one: bool | None = None) -> GateResult:
    numbers: dict[str, Any] = {"oracle_finite": finite}
    ok = finite
    if name == "out":
        numbers["oracle_out_is_one"] = is_one
        ok = ok and is_one
    if ok:
        return GateResult(
            "G3", name, SKIP, numbers,
            "skipped: fp32 score + ape overflows to +Inf, so eager and fused are NaN and "
            "parity is undefined; the fp64 oracle is finite" +
            (" (out == 1.0)" if name == "out" else ""))
    return GateResult("G3", name, FAIL, numbers,
                      "the fp64 oracle is not finite"
                      + (" or out != 1.0" if name == "out" else "")
                      + ": the overflow case is not what it claims")


# --- coverage ----------------------------------------------------------------------------


def _order(sel: Selection):
    return (sel.direction, sel.d, sel.coff, sel.tag)


def coverage(driver: Driver, contract: Contract, results: Sequence[CaseResult], *,
             status: str | None = None) -> CoverageResult:
    """Every kernel of every table entry selected by some case, and the bucket edges pinned.

    The expected set is read from the tables (``driver.entries``), not derived from the
    dispatcher's bucket constants; the edges are probed through the dispatcher
    (``driver.dispatch``) at the contract's declared values. ``status`` overrides the verdict
    (``not asserted`` for subset runs, ``untrusted`` when the drift check failed); the numbers
    are reported either way.
    """
    entries: dict[tuple[str, str, tuple[int, int]], Selection] = {}
    for direction in DIRECTIONS:
        found = driver.entries(contract.ratio, direction, contract.coverage_configs)
        for (bucket, coff, d), sel in found.items():
            entries[(direction, bucket, (coff, d))] = sel
    selected: dict[str, tuple[Selection, ...]] = {}
    for direction in DIRECTIONS:
        seen: list[Selection] = []
        for result in results:
            for sel in result.selections:
                if sel.direction == direction and sel not in seen:
                    seen.append(sel)
        selected[direction] = tuple(sorted(seen, key=_order))
    table = {d: cov_checks.table_coverage(d, {k: v for k, v in entries.items() if k[0] == d},
                                      selected[d]) for d in DIRECTIONS}
    expected = {d: tuple(sorted({v for k, v in entries.items() if k[0] == d}, key=_order))
                for d in DIRECTIONS}
    edges = None
    if contract.edges:
        probes = cov_checks.edge_probes(contract.edges, cov_checks.entry_configs(entries))
        dispatched = {(direction, config, n): driver.dispatch(contract.ratio, direction,
                                                               config[0], config[1], n)
                      for direction, config, n, _ in probes}
        edges = cov_checks.bucket_edges(contract.edges, entries, dispatched)
    if status is None:
        ok = all(t.ok for t in table.values()) and (edges is None or edges.ok)
        status = PASS if ok else FAIL
    return CoverageResult(status=status, expected=expected, selected=selected, table=table,
                          edges=edges)


# --- device housekeeping ----------------------------------------------------------------------


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


# A case whose own tensors (``gates.memory.tensor_bytes``) stay under this leaves its blocks to
# torch's caching allocator, where the next case reuses them: a full ``gc.collect`` costs 0.1 s
# with torch loaded, more than judging such a case on a GPU.
RELEASE_BYTES = 256 << 20


def _release(device, case: Case) -> None:
    """Free what a large case allocated before the next one (the largest is a few GB), and give
    it back to the device, whose free memory sizes the next cases (``gates.memory``).

    Tensors go with their last reference; ``gc.collect`` catches those a traceback kept.
    """
    if torch.device(device).type == "cuda" and tensor_bytes(case) >= RELEASE_BYTES:
        gc.collect()
        torch.cuda.empty_cache()
