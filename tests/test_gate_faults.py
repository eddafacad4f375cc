"""The gate can fail: one planted fault at a time, the real gate code must catch it.

Each test runs ``csagate.gates.runner.run_gate`` over a small CPU contract with a
reference-backed backend into which exactly one fault is planted in exactly one case, and
asserts the verdict is FAIL, that case's row failed at the right gate
(G1/G2/G3/zeros/isolation/coverage/bucket edges/drift), and every other case still ran and
passed (a failing case never hides the others).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from csagate.gates import limits
from csagate.gates.driver import Driver
from csagate.gates.runner import run_gate
from csagate.gates.verdict import ERROR, FAIL, NOT_ASSERTED, PASS, RECORDED, SKIP, Selection
from gate_backends import (
    SMALL_CASES,
    SMALL_CONTRACT,
    SMALL_HARDENING,
    SMALL_R4_CASES,
    SMALL_R4_CONTRACT,
    FaultyImpl,
    RefImpl,
    case_named,
    driven,
)

ALL = SMALL_CASES + SMALL_HARDENING
N, H = len(SMALL_CASES), len(SMALL_HARDENING)


def gate(impl, cases=None, contract=SMALL_CONTRACT):
    return run_gate(driven(impl), contract, cases=cases)


def faulted(fault: str, case: str | None = None, contract=SMALL_CONTRACT, **opts):
    return gate(FaultyImpl(fault, case, **opts), contract=contract)


def row(verdict, name):
    return next(r for r in verdict.cases if r.name == name)


def failed_gates(result) -> set[tuple[str, str]]:
    return {(g.gate, g.tensor) for g in result.failures}


def assert_only_case_failed(verdict, name, contract=SMALL_CONTRACT):
    """FAIL, the named row failed, and every other case ran to a PASS."""
    cases, hard = contract.cases, contract.hardening
    assert not verdict.ok
    upstream_failed = name in {c.name for c in cases}
    headline = f"GATE FAIL {len(cases) - upstream_failed}/{len(cases)}"
    if hard:
        headline += f" + {len(hard) - (not upstream_failed)}/{len(hard)} hardening"
    assert verdict.headline == headline
    assert verdict.drift.status == PASS
    assert [r.name for r in verdict.cases] == [c.name for c in contract.all_cases]
    for r in verdict.cases:
        if r.name == name:
            assert r.status in (FAIL, ERROR), r
        else:
            assert r.status == PASS, (r.name, r.reasons)
            assert r.gates, f"{r.name} did not run"
    assert verdict.coverage.status == PASS
    assert any(reason.startswith(f"{name}: ") for reason in verdict.reasons)


@pytest.fixture(scope="module")
def clean():
    return gate(RefImpl())


# --- the unfaulted backend passes ------------------------------------------------------------


def test_unfaulted_backend_passes(clean):
    assert clean.ok, clean.reasons
    assert clean.headline == f"GATE PASS {N}/{N} + {H}/{H} hardening"
    assert clean.reasons == ()
    assert clean.drift.status == PASS
    assert [g.tensor for g in clean.drift.gates] == ["dkv", "dscore", "dape", "fp64"]
    assert [r.name for r in clean.cases] == [c.name for c in ALL]
    assert all(r.status == PASS for r in clean.cases)
    assert clean.coverage.status == PASS
    assert clean.coverage.summary == "fwd 9/9, bwd 6/6, edges 36/36"
    table = clean.coverage.table
    assert (table["fwd"].n_entries, table["fwd"].n_expected) == (9, 9)
    assert (table["bwd"].n_entries, table["bwd"].n_expected) == (6, 6)
    edges = clean.coverage.edges
    assert edges.ok and edges.n_probes == 36 and edges.n_mismatch == 0
    assert edges.edges == ("fwd small <= 8", "fwd large >= 32", "bwd small <= 12")
    # the probes sit at edge-1, edge, edge+1
    assert sorted({p.n_rows for p in edges.probes}) == [7, 8, 9, 11, 12, 13, 31, 32, 33]


def test_every_case_runs_every_gate(clean):
    for r in clean.cases:
        assert {g.tensor for g in r.results("G1")} == {"out", "dkv", "dscore"}
        assert {"out", "dkv", "dscore", "dape"} <= {g.tensor for g in r.results("G2")}
        assert {g.tensor for g in r.results("G3")} == {"out", "dkv", "dscore", "dape"}
        assert {"dkv", "dscore"} <= {g.tensor for g in r.results("zeros")}
        assert {g.tensor for g in r.results("op")} == {"out", "dkv", "dscore", "dape"}
        assert r.schedules("fwd") and r.schedules("bwd")
        for key in ("bitwise_equal_to_eager", "err_fused", "err_eager", "dape_replay_delta"):
            assert key in r.recorded


def test_scaled_case_bounds_and_recorded_dape_parity(clean):
    r = row(clean, "c2d16/1x64/x64")
    assert r.result("G2", "out").numbers["bound"] == pytest.approx(limits.MAX_ABS * 64)
    assert r.result("G2", "dkv").numbers["bound"] == pytest.approx(limits.MAX_ABS * 64)
    assert r.result("G2", "dscore").numbers["bound"] == pytest.approx(limits.MAX_ABS * 4096)
    assert r.result("G2", "dape").numbers["bound"] == pytest.approx(limits.DAPE_MAX_ABS * 4096)
    numel = r.result("G2", "dkv").numbers["numel"]
    assert r.result("G2", "dkv").numbers["allowed"] == limits.count_allowance(numel)
    assert r.result("G3", "dape").status == RECORDED
    assert r.result("G3", "dkv").status == PASS
    # unit-scale cases gate dAPE parity
    assert row(clean, "c2d16/1x64").result("G3", "dape").status == PASS
    # recorded: the counts of the scaled case next to its unit-scale twin's
    assert r.recorded["unit_scale_twin"] == "c2d16/1x64"
    assert r.recorded["n_diff_same_as_twin"] is True


def test_overflow_case_rules(clean):
    r = row(clean, "c1d16/overflow")
    assert r.status == PASS
    for name in ("out", "dkv", "dscore"):
        g1 = r.result("G1", name)
        assert g1.status == PASS and g1.numbers["allow_nan"] and g1.numbers["nan_count"] > 0
    for name in ("out", "dkv", "dscore", "dape"):
        g2 = r.result("G2", name)
        assert g2.status == PASS and g2.numbers["eager_full"] and g2.numbers["n_mismatch"] == 0
        g3 = r.result("G3", name)
        assert g3.status == SKIP and g3.numbers["oracle_finite"]
        assert "parity is undefined" in g3.reason
    assert r.result("G3", "out").numbers["oracle_out_is_one"]


def test_padding_cases_feed_nonzero_pad_grad_out_and_check_token_rows(clean):
    for name in ("c1d32/ragged+pad3r5t", "c2d32/ragged+pad2r3t"):
        r = row(clean, name)
        assert r.recorded["pad_rows_grad_out_nonzero"] is True
        pad = r.result("zeros", "dkv[token pad]")
        assert pad.status == PASS and pad.numbers["n_masked"] > 0
        case = case_named(name)
        assert r.recorded["n_rows"] == case.rows and r.recorded["n_tokens"] == case.tokens


def test_the_backend_gets_nonzero_grad_out_on_padding_rows():
    backend = RefImpl()
    case = case_named("c1d32/ragged+pad3r5t")
    gate(backend, (case,))
    n_valid = case.rows - case.pad_rows
    fused_go = backend.grad_outs[-1]
    assert fused_go.shape[0] == case.rows
    assert bool((fused_go[n_valid:] != 0).all(dim=1).any())


def test_subset_run_does_not_assert_coverage():
    v = gate(RefImpl(), SMALL_CASES[:2])
    assert v.ok
    assert v.coverage.status == NOT_ASSERTED
    assert "subset run" in v.headline and "coverage not asserted" in v.headline
    assert v.headline.startswith("GATE PASS 2/2")


# --- planted faults ----------------------------------------------------------------------------


def test_off_by_one_step_beyond_the_count_fails_g2():
    name = "c1d16/1x256"
    case = case_named(name)
    allowed = limits.count_allowance(case.tokens * case.coff * case.d)
    v = faulted("count", name, n=allowed + 1)
    assert_only_case_failed(v, name)
    r = row(v, name)
    assert failed_gates(r) - {("G3", "dkv")} == {("G2", "dkv")}
    g2 = r.result("G2", "dkv").numbers
    assert g2["n_diff"] == allowed + 1 and g2["allowed"] == allowed
    assert g2["max_abs"] <= g2["bound"]          # the count is what failed
    assert g2["first_index"] == (0, 0)
    assert r.result("G1", "dkv").status == PASS


def test_off_by_one_step_at_the_count_passes():
    name = "c1d16/1x256"
    case = case_named(name)
    allowed = limits.count_allowance(case.tokens * case.coff * case.d)
    v = faulted("count", name, n=allowed)
    g2 = row(v, name).result("G2", "dkv")
    assert g2.status == PASS and g2.numbers["n_diff"] == allowed


def test_large_error_on_one_element_fails_g2():
    name = "c2d16/edge"
    v = faulted("large_error", name)
    assert_only_case_failed(v, name)
    r = row(v, name)
    g2 = r.result("G2", "out")
    assert g2.status == FAIL
    assert g2.numbers["n_diff"] == 1 and g2.numbers["max_abs"] > 0.4
    assert g2.numbers["first_index"] == (3, 5)
    assert "max_abs" in g2.reason and "[3, 5]" in g2.reason
    assert r.result("G3", "out").status == FAIL
    assert r.result("G1", "out").status == PASS


def test_unwritten_never_consumed_slot_fails_g1_and_zeros():
    name = "c1d16/ragged"
    v = faulted("unwritten", name)
    assert_only_case_failed(v, name)
    r = row(v, name)
    assert failed_gates(r) == {("G1", "dkv"), ("zeros", "dkv")}
    g1 = r.result("G1", "dkv").numbers
    assert g1["first_run"] == 2 and g1["n_diff"] == (1, 1)
    zeros = r.result("zeros", "dkv").numbers
    assert zeros["run"] == 2 and zeros["n_nonzero"] == 1
    assert r.result("G2", "dkv").status == PASS   # the zero-filled run 1 looks right


def test_nondeterministic_output_fails_g1():
    name = "c2d32/1x48"
    v = faulted("nondeterministic", name)
    assert_only_case_failed(v, name)
    r = row(v, name)
    assert failed_gates(r) == {("G1", "out")}
    g1 = r.result("G1", "out").numbers
    assert g1["first_run"] == 3 and g1["n_diff"] == (0, 1)
    assert len(set(g1["bits"])) == 2


def test_an_op_that_differs_from_the_direct_path_fails_op():
    """The torch op must add no numerics: one dScore step off through the op fails gate op."""
    name = "c2d32/1x48"
    v = faulted("op", name)
    assert_only_case_failed(v, name)
    r = row(v, name)
    assert failed_gates(r) == {("op", "dscore")}
    assert r.result("op", "dscore").numbers["n_diff"] == (1,)


def test_an_op_that_swaps_dkv_and_dscore_fails_op():
    """dKV and dScore have one shape: only comparing each op output with the direct path's
    buffer of the same name (never with itself) catches the swap."""
    name = "c2d32/1x48"
    v = faulted("op_swap", name)
    assert_only_case_failed(v, name)
    r = row(v, name)
    assert failed_gates(r) == {("op", "dkv"), ("op", "dscore")}
    assert r.result("op", "out").status == PASS and r.result("op", "dape").status == PASS


def test_an_op_that_returns_the_direct_paths_buffers_fails_op():
    """Tensors that alias the direct path's would be compared with themselves: the op gate
    refuses them (distinct storage), whatever their values."""
    name = "c1d16/edge"
    v = faulted("op_alias", name)
    assert_only_case_failed(v, name)
    r = row(v, name)
    assert failed_gates(r) == {("op", t) for t in ("out", "dkv", "dscore", "dape")}
    g = r.result("op", "dkv")
    assert g.numbers["aliases"] == ["the direct path's dkv"]
    assert "shares storage with the direct path's dkv" in g.reason


def test_wrong_nan_mask_on_overflow_fails_g2():
    name = "c1d16/overflow"
    v = faulted("nan_mask", name)
    assert_only_case_failed(v, name)
    r = row(v, name)
    assert failed_gates(r) == {("G2", "out")}
    g2 = r.result("G2", "out").numbers
    assert g2["n_mismatch"] == 1 and g2["first_index"] == (0, 0) and g2["eager_full"]


def test_padding_row_grad_out_not_ignored_fails_g2():
    name = "c1d32/ragged+pad3r5t"
    v = faulted("pad_grad_out", name)
    assert_only_case_failed(v, name)
    r = row(v, name)
    assert r.result("G2", "dkv").status == FAIL
    assert r.result("G2", "dscore").status == FAIL
    assert r.result("G1", "dkv").status == PASS


def test_token_padding_row_left_nonzero_fails_zeros():
    name = "c2d32/ragged+pad2r3t"
    v = faulted("token_pad_row", name)
    assert_only_case_failed(v, name)
    r = row(v, name)
    # only the exact-zero check sees a 2^-100 left in a token-padding row
    assert failed_gates(r) == {("zeros", "dkv"), ("zeros", "dkv[token pad]")}
    pad = r.result("zeros", "dkv[token pad]").numbers
    case = case_named(name)
    assert pad["n_nonzero"] == 1 and pad["first_index"] == (case.tokens - 1, 0)
    assert r.result("G2", "dkv").status == PASS


def test_a_never_consumed_slot_left_tiny_fails_zeros_alone():
    """2^-100 in a tail token's dKV: deterministic (G1 passes), far inside every tolerance
    (G2, G3 pass); only the exact-zero check over the never-consumed mask sees it."""
    name = "c1d16/ragged"
    v = faulted("tail_tiny", name)
    assert_only_case_failed(v, name)
    r = row(v, name)
    assert failed_gates(r) == {("zeros", "dkv")}
    assert r.result("zeros", "dkv").numbers["n_nonzero"] == 1


def test_dape_off_by_2e_3_fails_g2():
    name = "c1d16/edge"
    v = faulted("dape", name)
    assert_only_case_failed(v, name)
    r = row(v, name)
    g2 = r.result("G2", "dape")
    assert g2.status == FAIL and g2.numbers["max_abs"] == pytest.approx(2e-3, rel=1e-2)
    assert ("G2", "dape") in failed_gates(r)
    assert {g for g, _ in failed_gates(r)} <= {"G2", "G3"}


def test_table_entry_no_case_selects_fails_coverage():
    """An entry in the tables that the dispatcher cannot reach: no case selects it, and the
    declared large bucket of c2d32 now has an entry the dispatcher ignores at N >= 32."""
    v = faulted("coverage")
    assert not v.ok
    assert all(r.status == PASS for r in v.cases)
    assert v.headline == f"GATE FAIL {N}/{N} + {H}/{H} hardening"
    assert v.coverage.status == FAIL
    assert [s.name for s in v.coverage.missing("fwd")] == ["fwd c2d32 large"]
    assert v.coverage.missing("bwd") == ()
    assert v.coverage.table["fwd"].missing == ("fwd c2d32 large",)
    assert v.reasons[0] == "coverage (table entries): no case selects fwd c2d32 large"
    assert v.reasons[1].startswith("bucket edges: ")


def test_an_entry_no_case_reaches_fails_table_coverage_alone():
    """The dispatcher and the edges are right; the one case of the large bucket is gone."""
    cases = tuple(c for c in SMALL_CASES if c.name != "c1d16/1x256")
    v = gate(RefImpl(), contract=replace(SMALL_CONTRACT, cases=cases))
    assert not v.ok and v.full
    assert all(r.status == PASS for r in v.cases)
    assert v.coverage.status == FAIL and v.coverage.edges.ok
    assert v.reasons == ("coverage (table entries): no case selects fwd c1d16 large",)
    assert v.coverage.summary == "fwd 8/9, bwd 6/6, edges 36/36"


def test_moved_bucket_edge_fails_bucket_edges():
    """The large bucket tested with ``>`` where ``>= 32`` is declared. Its only case has
    N = 32, so it loses the large kernel too; the edge check names the moved edge."""
    v = faulted("moved_edge")
    assert not v.ok
    assert v.coverage.status == FAIL
    assert v.reasons[0] == "coverage (table entries): no case selects fwd c1d16 large"
    edges = v.coverage.edges
    assert not edges.ok and edges.n_mismatch == 1
    first = edges.first
    assert (first.direction, first.config, first.n_rows) == ("fwd", "c1d16", 32)
    assert (first.bucket, first.expected, first.selected) == \
        ("large", "fwd c1d16 large", "fwd c1d16 default")
    assert any(r.startswith("bucket edges: 1 of 36 probes off the declared edges, first fwd "
                            "c1d16 at N=32 (fwd large >= 32)") for r in v.reasons)


def test_a_raising_case_is_an_error_row_and_the_run_goes_on():
    name = "c1d16/edge"
    v = faulted("raises", name)
    assert_only_case_failed(v, name)
    r = row(v, name)
    assert r.status == ERROR
    # one line, as every csagate line shows an exception (gates/errors.one_line: an OOM keeps
    # its first sentence and the sizes)
    assert r.error == "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB."
    assert v.reasons[0] == f"{name}: raised {r.error}"


def test_reference_ignores_padding_row_grad_out():
    """The comparator side of the padding rule: padding rows' grad_out never matters."""
    from csagate.reference import backward, make_grad_out, make_pack

    for coff in (1, 2):
        pack = make_pack((23, 40, 9), ratio=8, coff=coff, d=16, pad_rows=3, pad_tokens=5)
        go = make_grad_out(pack.n_rows, 16, seed=11)
        n_valid = pack.n_valid_rows
        assert bool((go[n_valid:] != 0).any())
        zeroed = go.clone()
        zeroed[n_valid:] = 0
        a = backward(*pack.inputs(), go, ratio=8, coff=coff)
        b = backward(*pack.inputs(), zeroed, ratio=8, coff=coff)
        assert torch.equal(a.dkv, b.dkv) and torch.equal(a.dscore, b.dscore)
        assert torch.equal(a.dape, b.dape)


# --- the real backend's plumbing and the real contract's coverage (no GPU needed) ---------------


def kernel_backend_without_gpu(monkeypatch, arch: str = "sm_90a"):
    """The built-in ``csagate`` behind the gate's driver, its device's arch ``arch`` (no CUDA
    device is asked)."""
    from csagate.gates import builtin_impls

    monkeypatch.setattr(builtin_impls, "_arch", lambda: arch)
    return Driver(builtin_impls.Csagate(), torch.device("cpu"))


def _routed(backend, contract):
    """Every case of ``contract`` as a passing row with the kernels the dispatcher selects."""
    from csagate.gates.verdict import CaseResult

    return [CaseResult(case, PASS, selections=tuple(
        sel for direction in ("fwd", "bwd")
        if (sel := backend.dispatch(case.ratio, direction, case.coff, case.d, case.rows))))
        for case in contract.all_cases]


def _verdict(backend, contract, results):
    from csagate.gates.runner import coverage
    from csagate.gates.verdict import CaseResult, Verdict

    drift = CaseResult(contract.drift, PASS)
    return Verdict(drift=drift, cases=tuple(results), full=True, ratio=contract.ratio,
                   coverage=coverage(backend, contract, results))


@pytest.mark.parametrize("arch,summary,large_only", [
    ("sm_100a", "fwd 10/10, bwd 6/6, edges 36/36", {"c1d128", "c1d512", "c2d512"}),
    # on the H200 the c1d512 default and large buckets select one kernel: 9 forward kernels
    ("sm_90a", "fwd 9/9, bwd 6/6, edges 36/36", {"c1d128", "c2d512"}),
])
def test_the_21_cases_select_every_kernel_the_tables_can_select(monkeypatch, arch, summary,
                                                                large_only):
    """The contract's cases, routed through each arch's dispatcher, cover every kernel of
    every table entry, and the dispatcher's edges are the declared ones."""
    from csagate.gates.contracts import R128
    from csagate.gates.runner import coverage

    backend = kernel_backend_without_gpu(monkeypatch, arch)
    results = _routed(backend, R128)
    cov = coverage(backend, R128, results)
    assert cov.status == PASS, cov.reasons
    assert cov.summary == summary
    assert cov.table["fwd"].n_entries == 10 and cov.table["bwd"].n_entries == 6
    # dropping the large-bucket cases must name the kernels only they select
    without = [r for r in results if not r.name.endswith("1x131072")]
    missing = coverage(backend, R128, without).missing("fwd")
    assert {s.config for s in missing} == large_only


@pytest.mark.parametrize("how", ["constant", "operator"])
def test_a_moved_edge_in_the_real_dispatcher_fails_the_gate(monkeypatch, how):
    """The large bucket moved in kernels/schedule.py (a shifted constant, or ``>`` for ``>=``):
    coverage is read from the tables, the edges from the contract, so both see it."""
    from csagate.gates.contracts import R128
    from csagate.kernels import schedule as S

    if how == "constant":
        monkeypatch.setattr(S, "LARGE_NB_MIN", 1025)
    else:
        def fwd_bucket(coff, d, n_rows):
            if n_rows <= S.SMALL_NB_MAX and (coff, d) in S.FWD_SMALL:
                return "small"
            if n_rows > S.LARGE_NB_MIN and (coff, d) in S.FWD_LARGE:
                return "large"
            return "default"

        monkeypatch.setattr(S, "fwd_bucket", fwd_bucket)
    backend = kernel_backend_without_gpu(monkeypatch, "sm_90a")
    v = _verdict(backend, R128, _routed(backend, R128))
    assert not v.ok and v.coverage.status == FAIL
    edges = v.coverage.edges
    first = edges.first
    assert (first.direction, first.n_rows, first.bucket) == ("fwd", 1024, "large")
    assert first.edge == "fwd large >= 1024"
    # c1d128 and c2d512 (c1d512's default and large entries are one kernel on the H200)
    assert {p.config for p in edges.probes if not p.ok} == {"c1d128", "c2d512"}
    assert any(r.startswith("bucket edges: ") and "(fwd large >= 1024)" in r for r in v.reasons)
    # the 1x131072 cases (N = 1024) lose the large kernels: table coverage fails as well
    assert any(r.startswith("coverage (table entries): no case selects fwd c1d128")
               for r in v.reasons)


def test_a_table_entry_the_dispatcher_cannot_reach_fails_the_gate(monkeypatch):
    """An entry added to the H200 small table of a config whose dispatcher has no small bucket:
    enumerated from the tables, it is expected, and no case can reach it."""
    from csagate.gates.contracts import R128
    from csagate.kernels import schedule as S

    extra = S.FwdSchedule(2, 8, 32, fastexp=True)
    small = {**S.FWD_TABLES["sm_90a"]["small"], (1, 512): extra}
    monkeypatch.setitem(S.FWD_TABLES["sm_90a"], "small", small)
    backend = kernel_backend_without_gpu(monkeypatch, "sm_90a")
    v = _verdict(backend, R128, _routed(backend, R128))
    assert not v.ok
    assert v.coverage.table["fwd"].missing == (f"fwd c1d512 {extra.tag}",)
    assert v.reasons[0] == f"coverage (table entries): no case selects fwd c1d512 {extra.tag}"
    # and the declared small bucket of c1d512 now has an entry the dispatcher never selects
    assert v.coverage.edges.first.config == "c1d512"


def test_r4_coverage_is_over_the_ratio4_schedules_of_the_four_configs(monkeypatch):
    from csagate.gates.contracts import R4

    backend = kernel_backend_without_gpu(monkeypatch, "sm_90a")
    v = _verdict(backend, R4, _routed(backend, R4))
    assert v.coverage.status == PASS, v.reasons
    assert v.coverage.summary == "fwd 4/4, bwd 4/4" and v.coverage.edges is None
    from csagate.kernels.small_schedule import small_schedule

    assert {s.tag for s in v.coverage.expected["bwd"]} == {
        small_schedule("bwd", d, ratio=4, coff=c, arch="sm_90a").tag
        for c in (1, 2) for d in (128, 512)}
    no_512 = [r for r in _routed(backend, R4) if r.case.d != 512]
    assert {s.config for s in _verdict(backend, R4, no_512).coverage.missing("fwd")} == \
        {"c1d512", "c2d512"}


def test_kernel_backend_reports_the_launched_kernel(monkeypatch):
    from csagate.kernels import api
    from csagate.kernels.registry import make_key
    from csagate.kernels.schedule import select_bwd, select_fwd

    backend = kernel_backend_without_gpu(monkeypatch)
    seen = {}

    def run_forward(kv, score, ape, cu, cuc, out, *, ratio, coff, stream=None, check=False):
        seen["fwd"] = (ratio, coff, tuple(out.shape))
        seen["fwd_check"] = check
        return make_key("fwd", ratio, coff, out.shape[1],
                        select_fwd(coff, out.shape[1], out.shape[0], "sm_90a"), "sm_90a")

    def run_backward(kv, score, ape, cu, cuc, go, dkv, dscore, dape, *, ratio, coff,
                     rows_per_cta=None, stream=None, deterministic=None, check=False):
        seen["bwd_deterministic"] = deterministic
        seen["bwd_check"] = check
        sched = select_bwd(coff, go.shape[1], go.shape[0], "sm_90a")
        return make_key("bwd", ratio, coff, go.shape[1], sched, "sm_90a",
                        deterministic=bool(deterministic))

    monkeypatch.setattr(api, "run_forward", run_forward)
    monkeypatch.setattr(api, "run_backward", run_backward)
    out = torch.empty(1024, 128, dtype=torch.bfloat16)
    sel = backend.forward(None, None, None, None, None, out, ratio=128, coff=1)
    assert seen["fwd"] == (128, 1, (1024, 128))
    assert seen["fwd_check"] is True  # the gate has the cu/cuc values checked
    entries = set(backend.entries(128, "fwd").values())
    assert sel in entries and sel.tag == select_fwd(1, 128, 1024, "sm_90a").tag
    assert sel == backend.dispatch(128, "fwd", 1, 128, 1024)
    go = torch.empty(64, 128, dtype=torch.bfloat16)
    bsel = backend.backward(None, None, None, None, None, go, None, None, None, ratio=128,
                            coff=2)
    assert bsel in set(backend.entries(128, "bwd").values())
    assert bsel.name == f"bwd c2d128 {select_bwd(2, 128, 64, 'sm_90a').tag}"
    assert seen["bwd_deterministic"] is False   # the default mode, whatever torch's flag
    assert seen["bwd_check"] is True
    det = backend.backward(None, None, None, None, None, go, None, None, None, ratio=128,
                           coff=2, deterministic=True)
    assert seen["bwd_deterministic"] is True and det == bsel   # coverage: the table entry


def test_kernel_backend_build_failure_is_a_build_error(monkeypatch):
    from csagate.gates.errors import BuildError
    from csagate.kernels import api

    backend = kernel_backend_without_gpu(monkeypatch)

    def broken(ratio, **kw):
        raise RuntimeError("ptxas fatal: Unresolved extern function\nmore")

    monkeypatch.setattr(api, "build", broken)
    monkeypatch.setattr(torch.cuda, "device", lambda device: _Null())
    with pytest.raises(BuildError, match=r"building ratio=128 c1d512 for sm_90a failed: "
                                         r"RuntimeError: ptxas fatal: Unresolved extern"):
        backend.build([(128, 1, 512)])


def test_kernel_backend_build_counts_kernels(monkeypatch):
    from csagate.kernels import api
    from csagate.kernels.cache import BuildRecord
    from csagate.kernels.registry import keys_for

    backend = kernel_backend_without_gpu(monkeypatch)

    def fake_build(ratio, *, arch, coff, d, progress=None, **kw):
        keys = keys_for(ratio, arch, coff=coff, d=d)
        records = [BuildRecord(k, 0.0, i % 2 == 0) for i, k in enumerate(keys)]
        for i, r in enumerate(records, start=1):
            progress(r, i, len(records))
        return records

    monkeypatch.setattr(api, "build", fake_build)
    monkeypatch.setattr(torch.cuda, "device", lambda device: _Null())
    ticks = []
    records = backend.build([(4, 2, 128), (128, 1, 128), (128, 2, 512)],
                            progress=lambda *a: ticks.append(a))
    total = 2 + 5 + 4   # r4 fwd+bwd; c1d128: 3 fwd + 2 bwd; c2d512: 3 fwd + 1 bwd
    assert len(records) == total
    assert ticks[0] == (0, total, "ratio=4 c2d128 for sm_90a")
    assert ticks[-1] == (total, total, "built")
    done = [t[0] for t in ticks]
    assert done == sorted(done)
    assert any(t[2].endswith("(cached)") for t in ticks)


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# --- hardening cases (CONTRACT.md 5.3) -----------------------------------------------------------


@pytest.mark.parametrize("name", ["c2d16/ragged/partial-overflow",
                                  "c1d32/ragged/partial-overflow"])
def test_partial_overflow_rules(clean, name):
    r = row(clean, name)
    assert r.status == PASS and r.case.kind == "hardening"
    assert r.recorded["eager_nan"]["out"] == 3      # three windows, one column each
    assert len(r.recorded["nonfinite_slots"]) == 4
    for tensor in ("out", "dkv", "dscore", "dape"):
        mask = r.result("G2", f"{tensor}[NaN mask]").numbers
        assert mask["n_mismatch"] == 0 and not mask["require_full"]
        assert mask["eager_nan"] == r.recorded["eager_nan"][tensor] > 0
        g2 = r.result("G2", tensor).numbers        # judged on eager's finite positions only
        assert g2["numel"] + mask["eager_nan"] == mask["numel"]
        assert r.result("G3", tensor).status == PASS
    for tensor in ("out", "dkv", "dscore"):
        g1 = r.result("G1", tensor).numbers
        assert g1["allow_nan"] and g1["nan_count"] == 3 * r.recorded["eager_nan"][tensor]


def test_padding_only_nonfinite_rules(clean):
    r = row(clean, "c2d16/edge+pad3r5t/pad-nonfinite")
    assert r.status == PASS
    assert r.recorded["eager_nan"] == {"out": 9, "dkv": 0, "dscore": 0, "dape": 0}
    assert r.result("G2", "out[NaN mask]").numbers["fused_nan"] == 9
    # the -inf kv a padding row reads makes -inf outputs: G2 judges them (equal, not NaN)
    g2 = r.result("G2", "out").numbers
    assert g2["numel"] == r.recorded["n_rows"] * 16 - 9 and g2["n_diff"] == 0
    assert r.result("G3", "out").status == PASS
    for tensor in ("dkv", "dscore"):
        assert not r.result("G1", tensor).numbers["allow_nan"]
        iso = r.result("isolation", tensor).numbers
        assert iso["n_diff"] == 0 and iso["numel"] > 0 and iso["first_index"] is None
    assert r.result("isolation", "dape").numbers["bound"] == limits.DAPE_MAX_ABS
    assert r.result("isolation", "eager").status == PASS
    assert r.recorded["pad_rows_grad_out_nonzero"] is True


@pytest.mark.parametrize("name", ["c2d16/ragged/partial-overflow",
                                  "c1d32/ragged/partial-overflow"])
def test_a_merge_that_drops_a_nan_chunk_fails_the_nan_mask(name):
    """The issue's first hole: a late chunk's NaN partial dropped from the merge."""
    v = faulted("drop_nan_chunk", name)
    assert_only_case_failed(v, name)
    r = row(v, name)
    assert failed_gates(r) == {("G2", "out[NaN mask]")}
    mask = r.result("G2", "out[NaN mask]").numbers
    assert mask["n_mismatch"] == 3 and mask["fused_nan"] == 0 and mask["eager_nan"] == 3
    assert "NaN masks differ at 3" in r.result("G2", "out[NaN mask]").reason


def test_the_same_fault_passes_every_finite_case():
    """Without the hardening cases nothing would see it: every other case has finite inputs."""
    v = gate(FaultyImpl("drop_nan_chunk", "c2d16/ragged/partial-overflow"),
             cases=SMALL_CASES)
    assert all(r.status == PASS for r in v.cases)


def test_padding_rows_multiplied_by_zero_fail_the_padding_only_nonfinite_case():
    """The issue's third hole: 0 * inf = NaN from a value only a padding row reads."""
    name = "c2d16/edge+pad3r5t/pad-nonfinite"
    v = faulted("pad_leak", name)
    assert_only_case_failed(v, name)
    r = row(v, name)
    failed = failed_gates(r)
    assert {("G1", "dkv"), ("G1", "dscore"), ("isolation", "dkv"), ("isolation", "dscore"),
            ("isolation", "dape"), ("G2", "dape[NaN mask]")} <= failed
    assert r.result("isolation", "eager").status == PASS    # the reference excludes them
    assert r.result("G1", "dkv").numbers["nan_count"] > 0
    # ... and a finite padding case cannot tell the two rules apart
    ok = faulted("pad_leak", "c1d32/ragged+pad3r5t")
    assert row(ok, "c1d32/ragged+pad3r5t").status == PASS


# --- the ratio=4 contract ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def clean_r4():
    return gate(RefImpl(), contract=SMALL_R4_CONTRACT)


def r4_faulted(fault, name, **opts):
    return faulted(fault, name, contract=SMALL_R4_CONTRACT, **opts)


def test_r4_unfaulted_passes_with_its_own_rules(clean_r4):
    v = clean_r4
    assert v.ok, v.reasons
    assert v.headline == f"GATE PASS {len(SMALL_R4_CASES)}/{len(SMALL_R4_CASES)}"
    assert v.ratio == 4 and v.hardening_total == 0
    assert v.coverage.summary == "fwd 4/4, bwd 4/4" and v.coverage.edges is None
    r = row(v, "r4/c1d16/ragged")
    for tensor in ("dkv", "dscore"):   # bit patterns
        g2 = r.result("G2", tensor).numbers
        assert (g2["n_diff"], g2["n_zero_sign"]) == (0, 0) and g2["numel"] > 0
    out = r.result("G2", "out").numbers   # one bf16 step at the window's calibrated rate
    assert out["allowed"] == limits.count_allowance(out["numel"], limits.R4_FWD_FRACTION)
    assert out["noise_atol"] == 8e-6 and out["n_beyond"] == 0
    assert r.result("G2", "dape").numbers["bound"] == limits.DAPE_MAX_ABS
    assert "parity_ref" not in r.recorded      # G3 against the fp32 reference, every family
    over = row(v, "r4/c1d16/overflow")
    assert over.result("G3", "out").status == SKIP
    partial = row(v, "r4/c2d16/ragged/partial-overflow")
    assert partial.result("G2", "out[NaN mask]").numbers["eager_nan"] == 3


def test_r4_one_ulp_dkv_change_fails_bitwise():
    name = "r4/c1d16/ragged"
    v = r4_faulted("count", name, n=1)
    assert_only_case_failed(v, name, SMALL_R4_CONTRACT)
    r = row(v, name)
    assert ("G2", "dkv") in failed_gates(r) and failed_gates(r) <= {("G2", "dkv"), ("G3", "dkv")}
    assert "1 of 1152 elements differ in their bits" in r.result("G2", "dkv").reason


def test_r4_forward_count_and_step_boundaries():
    name = "r4/c1d32/1x64"
    case = case_named(name)
    allowed = limits.count_allowance(case.rows * case.d, limits.R4_FWD_FRACTION)
    at = r4_faulted("count_out", name, n=allowed)
    assert row(at, name).result("G2", "out").status == PASS
    over = r4_faulted("count_out", name, n=allowed + 1)
    assert_only_case_failed(over, name, SMALL_R4_CONTRACT)
    assert failed_gates(row(over, name)) - {("G3", "out")} == {("G2", "out")}
    two = r4_faulted("count_out", name, n=1, steps=2)
    g2 = row(two, name).result("G2", "out")
    assert g2.status == FAIL and g2.numbers["max_steps"] == 2 and g2.numbers["n_beyond"] == 1
    assert "more than one bf16 step off" in g2.reason


def test_r4_dropped_nan_chunk_and_padding_grad_out_fail():
    name = "r4/c2d16/ragged/partial-overflow"
    v = r4_faulted("drop_nan_chunk", name)
    assert_only_case_failed(v, name, SMALL_R4_CONTRACT)
    assert failed_gates(row(v, name)) == {("G2", "out[NaN mask]")}
    pad = "r4/c2d16/ragged+pad3r5t"
    p = r4_faulted("pad_grad_out", pad)
    assert_only_case_failed(p, pad, SMALL_R4_CONTRACT)
    assert {("G2", "dkv"), ("G2", "dscore")} <= failed_gates(row(p, pad))


def test_r4_coverage_names_a_config_no_case_has():
    contract = replace(SMALL_R4_CONTRACT, coverage_configs=SMALL_R4_CONTRACT.coverage_configs
                       + ((1, 64),))
    v = gate(RefImpl(), contract=contract)
    assert not v.ok and all(r.status == PASS for r in v.cases)
    assert v.reasons == ("coverage (table entries): no case selects fwd c1d64 r4",
                         "coverage (table entries): no case selects bwd c1d64 r4")


def test_a_case_beyond_the_contracts_configs_does_not_fail_coverage():
    """A case at a head dim outside the four table configs (an odd d) selects kernels no table
    entry expects: reported as beyond the configs, neither missing nor unexpected."""
    from gate_backends import R4_RAGGED, _r4

    extra = _r4("c1d24/ragged", 1, 24, R4_RAGGED)
    contract = replace(SMALL_R4_CONTRACT, cases=SMALL_R4_CONTRACT.cases + (extra,))
    v = gate(RefImpl(), contract=contract)
    assert v.ok, v.reasons
    assert v.coverage.status == PASS and v.coverage.summary == "fwd 4/4, bwd 4/4"
    assert [s.name for s in v.coverage.beyond("fwd")] == ["fwd c1d24 r4"]
    assert v.coverage.unexpected("fwd") == () and v.coverage.table["fwd"].beyond == (
        "fwd c1d24 r4",)
    # a kernel of a table config that no table entry holds is still unexpected
    from csagate.gates import coverage as cov_checks

    entries = {("fwd", "any", (1, 16)): Selection("fwd", 1, 16, "r4")}
    stray = cov_checks.table_coverage("fwd", entries, [Selection("fwd", 1, 16, "r4"),
                                                       Selection("fwd", 1, 16, "other"),
                                                       Selection("fwd", 1, 24, "r4")])
    assert not stray.ok and stray.unexpected == ("fwd c1d16 other",)
    assert stray.beyond == ("fwd c1d24 r4",)


# --- the deterministic backward (CONTRACT.md 2.5) -------------------------------------------


def test_deterministic_cases_run_with_deterministic_true_and_pass():
    from gate_backends import SMALL_DET_CONTRACT, SMALL_DETERMINISTIC

    backend = RefImpl()
    v = gate(backend, contract=SMALL_DET_CONTRACT)
    assert v.ok, v.reasons
    assert backend.deterministic_calls == 3 * len(SMALL_DETERMINISTIC)
    assert v.headline.endswith(f" + {len(SMALL_DETERMINISTIC)}/{len(SMALL_DETERMINISTIC)} "
                               "deterministic")
    for case in SMALL_DETERMINISTIC:
        assert row(v, case.name).result("G1", "dape").status == PASS
    # the default-mode cases do not gate dAPE bitwise (atomics)
    assert all(g.tensor != "dape" for g in row(v, SMALL_CASES[0].name).gates if g.gate == "G1")


def test_deterministic_backend_whose_dape_moves_fails_g1():
    from gate_backends import SMALL_DET_CONTRACT

    name = "c1d16/edge/deterministic"
    v = faulted("nondeterministic_dape", name, contract=SMALL_DET_CONTRACT)
    assert not v.ok
    r = row(v, name)
    assert failed_gates(r) == {("G1", "dape")}
    assert all(x.ok for x in v.cases if x.name != name)
