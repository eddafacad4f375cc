"""CPU build checks of the small-ratio kernels (no GPU): every small ratio, both table arches,
ptxas-clean, pinned PTX.

Each (kernel, ratio, arch, coff, d) is cross-compiled once, assembled with the external
``ptxas -v`` (0 spill, 0 stack) and its PTX is checked for the facts the bitwise contract
rests on: the accurate exp (one ``fma.rm`` range reduction per ``ex2.approx.ftz``), the exact
count of pinned ``mul.rn``/``add.rn``/``fma.rn``/``div.rn`` and of the shared-reciprocal
division's ``rcp.approx`` and guard (an extra ``fma.rn`` would be a contracted ``a*b+c``),
vector accesses for even d (up to the vec-2 window limit), one dAPE atomic per window
position. The counts are per window position, so they hold at every ratio.
"""

from __future__ import annotations

import dataclasses
import functools
import re

import pytest
from csagate.kernels import small_schedule as SS
from csagate.kernels._dsl import dsl_available
from csagate.kernels.registry import SMALL_RATIOS
from csagate.kernels.schedule import TABLE_ARCHES as ARCHES  # sm_103a: test_cache_probe

_DSL_OK, _DSL_WHY = dsl_available()
pytestmark = pytest.mark.skipif(not _DSL_OK, reason=_DSL_WHY or "cutlass DSL unavailable")

COFFS = (1, 2)
HEAD_DIMS = (128, 65, 512)  # even d (vec=2), odd d (vec=1), the large production d
KERNELS = [(kind, ratio, arch, coff, d) for ratio in SMALL_RATIOS for kind in ("fwd", "bwd")
           for arch in ARCHES for coff, d in SS.build_configs(ratio)]
EXP_CONSTANTS = ("0f3BBB989D", "0f3FB8AA3B", "0f32A57060")  # the accurate exp's fma.rn


def _kid(k) -> str:
    kind, ratio, arch, coff, d = k
    return f"r{ratio}{kind}-{arch}-c{coff}d{d}"


@functools.cache
def _ptx(kind: str, ratio: int, arch: str, coff: int, d: int) -> str:
    """Compiled through the test run's cache (the table probe of test_cache_probe reuses it)."""
    from csagate.kernels import registry
    from csagate.kernels.cache import CACHE

    sched = registry.family(ratio, kind).select(coff, d, 1, arch)
    ptx = CACHE.ptx(registry.make_key(kind, ratio, coff, d, sched, arch))
    assert ptx, (f"r{ratio}{kind} c{coff}d{d} {arch}: no PTX retained (CUTE_DSL_KEEP must "
                 "include ptx)")
    return ptx


def _main_ptx(kind: str, ratio: int, arch: str, coff: int, d: int) -> str:
    """The compute kernel's own PTX (the backward's module also holds the dAPE zeroing
    kernel, launched first when api.backward wants a fresh dAPE)."""
    from csagate.perf.probe import main_entry

    return main_entry(_ptx(kind, ratio, arch, coff, d))


def _count(pattern: str, text: str) -> int:
    return len(re.findall(pattern, text))


def _pinned_counts(ptx: str) -> dict[str, int]:
    """The pinned fp32 operations of a kernel's PTX (the accurate exp's own fma.rn apart)."""
    fma_rn = [ln for ln in ptx.splitlines() if "fma.rn.f32" in ln]
    return {
        "ex2.approx.ftz.f32": _count(r"ex2\.approx\.ftz\.f32", ptx),
        "fma.rm.f32 (accurate exp)": _count(r"fma\.rm\.f32", ptx),
        "div.rn.f32": _count(r"div\.rn\.f32", ptx),
        "rcp.approx.ftz.f32": _count(r"rcp\.approx\.ftz\.f32", ptx),
        "min.NaN.f32": _count(r"min\.NaN\.f32", ptx),
        "mul.rn.f32": _count(r"mul\.rn\.f32", ptx),
        "add.rn.f32": _count(r"add\.rn\.f32", ptx),
        "fma.rn.f32 outside exp": len([ln for ln in fma_rn
                                       if not any(c in ln for c in EXP_CONSTANTS)]),
    }


def _pinned_expected(kind: str, n_exp: int, columns: int, seeded: bool = True
                     ) -> dict[str, int]:
    """What ``_pinned_counts`` must find for ``n_exp`` (window position, column) elements in
    ``columns`` columns. p = e / den: an IEEE division per element (the path of a window with
    an e_k below DIV_FAST_MIN) and, ``seeded``, the shared-reciprocal path: per column one
    rcp.approx and two fma.rn refining it, per element a NaN-propagating min (the guard) and
    three fma.rn (an ``ieee_div`` form has the divisions alone)."""
    if not seeded:
        return {**_pinned_expected(kind, n_exp, 0), "min.NaN.f32": 0,
                "fma.rn.f32 outside exp": 0 if kind == "fwd" else n_exp}
    return {
        "ex2.approx.ftz.f32": n_exp,
        "fma.rm.f32 (accurate exp)": n_exp,
        "div.rn.f32": n_exp,
        "rcp.approx.ftz.f32": columns,
        "min.NaN.f32": n_exp,
        # fwd: u*p; bwd: go*u, dp*p, go*p
        "mul.rn.f32": n_exp if kind == "fwd" else 3 * n_exp,
        "add.rn.f32": 3 * n_exp,  # score+ape, den, (acc | S); see _den_copies
        # the shared-reciprocal division; bwd also fma(p, -S, t)
        "fma.rn.f32 outside exp": 2 * columns + 3 * n_exp + (0 if kind == "fwd" else n_exp),
    }


def _den_copies(found: dict, expected: dict, n_exp: int, label: str) -> None:
    """LLVM may compute a column's den inside each division path instead of before the branch
    (one more add.rn per element at most, every copy pinned): ``found`` is brought back to one
    den per element when its excess is within that."""
    extra = found["add.rn.f32"] - expected["add.rn.f32"]
    assert 0 <= extra <= n_exp, f"{label}: {found['add.rn.f32']} add.rn, expected " \
        f"{expected['add.rn.f32']} (+ at most {n_exp} den adds in the division paths)"
    found["add.rn.f32"] -= extra


def _assert_ptxas_clean(ptx: str, label: str, kind: str, arch: str, ptxas: str) -> dict:
    """ptxas -v on the module of a ``kind`` (fwd, bwd, bwd_det) kernel: its entries all at 0
    spill and 0 stack; returns {entry: (regs, spill st, spill ld, stack)}."""
    from csagate.perf.probe import ZERO_KERNEL, assemble, ptxas_entries

    rc, log = assemble(ptx, arch, ptxas)
    assert rc == 0, f"ptxas failed on {label}:\n{log}"

    entries = ptxas_entries(log)
    zeroing = [name for name in entries if ZERO_KERNEL in name]
    # the backward's module: the kernel and the dAPE zeroing kernel; the forward's and the
    # deterministic backward's ("bwd_det"): one
    assert len(entries) == (2 if kind == "bwd" else 1) and len(zeroing) == len(entries) - 1, (
        f"unexpected entries {list(entries)}:\n{log}")
    for name, (regs, spill_st, spill_ld, stack) in entries.items():
        assert None not in (regs, spill_st, spill_ld, stack), f"unparsed ptxas -v output:\n{log}"
        assert (stack, spill_st, spill_ld) == (0, 0, 0), (
            f"{label} {name}: {regs} registers, stack {stack} B, spill stores "
            f"{spill_st} B, spill loads {spill_ld} B (must all be 0)")
    return entries


@pytest.mark.parametrize("kernel", KERNELS, ids=_kid)
def test_ptxas_clean(kernel, ptxas):
    _assert_ptxas_clean(_ptx(*kernel), _kid(kernel), kernel[0], kernel[2], ptxas)


FWD_STORE = {1: r"st\.global\.b16", 2: r"st\.global\.b32", 4: r"st\.global\.v2\.b32"}


def _check_fwd_ptx(ptx: str, label: str, win: int, sched) -> None:
    """A forward's PTX: per row, one exact exp per (window position, column), score and kv
    one vec-wide load each per window position, one vec-wide out store."""
    vec, rows = sched.vec, sched.rows_per_cta
    found = _pinned_counts(ptx)
    expected = _pinned_expected("fwd", win * vec, vec, not sched.ieee_div)
    _den_copies(found, {k: rows * v for k, v in expected.items()}, rows * win * vec, label)
    assert found == {k: rows * v for k, v in expected.items()}, (
        f"{label}: PTX op counts {found} != {rows} x {expected}")
    if vec > 1:
        n_vec_ld = _count(rf"ld\.global\.v{vec}\.b16", ptx)
        assert n_vec_ld == 2 * win * rows, f"{label}: {n_vec_ld} ld.global.v{vec}.b16"
    assert _count(FWD_STORE[vec], ptx) == rows, f"{label}: expected {rows} out store(s)"


@pytest.mark.parametrize("kernel", KERNELS, ids=_kid)
def test_ptx_pins_numerics(kernel):
    kind, ratio, arch, coff, d = kernel
    ptx = _main_ptx(*kernel)
    win = coff * ratio
    sched = SS.small_schedule(kind, d, ratio=ratio, coff=coff, arch=arch)
    label = _kid(kernel)
    assert _count(r"\b(?:ld|st)\.local\b", ptx) == 0, f"{label}: local memory used"
    assert _count(r"div\.(?:approx|full)\.f32", ptx) == 0, f"{label}: inexact div"
    block = f"{sched.threads}, {sched.lanes}, 1"
    assert f".reqntid {block}" in ptx, f"{label}: block is not ({block})"
    if kind == "fwd":
        _check_fwd_ptx(ptx, label, win, sched)
    else:
        _check_bwd_ptx(ptx, label, win, sched)


def _check_bwd_ptx(ptx: str, label: str, win: int, sched) -> None:
    """A backward's PTX: the pinned operations of one row body per (window position, column)
    (LLVM may duplicate the body, every copy whole) plus, with lanes, one add.rn per dAPE sum
    and extra lane; score and kv one vec-wide load per window position and grad_out one per row
    body (a prefetch form loads a row in two places: before its loop and for the next row
    inside it; a staged form copies them by ``cp.async`` in ``stages`` places: the stages - 1
    rows before its loop and the one ahead inside it, loads none into registers and reads
    each back by one vec-wide shared load); one dAPE reduction (vec wide) per window
    position."""
    vec, lanes = sched.vec, sched.lanes
    n = win * vec
    found, expected = _pinned_counts(ptx), _pinned_expected("bwd", n, vec, not sched.ieee_div)
    found["add.rn.f32"] -= (lanes - 1) * n  # the lanes' dAPE sums merged, once per CTA
    # The compiler may duplicate the backward's row body (LLVM does at ratio 2, c1d128 on
    # sm_100a: two copies of the same instructions); every copy holds the whole pinned set.
    copies = found["div.rn.f32"] // n
    _den_copies(found, {k: copies * v for k, v in expected.items()}, copies * n, label)
    assert copies >= 1 and found == {k: copies * v for k, v in expected.items()}, (
        f"{label}: PTX op counts {found} != {copies} x {expected}")
    load = r"ld\.global\.b16" if vec == 1 else rf"ld\.global\.v{vec}\.b16"
    fetches = copies * (2 if sched.prefetch else 1)
    staged = _count(rf"cp\.async\.ca\.shared\.global \[[^]]+\], \[[^]]+\], {2 * vec};", ptx)
    if sched.stages:
        assert staged == sched.stages * (2 * win + 1) and _count(load, ptx) == 0, (
            f"{label}: {staged} cp.async copies, {_count(load, ptx)} register loads")
        # read back by one vec-wide shared load a position (grad_out's may compile to one
        # scalar load of the same width), never a bf16 at a time: the buffers' vec columns are
        # contiguous, so a warp's loads are conflict-free
        back = _count(rf"ld\.shared\.v{vec}\.b16", ptx)
        assert copies * 2 * win <= back <= copies * (2 * win + 1), f"{label}: {back} loads"
        assert _count(r"ld\.shared\.b16", ptx) == 0, f"{label}: bf16 shared loads one by one"
    else:
        assert _count(load, ptx) == fetches * (2 * win + 1) and staged == 0, label
    scalar = _count(r"(?:red|atom)\.[a-z.]*add\.f32", ptx)
    vector = _count(rf"red\.[a-z.]*add\.v{vec}\.f32", ptx) if vec > 1 else 0
    assert scalar + vector == win and (vec == 1 or scalar == 0), (
        f"{label}: {scalar} scalar and {vector} v{vec} fp32 reductions, expected {win} "
        f"{'scalar' if vec == 1 else f'v{vec}'}")


def _case_configs() -> list[tuple[int, int, int]]:
    """(ratio, coff, d) of the small-ratio gate cases beyond the build configs (head dims that
    are not a multiple of 32: gates/cases.py)."""
    from csagate.gates.contracts import CONTRACTS

    built = {(r, c, d) for r in SMALL_RATIOS for c, d in SS.build_configs(r)}
    found = {(case.ratio, case.coff, case.d) for ratio, k in CONTRACTS.items()
             if ratio in SMALL_RATIOS for case in k.all_cases}
    return sorted(found - built)


CASE_KERNELS = [(kind, ratio, arch, coff, d) for ratio, coff, d in _case_configs()
                for kind in ("fwd", "bwd") for arch in ARCHES]


@pytest.mark.parametrize("kernel", CASE_KERNELS, ids=_kid)
def test_gate_case_configs_build_ptxas_clean_and_pinned(kernel, ptxas):
    """The kernels of the gate's extra head dims (d = 40, 72: narrow CTAs, a partial last
    column group) cross-compile, assemble at 0 spill and 0 stack, and pin their numerics as the
    build configs do; without this a gate run could only say "could not evaluate" for them."""
    _assert_ptxas_clean(_ptx(*kernel), _kid(kernel), kernel[0], kernel[2], ptxas)
    test_ptx_pins_numerics(kernel)


def test_gate_case_configs_are_listed():
    assert {(r, c, d) for _, r, _, c, d in CASE_KERNELS} >= {(4, 2, 40), (32, 2, 40),
                                                             (32, 2, 72)}


@pytest.mark.parametrize("window", [2, 8, 32, 64])
@pytest.mark.parametrize("d", [1, 2, 3, 65, 127, 128, 129, 512, 8_388_479, 8_388_480])
def test_fwd_schedule(d, window):

    vec, threads = SS.fwd_schedule(d, window)
    assert vec == (2 if d % 2 == 0 and window <= SS.FWD_VEC2_MAX_WINDOW else 1)
    groups = d // vec
    assert threads == (64 if groups >= 64 else groups) or threads == 128
    grid_y = -(-groups // threads)
    assert grid_y == SS.fwd_grid_y(d, window) and 1 <= grid_y <= 65535, (d, vec, threads,
                                                                        grid_y)
    if threads == 128:  # only when 64 threads would exceed the gridDim.y limit
        assert -(-groups // 64) > 65535


@pytest.mark.parametrize("arch", ARCHES)
def test_backward_waits_for_its_pdl_predecessor(arch):
    """The backward launches as a programmatic dependent (PDL) of the kernel before it: it
    waits (griddepcontrol.wait) before its first load unless its own launch zeroed dAPE
    first, and always before its first dAPE atomic; the zeroing kernel (a dependent of the
    kernel before it) waits for that one, then releases the backward."""
    ptx = _ptx("bwd", 4, arch, 2, 128)
    main = _main_ptx("bwd", 4, arch, 2, 128)
    from csagate.perf.probe import ZERO_KERNEL, ptx_entries

    zero = next(text for name, text in ptx_entries(ptx).items() if ZERO_KERNEL in name)
    head = zero.split("st.global")[0]  # before the first store: wait for the kernel before
    assert 0 <= head.find("griddepcontrol.wait") < head.find("griddepcontrol.launch_dependents")
    waits = [m.start() for m in re.finditer(r"griddepcontrol\.wait", main)]
    loads = [m.start() for m in re.finditer(r"\bld\.global", main)]
    reds = [m.start() for m in re.finditer(r"\bred\.[\w.]*global", main)]
    assert len(waits) == 2 and waits[0] < loads[0] and reds and waits[1] < reds[0] < reds[-1]


def test_family_limits_are_stated():
    """Every small ratio's window fits MAX_WINDOW at coff 2; ratio 64 would not (c2: 128
    positions, 256 fp32 values of s and u per thread > 255 registers), and ratio 2 refuses an
    odd coff*d (dAPE's 16-byte vectors) with one line."""
    for ratio in SMALL_RATIOS:
        assert SS.config_problems(ratio, 2, 128) == []
        assert ratio * 2 <= SS.MAX_WINDOW
    assert any("exceeds" in p for p in SS.config_problems(64, 2, 128))
    assert SS.config_problems(2, 1, 65) and not SS.config_problems(2, 2, 65)
    assert (1, 65) not in SS.build_configs(2) and (1, 65) in SS.build_configs(4)
    with pytest.raises(ValueError, match="multiple of 4"):
        SS.check_config(2, 1, 65)


@pytest.mark.parametrize("ratio", SMALL_RATIOS)
def test_backward_ape_hoisted_up_to_its_window(ratio):
    """The backward hoists the APE in registers up to BWD_APE_REGS_MAX_WINDOW and re-reads it
    per row beyond (ratio 32 at coff 2); a staged vector form re-reads it where hoisting it
    would keep more than BWD_VEC_MAX_VALUES values (sm_90a r4 c2 from d = 256); the tag says
    which (``_ag``)."""
    for coff in (1, 2):
        for arch, d in ((None, 128), ("sm_90a", 128), ("sm_90a", 512)):
            sched = SS.small_schedule("bwd", d, ratio=ratio, coff=coff, arch=arch)
            window = ratio * coff
            hoisted = (window <= SS.BWD_APE_REGS_MAX_WINDOW and not (
                sched.stages and SS.bwd_values(window, sched.vec) > SS.BWD_VEC_MAX_VALUES))
            assert sched.ape_regs == hoisted, (ratio, coff, arch, d)
            assert ("_ag" not in sched.tag) == sched.ape_regs
    assert not SS.small_schedule("bwd", 512, ratio=4, coff=2, arch="sm_90a").ape_regs


# --- the forward's other forms (vec 4; 2 or 4 rows per thread)

FWD_FORM_KERNELS = [(ratio, arch, coff, d, sched) for ratio in SMALL_RATIOS
                    for arch in ARCHES for coff in COFFS for d in (128, 512)
                    for sched in SS.fwd_forms(ratio, coff, d)]


def _form_id(direction: str, k) -> str:
    ratio, arch, coff, d, sched = k
    return f"r{ratio}{direction}-{arch}-c{coff}d{d}-{sched.tag}"


def _fid(k) -> str:
    return _form_id("fwd", k)


def _bid(k) -> str:
    return _form_id("bwd", k)


@functools.cache
def _form_ptx(direction: str, ratio: int, arch: str, coff: int, d: int, sched) -> str:
    from csagate.kernels import registry
    from csagate.kernels.cache import CACHE

    ptx = CACHE.ptx(registry.make_key(direction, ratio, coff, d, sched, arch))
    assert ptx, f"{_form_id(direction, (ratio, arch, coff, d, sched))}: no PTX retained"
    return ptx


@pytest.mark.parametrize("kernel", FWD_FORM_KERNELS, ids=_fid)
def test_fwd_form_ptxas_clean_and_pinned(kernel, ptxas):
    """Every forward form: 0 spill, 0 stack on the three arches; per row the table form's
    pinned operations, vec-wide loads and one vec-wide store."""
    from csagate.perf.probe import main_entry

    ratio, arch, coff, d, sched = kernel
    ptx = _form_ptx("fwd", *kernel)
    _assert_ptxas_clean(ptx, _fid(kernel), "fwd", arch, ptxas)
    main = main_entry(ptx)
    _check_fwd_ptx(main, _fid(kernel), coff * ratio, sched)
    assert f".reqntid {sched.threads}, 1, 1" in main


DIV_TWINS = [(direction, 4, "sm_90a", coff, d) for direction in ("fwd", "bwd")
             for coff, d in ((1, 128), (2, 512))]


@pytest.mark.parametrize("kernel", DIV_TWINS, ids=lambda k: f"r{k[1]}{k[0]}-c{k[3]}d{k[4]}")
def test_ieee_div_twin_divides_one_by_one(kernel, ptxas):
    """The A/B's ``ieee_div`` twin of a table form (tag ``_div``, the kernel before the shared
    reciprocal): ptxas-clean, one ``div.rn.f32`` per element and none of the shared
    reciprocal's operations."""
    from csagate.perf.probe import main_entry

    direction, ratio, arch, coff, d = kernel
    table = SS.small_schedule(direction, d, ratio=ratio, coff=coff, arch=arch)
    twin = dataclasses.replace(table, ieee_div=True)
    assert twin.tag == table.tag + "_div"
    label = f"r{ratio}{direction} c{coff}d{d} {twin.tag} {arch}"
    ptx = _form_ptx(direction, ratio, arch, coff, d, twin)
    _assert_ptxas_clean(ptx, label, direction, arch, ptxas)
    check = _check_fwd_ptx if direction == "fwd" else _check_bwd_ptx
    check(main_entry(ptx), label, coff * ratio, twin)


def test_fwd_forms_follow_the_register_budget():
    """A forward form exists where its fp32 values fit FWD_MAX_VALUES; the table's own form
    is never listed again; what the kernel cannot build is refused with its reason."""
    for ratio in SMALL_RATIOS:
        for coff in COFFS:
            win = ratio * coff
            table = SS.small_schedule("fwd", 128, ratio=ratio, coff=coff)
            forms = SS.fwd_forms(ratio, coff, 128)
            assert table not in forms
            assert {(s.vec, s.rows_per_cta) for s in forms} == {
                (v, r) for v in SS.FWD_VECS for r in SS.FWD_ROWS if v > 1
                and SS.fwd_values(win, v, r) <= SS.FWD_MAX_VALUES} - {(table.vec, 1)}
    for ratio in SMALL_RATIOS:  # on an arch: its own table form is left out, never the default
        for coff in COFFS:
            for d in (128, 512):
                table = SS.small_schedule("fwd", d, ratio=ratio, coff=coff, arch="sm_90a")
                default = SS.small_schedule("fwd", d, ratio=ratio, coff=coff)
                forms = SS.fwd_forms(ratio, coff, d, "sm_90a")
                assert table not in forms
                assert (default in forms) == (default != table), (ratio, coff, d)
    assert any("multiple" in p for p in SS.fwd_schedule_problems(
        4, 1, 130, SS.fwd_form(4, 1, 130)))
    assert any("backward fields" in p for p in SS.fwd_schedule_problems(
        4, 1, 128, SS.SmallSchedule(2, 64, 1, ape_regs=False)))


@pytest.mark.parametrize("arch", (None, "sm_90a"))
@pytest.mark.parametrize("ratio", SMALL_RATIOS)
@pytest.mark.parametrize("d", (65, 128, 512))
def test_backward_rows_per_cta_rule(ratio, d, arch):
    """The launch's rows per CTA: at least one and at most the schedule's; never fewer as the
    rows grow; 1 wherever the schedule is the one-row (wide window) form; an unstaged table
    form of fixed rows (SM90_BWD_ROWS) takes them at every N, a staged one takes them as its
    most, at least BWD_STAGED_CTAS_PER_SLICE CTAs per slice once the rows allow; else about
    BWD_CTAS_PER_SLICE CTAs along the rows per 128-column slice once the rows allow it."""
    for coff in COFFS:
        if SS.config_problems(ratio, coff, d):
            continue
        sched = SS.small_schedule("bwd", d, ratio=ratio, coff=coff, arch=arch)
        picks = [SS.bwd_rows_per_cta(n, d, coff, sched) for n in (1, 100, 2048, 8192, 32768,
                                                                 10**6)]
        assert picks == sorted(picks) and all(1 <= p <= sched.rows_per_cta for p in picks)
        if sched.rows_per_cta == 1:
            assert set(picks) == {1}
            continue
        fixed = arch == "sm_90a" and d >= 128 and SS.SM90_BWD_ROWS.get((ratio, coff, d < 256))
        if fixed and not sched.stages:
            assert set(picks) == {fixed * sched.lanes}, (ratio, coff, d, picks)
            continue
        if fixed:
            slices = SS.bwd_slices(d, sched)
            assert picks[-1] == sched.rows_per_cta == fixed * sched.lanes, (ratio, coff, d)
            for n in (2048, 8192, 32768):
                gx = -(-n // SS.bwd_rows_per_cta(n, d, coff, sched))
                assert gx >= SS.BWD_STAGED_CTAS_PER_SLICE * slices, (ratio, coff, d, n, gx)
            continue
        assert sched.rows_per_cta == SS.bwd_most_rows(sched.lanes)
        slices = -(-d // (sched.threads * sched.vec))
        n = 64 * SS.BWD_CTAS_PER_SLICE * slices
        gx = -(-n // SS.bwd_rows_per_cta(n, d, coff, sched))
        assert picks[-1] == sched.rows_per_cta and gx >= SS.BWD_CTAS_PER_SLICE * slices


@pytest.mark.parametrize("arch", (None, "sm_90a"))
@pytest.mark.parametrize("ratio", SMALL_RATIOS)
@pytest.mark.parametrize("d", (65, 128, 512))
def test_backward_rows_fill_whole_waves(ratio, d, arch):
    """Given the GPU's SMs and the kernel's resident CTAs, the rule moves only grids of at
    least BWD_WAVE_MIN of a wave, within [aim / 2, 2 aim] and the schedule's most; its pick
    costs BWD_WAVE_GAIN less (waves x (rows per lane + BWD_CTA_COST)) than the aim's, or is the
    aim; unknown occupancy
    keeps the aim, and so does a staged form at any occupancy; a grid of under one wave (r4
    c1d128 unstaged at 32768 rows: 512 CTAs of 640) grows to fill it."""
    for coff in COFFS:
        if SS.config_problems(ratio, coff, d):
            continue
        sched = SS.small_schedule("bwd", d, ratio=ratio, coff=coff, arch=arch)
        slices = -(-d // (sched.threads * sched.vec))
        for sms, per_sm in ((132, 1), (132, 5), (148, 8), (78, 12), (1, 3)):
            wave = int(SS.BWD_WAVE_FILL * sms * per_sm)
            for n in (1, 100, 2048, 8192, 20000, 32768, 65536, 10**6):
                aim = SS.bwd_rows_per_cta(n, d, coff, sched)
                assert SS.bwd_rows_per_cta(n, d, coff, sched, sms, 0) == aim
                pick = SS.bwd_rows_per_cta(n, d, coff, sched, sms, per_sm)
                assert 1 <= pick <= sched.rows_per_cta, (coff, n, pick)

                def ctas(r, n=n, slices=slices):
                    return -(-n // r) * slices

                def cost(r, wave=wave, lanes=sched.lanes):
                    return -(-ctas(r) // wave) * (-(-r // lanes) + SS.BWD_CTA_COST)
                if (sched.rows_per_cta == 1 or sched.stages
                        or ctas(aim) < SS.BWD_WAVE_MIN * wave):
                    assert pick == aim, (coff, n, sms, per_sm, aim, pick)
                    continue
                assert -(-aim // 2) <= pick <= 2 * aim
                assert pick == aim or cost(pick) <= (1 - SS.BWD_WAVE_GAIN) * cost(aim)
    if ratio == 4 and d == 128 and arch == "sm_90a":
        sched = dataclasses.replace(SS.small_schedule("bwd", 128, ratio=4, coff=1, arch=arch),
                                    stages=0)
        wave = int(SS.BWD_WAVE_FILL * 132 * 5)
        pick = SS.bwd_rows_per_cta(32768, 128, 1, sched, 132, 5)
        assert -(-32768 // SS.bwd_rows_per_cta(32768, 128, 1, sched)) < -(-32768 // pick) <= wave


@pytest.mark.parametrize("ratio", SMALL_RATIOS)
def test_a_staged_form_aims_at_half_the_ctas(ratio):
    """A staged form's aim: ceil(N / (BWD_STAGED_CTAS_PER_SLICE x slices)) rows, at least 2 x
    slices a lane, at most the schedule's; so at least its unstaged twin's at every N, twice
    it where neither bound holds."""
    for coff in COFFS:
        for d in (128, 136, 512):
            for form in SS.bwd_forms(ratio, coff, d, "sm_90a"):
                if not form.stages or form.rows_per_cta < SS.bwd_most_rows(form.lanes):
                    continue
                plain = dataclasses.replace(form, stages=0)
                slices = SS.bwd_slices(d, form)
                for n in (1, 2048, 8192, 32768, 10**6):
                    aim = SS.bwd_rows_per_cta(n, d, coff, form, 132, 5)
                    want = -(-n // (SS.BWD_STAGED_CTAS_PER_SLICE * slices))
                    assert aim == min(form.rows_per_cta, max(2 * slices * form.lanes, want))
                    assert aim >= SS.bwd_rows_per_cta(n, d, coff, plain), (form.tag, n)


def test_sm90a_forward_table_and_defaults():
    """The sm_90a forward table holds measured forms only where d is a multiple of 4 and at
    least 128; every other arch and head dim keeps the default form; every table form builds
    (its problems list is empty)."""
    for ratio in SMALL_RATIOS:
        for coff in COFFS:
            for d in (65, 96, 128, 130, 256, 512):
                if SS.config_problems(ratio, coff, d):
                    continue
                base = SS.small_schedule("fwd", d, ratio=ratio, coff=coff)
                for arch in ARCHES:
                    got = SS.small_schedule("fwd", d, ratio=ratio, coff=coff, arch=arch)
                    assert not SS.fwd_schedule_problems(ratio, coff, d, got)
                    if arch != "sm_90a" or d < 128 or d % 4:
                        assert got == base, (ratio, coff, d, arch)
    assert SS.small_schedule("fwd", 128, ratio=4, coff=1, arch="sm_90a").vec == 4
    assert SS.small_schedule("fwd", 128, ratio=4, coff=2, arch="sm_90a").vec == 2




# --- the backward's forms (vec 1, 2, 4 columns per thread; lanes)

BWD_FORM_KERNELS = [(ratio, "sm_90a", coff, d, sched) for ratio in SMALL_RATIOS
                    for coff in COFFS for d in (128, 512)
                    for sched in SS.bwd_forms(ratio, coff, d, "sm_90a")]


@pytest.mark.parametrize("kernel", BWD_FORM_KERNELS, ids=_bid)
def test_bwd_form_ptxas_clean_and_pinned(kernel, ptxas):
    """Every backward form the sm_90a A/B times beside the table's: 0 spill, 0 stack; per row
    body the pinned operations, vec-wide loads, one vec-wide dAPE reduction per position."""
    from csagate.perf.probe import main_entry

    ratio, arch, coff, d, sched = kernel
    label = _bid(kernel)
    ptx = _form_ptx("bwd", *kernel)
    _assert_ptxas_clean(ptx, label, "bwd", arch, ptxas)
    main = main_entry(ptx)
    _check_bwd_ptx(main, label, coff * ratio, sched)
    assert f".reqntid {sched.threads}, {sched.lanes}, 1" in main


def test_bwd_forms_and_the_sm90a_table():
    """The backward's table: vector forms on sm_90a only where the measured table says and d
    allows, the one-column form elsewhere; every table and listed form builds (no problems);
    a vector form fills its CTA with lanes; what the kernel cannot build is refused."""
    for ratio in SMALL_RATIOS:
        for coff in COFFS:
            for d in (65, 96, 128, 130, 136, 256, 512):
                if SS.config_problems(ratio, coff, d):
                    continue
                for arch in ARCHES:
                    got = SS.small_schedule("bwd", d, ratio=ratio, coff=coff, arch=arch)
                    assert not SS.bwd_schedule_problems(ratio, coff, d, got), (ratio, coff, d)
                    want = 1
                    if arch == "sm_90a" and d >= 128:
                        want = SS.SM90_BWD_VECS.get((ratio, coff, d < 256), 1)
                        want = want if d % want == 0 else 1
                    assert got.vec == want, (ratio, coff, d, arch, got)
                    # the prefetch form only where the H200 measured it, never at one row a CTA
                    assert not got.prefetch or (arch == "sm_90a" and d >= 128
                                                and got.rows_per_cta > 1), (ratio, coff, d, got)
                for form in SS.bwd_forms(ratio, coff, d, "sm_90a"):
                    assert not SS.bwd_schedule_problems(ratio, coff, d, form)
                    groups = d // form.vec
                    if form.vec > 1:
                        assert form.threads % 32 == 0 and form.threads >= min(groups, 128)
                        assert form.threads * form.lanes <= SS.SMALL_BWD_THREADS
                        assert form.lanes == 1 or form.threads * form.lanes == 128
    ok = SS.bwd_form(2, 128, 8)
    assert not SS.bwd_schedule_problems(4, 2, 128, ok) and ok.lanes == 2
    assert any("values" in p for p in SS.bwd_schedule_problems(4, 2, 128, SS.bwd_form(4, 128, 8)))
    assert any("multiple" in p for p in SS.bwd_schedule_problems(4, 1, 130, SS.bwd_form(4, 130, 4)))
    assert any("vec must be" in p for p in SS.bwd_schedule_problems(
        4, 1, 128, SS.SmallSchedule(3, 128, 32)))
    assert any("hoists" in p for p in SS.bwd_schedule_problems(
        4, 1, 128, SS.SmallSchedule(2, 64, 32, ape_regs=False, lanes=2)))
    regread = SS.bwd_form(4, 512, 8, stages=2)  # staged: re-reads the APE, 96 values
    assert not regread.ape_regs and not SS.bwd_schedule_problems(4, 2, 512, regread)
    assert any("values" in p for p in SS.bwd_schedule_problems(  # 192 values
        8, 2, 512, SS.bwd_form(4, 512, 16, stages=2)))
    assert SS.bwd_form(4, 512, 4, stages=2).ape_regs  # 64 values: hoisted
    assert any("lanes" in p for p in SS.fwd_schedule_problems(
        4, 1, 128, SS.SmallSchedule(2, 64, 1, lanes=2)))
    assert any("prefetch" in p for p in SS.fwd_schedule_problems(
        4, 1, 128, SS.SmallSchedule(2, 64, 1, prefetch=True)))
    wide = SS.bwd_form(1, 128, 64, prefetch=True)  # a window of 64: one row per CTA
    assert any("more than one row" in p for p in SS.bwd_schedule_problems(32, 2, 128, wide))
    for ratio, coff in ((2, 1), (4, 2), (16, 1)):  # every buildable form has its prefetch twin
        forms = set(SS.bwd_forms(ratio, coff, 128, "sm_90a")) | {
            SS.small_schedule("bwd", 128, ratio=ratio, coff=coff, arch="sm_90a")}
        plain = {f for f in forms if not f.stages}
        assert {dataclasses.replace(f, prefetch=True) for f in plain} <= forms, (ratio, coff)
        # ... and every vector form its staged twins
        assert {dataclasses.replace(f, prefetch=False, stages=s) for f in plain if f.vec > 1
                for s in SS.BWD_STAGES} <= forms, (ratio, coff)
    staged = SS.bwd_form(2, 128, 8, stages=2)
    assert not SS.bwd_schedule_problems(4, 2, 128, staged)
    for bad, why in ((SS.bwd_form(1, 128, 4, stages=2), "4 or 8 bytes"),
                     (dataclasses.replace(staged, prefetch=True), "not a prefetch"),
                     (dataclasses.replace(staged, stages=5), "stages must be"),
                     (dataclasses.replace(staged, rows_per_cta=1, lanes=1), "more than one row")):
        assert any(why in p for p in SS.bwd_schedule_problems(4, 2, 128, bad)), (bad, why)
