"""CPU build checks of the small-ratio kernels (no GPU): every small ratio, both table arches,
ptxas-clean, pinned PTX.

Each (kernel, ratio, arch, coff, d) is cross-compiled once, assembled with the external
``ptxas -v`` (0 spill, 0 stack) and its PTX is checked for the facts the bitwise contract
rests on: the accurate exp (one ``fma.rm`` range reduction per ``ex2.approx.ftz``), the exact
count of pinned ``mul.rn``/``add.rn``/``fma.rn``/``div.rn`` (an extra ``fma.rn`` would be a
contracted ``a*b+c``), vector accesses for even d (up to the vec-2 window limit), one dAPE
atomic per window position. The counts are per window position, so they hold at every ratio.
"""

from __future__ import annotations

import functools
import re

import pytest
from csagate.kernels import small_schedule as SS
from csagate.kernels._dsl import dsl_available
from csagate.kernels.schedule import TABLE_ARCHES as ARCHES  # sm_103a: test_cache_probe

_DSL_OK, _DSL_WHY = dsl_available()
pytestmark = pytest.mark.skipif(not _DSL_OK, reason=_DSL_WHY or "cutlass DSL unavailable")

COFFS = (1, 2)
HEAD_DIMS = (128, 65, 512)  # even d (vec=2), odd d (vec=1), the large production d
KERNELS = [(kind, ratio, arch, coff, d) for ratio in SS.SMALL_RATIOS for kind in ("fwd", "bwd")
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


@pytest.mark.parametrize("kernel", KERNELS, ids=_kid)
def test_ptxas_clean(kernel, ptxas):
    from csagate.perf.probe import ZERO_KERNEL, assemble, ptxas_entries

    kind, ratio, arch, coff, d = kernel
    rc, log = assemble(_ptx(*kernel), arch, ptxas)
    assert rc == 0, f"ptxas failed on {_kid(kernel)}:\n{log}"

    entries = ptxas_entries(log)
    zeroing = [name for name in entries if ZERO_KERNEL in name]
    # the backward's module: the kernel and the dAPE zeroing kernel; the forward's: one
    assert len(entries) == (2 if kind == "bwd" else 1) and len(zeroing) == len(entries) - 1, (
        f"unexpected entries {list(entries)}:\n{log}")
    for name, (regs, spill_st, spill_ld, stack) in entries.items():
        assert None not in (regs, spill_st, spill_ld, stack), f"unparsed ptxas -v output:\n{log}"
        assert (stack, spill_st, spill_ld) == (0, 0, 0), (
            f"{_kid(kernel)} {name}: {regs} registers, stack {stack} B, spill stores "
            f"{spill_st} B, spill loads {spill_ld} B (must all be 0)")


@pytest.mark.parametrize("kernel", KERNELS, ids=_kid)
def test_ptx_pins_numerics(kernel):

    kind, ratio, arch, coff, d = kernel
    ptx = _main_ptx(*kernel)
    win = coff * ratio
    vec, threads = SS.fwd_schedule(d, win) if kind == "fwd" else (1, SS.SMALL_BWD_THREADS)
    n_exp = win * vec  # one exact exp per (window position, column)
    fma_rn = [ln for ln in ptx.splitlines() if "fma.rn.f32" in ln]
    pinned_fma = [ln for ln in fma_rn if not any(c in ln for c in EXP_CONSTANTS)]
    found = {
        "ex2.approx.ftz.f32": _count(r"ex2\.approx\.ftz\.f32", ptx),
        "fma.rm.f32 (accurate exp)": _count(r"fma\.rm\.f32", ptx),
        "div.rn.f32": _count(r"div\.rn\.f32", ptx),
        "mul.rn.f32": _count(r"mul\.rn\.f32", ptx),
        "add.rn.f32": _count(r"add\.rn\.f32", ptx),
        "fma.rn.f32 outside exp": len(pinned_fma),
    }
    expected = {
        "ex2.approx.ftz.f32": n_exp,
        "fma.rm.f32 (accurate exp)": n_exp,
        "div.rn.f32": n_exp,  # p = e / den, IEEE, per element
        # fwd: u*p; bwd: go*u, dp*p, go*p
        "mul.rn.f32": n_exp if kind == "fwd" else 3 * n_exp,
        "add.rn.f32": 3 * n_exp,  # score+ape, den, (acc | S)
        "fma.rn.f32 outside exp": 0 if kind == "fwd" else n_exp,  # bwd: fma(p, -S, t)
    }
    # The compiler may duplicate the backward's row body (LLVM does at ratio 2, c1d128 on
    # sm_100a: two copies of the same instructions); every copy holds the whole pinned set.
    copies = found["div.rn.f32"] // n_exp if kind == "bwd" else 1
    assert copies >= 1 and found == {k: copies * v for k, v in expected.items()}, (
        f"{_kid(kernel)}: PTX op counts {found} != {copies} x {expected}")
    assert _count(r"\b(?:ld|st)\.local\b", ptx) == 0, f"{_kid(kernel)}: local memory used"
    assert _count(r"div\.(?:approx|full)\.f32", ptx) == 0, f"{_kid(kernel)}: inexact div"
    assert f".reqntid {threads}, 1, 1" in ptx, f"{_kid(kernel)}: block is not ({threads},1,1)"
    if kind == "fwd":
        # score + kv: one vec-wide load each per window position; one vec-wide out store
        n_vec_ld = _count(r"ld\.global\.v2\.b16", ptx)
        assert n_vec_ld == (2 * win if vec == 2 else 0), (
            f"{_kid(kernel)}: {n_vec_ld} ld.global.v2.b16 (vec={vec}, window {win})")
        store = r"st\.global\.b32" if vec == 2 else r"st\.global\.b16"
        assert _count(store, ptx) == 1, f"{_kid(kernel)}: expected one {store} out store"
    else:
        n_atomic = _count(r"(?:red|atom)\.[a-z.]*add\.f32", ptx)
        assert n_atomic == win, (
            f"{_kid(kernel)}: {n_atomic} fp32 atomic adds, expected one per window position"
            f" ({win})")


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
    for ratio in SS.SMALL_RATIOS:
        assert SS.config_problems(ratio, 2, 128) == []
        assert ratio * 2 <= SS.MAX_WINDOW
    assert any("exceeds" in p for p in SS.config_problems(64, 2, 128))
    assert SS.config_problems(2, 1, 65) and not SS.config_problems(2, 2, 65)
    assert (1, 65) not in SS.build_configs(2) and (1, 65) in SS.build_configs(4)
    with pytest.raises(ValueError, match="multiple of 4"):
        SS.check_config(2, 1, 65)


@pytest.mark.parametrize("ratio", SS.SMALL_RATIOS)
def test_backward_ape_hoisted_up_to_its_window(ratio):
    """The backward hoists the APE in registers up to BWD_APE_REGS_MAX_WINDOW and re-reads it
    per row beyond (ratio 32 at coff 2), and the tag says which (``_ag``)."""
    for coff in (1, 2):
        sched = SS.small_schedule("bwd", 128, ratio=ratio, coff=coff)
        assert sched.ape_regs == (ratio * coff <= SS.BWD_APE_REGS_MAX_WINDOW)
        assert ("_ag" not in sched.tag) == sched.ape_regs
