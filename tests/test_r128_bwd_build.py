"""CPU checks of the ratio=128 backward kernel: it builds for sm_90a and sm_100a, assembles
with 0 spill / 0 stack, and its PTX carries the facts the design relies on.

No GPU needed. The staged table kernels on both arches, each with goreuse flipped, and
fastexp flipped for the c1d128 ones (one of each fastexp value); the register-window table
kernels (``kernel_variants.BWD_REGWIN``) on both arches, and goreuse flipped where the flipped
schedule is valid.
"""

from __future__ import annotations

import dataclasses
import functools
import re

import pytest
from csagate.kernels._dsl import dsl_available, ptx_of
from csagate.kernels.schedule import (
    REGWIN_THREADS_PER_SM,
    ApeCopy,
    BwdSchedule,
    GradOut,
    bwd_smem_bytes,
    config_problems,
    rows_per_cta,
    window,
)
from csagate.kernels.schedule import TABLE_ARCHES as ARCHES  # sm_103a: test_cache_probe
from csagate.perf.probe import (
    ZERO_KERNEL,
    PtxasNotFound,
    assemble,
    find_ptxas,
    main_entry,
    ptx_entries,
    ptxas_entries,
)
from kernel_variants import BWD_BASE, BWD_REGWIN

_DSL_OK, _DSL_WHY = dsl_available()
pytestmark = pytest.mark.skipif(not _DSL_OK, reason=_DSL_WHY)

BASE = BWD_BASE
APE_PAIR = r"\bld\.global(?:\.nc)?\.(?:v2\.b32|b64)\b"  # vec 2: one APE load (an fp32 pair)


def _flip(sched: BwdSchedule, *, goreuse: bool | None = None,
          fastexp: bool | None = None) -> BwdSchedule:
    return dataclasses.replace(sched, fastexp=sched.fastexp if fastexp is None else fastexp,
                               goreuse=sched.goreuse if goreuse is None else goreuse)


def _variants():
    out = []
    for arch in ARCHES:
        for (coff, d), s in BASE:
            out.append((coff, d, s, arch, "table"))
            out.append((coff, d, _flip(s, goreuse=not s.goreuse), arch, "goreuse-flipped"))
            if (coff, d) == (1, 128):  # both fastexp values have a table entry here
                out.append((coff, d, _flip(s, fastexp=not s.fastexp), arch, "fastexp-flipped"))
    return out


VARIANTS = _variants()
IDS = [f"c{c}d{d}-{s.tag}-{a}-{why}" for c, d, s, a, why in VARIANTS]


REGWIN = BWD_REGWIN
REGWIN_VARIANTS = [(c, d, s, a) for a in ARCHES for (c, d), s in REGWIN]
# goreuse both ways, where the flipped schedule is valid (go=shared is read once)
REGWIN_GOREUSE = [((c, d), s) for (c, d), s in REGWIN
                  if not config_problems(c, d, _flip(s, goreuse=not s.goreuse))]
REGWIN_IDS = [f"c{c}d{d}-{s.tag}-{a}" for c, d, s, a in REGWIN_VARIANTS]


@functools.cache
def _built(coff: int, d: int, sched: BwdSchedule, arch: str) -> tuple[str, str, int, object]:
    """(the backward kernel's PTX, ptxas -v log of the whole module, ptxas return code,
    compiled fn) of one launcher, compiled once. The module also holds the dAPE zeroing
    kernel (test_launcher_carries_the_dape_zeroing_kernel); the PTX facts below are the
    backward's own, so its entry alone is returned."""
    from csagate.kernels.cache import CACHE
    from csagate.kernels.registry import make_key

    # through the test run's compile cache: a table kernel another test built is not rebuilt
    fn = CACHE.get(make_key("bwd", 128, coff, d, sched, arch))
    ptx = ptx_of(fn)
    assert ptx, f"no PTX retained for c{coff}d{d} {sched.tag} {arch} (CUTE_DSL_KEEP=ptx?)"
    try:  # the tests that read the log take the ptxas fixture (it skips, or fails under CI)
        rc, log = assemble(ptx, arch, find_ptxas())
    except PtxasNotFound:
        return main_entry(ptx), "", -1, fn
    return main_entry(ptx), log, rc, fn


def _module_ptx(coff: int, d: int, sched: BwdSchedule, arch: str,
                deterministic: bool = False) -> str:
    """The whole PTX module of a launcher, through the test run's compile cache (the table
    probe and the deterministic build tests compile the same keys)."""
    from csagate.kernels.cache import CACHE
    from csagate.kernels.registry import make_key

    return CACHE.ptx(make_key("bwd", 128, coff, d, sched, arch, deterministic))


def _count(pattern: str, text: str) -> int:
    return len(re.findall(pattern, text))


def _main_usage(log: str) -> tuple[int, int, int, int]:
    """(registers, spill stores, spill loads, stack) of the backward kernel from a ptxas -v
    report of its module; the zeroing kernel beside it must be spill- and stack-free too."""
    entries = ptxas_entries(log)
    main = [u for name, u in entries.items() if ZERO_KERNEL not in name]
    zero = [u for name, u in entries.items() if ZERO_KERNEL in name]
    assert len(main) == 1 and len(zero) == 1, f"expected the backward and the zeroing:\n{log}"
    assert None not in main[0] and None not in zero[0], f"could not parse ptxas -v output:\n{log}"
    assert zero[0][1:] == (0, 0, 0), f"zeroing kernel spill/stack {zero[0][1:]}\n{log}"
    return main[0]


@pytest.mark.parametrize("coff,d,sched,arch,why", VARIANTS, ids=IDS)
def test_builds_without_spill_or_stack(coff, d, sched, arch, why, ptxas):
    ptx, log, rc, _ = _built(coff, d, sched, arch)
    assert rc == 0, f"ptxas -arch={arch} failed:\n{log}"
    regs, spill_st, spill_ld, stack = _main_usage(log)
    assert (stack, spill_st, spill_ld) == (0, 0, 0), (
        f"regs={regs} stack={stack} spill stores={spill_st} loads={spill_ld}\n{log}")
    assert regs <= 255
    local = re.findall(r"\b(?:ld|st)\.local\b[^\n]*", ptx)
    assert not local, f"{len(local)} local-memory accesses, first: {local[0]}"


@pytest.mark.parametrize("coff,d,sched,arch,why", VARIANTS, ids=IDS)
def test_ptx_facts(coff, d, sched, arch, why):
    ptx, _, _, _ = _built(coff, d, sched, arch)
    chunk = window(coff) // sched.tchunks
    assert re.search(rf"\.reqntid {sched.threads_x}, {sched.tchunks}, 1\b", ptx)
    # 4 CTA barriers per row, none elsewhere.
    assert _count(r"\bbar\.sync\s+0;", ptx) == 4
    # Epilogue: one fp32 reduction per (window position, column) of the thread's chunk.
    n_red = _count(r"\b(?:red|atom)(?:\.[a-z]+)*\.add\.f32\b", ptx)
    assert n_red == chunk * sched.vec, f"{n_red} fp32 atomics, expected C*vec={chunk * sched.vec}"
    # Pinned rounding and the IEEE divisions of the merge (1/den may print as rcp.rn).
    for op in (r"mul\.rn\.f32", r"fma\.rn\.f32", r"add\.rn\.f32", r"div\.rn\.f32"):
        assert _count(op, ptx) > 0, f"no {op} in the PTX"
    assert _count(r"\b(?:rcp\.rn\.f32|div\.rn\.f32)", ptx) == 2
    assert _count(r"\bdiv\.(?:approx|full)\.f32", ptx) == 0
    assert _count(r"cvt\.rn\.bf16(?:x2)?\.f32", ptx) > 0


@pytest.mark.parametrize("coff,d,sched,arch,why", VARIANTS, ids=IDS)
def test_exp_form_follows_fastexp(coff, d, sched, arch, why):
    """fastexp: exp = ex2.approx.ftz(fma.rn(x, LO, mul.rn(x, HI))); exact: the range-reduced
    expf (fma.rm rounding trick, fma.rn by HI). Both contain the LO constant 0f32A57060: the
    accurate expf uses the same split of log2(e)."""
    ptx, _, _, _ = _built(coff, d, sched, arch)
    n_ex2 = _count(r"\bex2\.approx\.ftz\.f32\b", ptx)
    n_lo = _count(r"\bfma\.rn\.f32\s+%r\d+, %r\d+, 0f32A57060, %r\d+;", ptx)
    n_rm = _count(r"\bfma\.rm\.f32\b", ptx)
    n_fma_hi = _count(r"\bfma\.rn\.f32\s+%r\d+, %r\d+, 0f3FB8AA3B,", ptx)
    assert n_ex2 == 8 * sched.vec, f"{n_ex2} ex2.approx.ftz.f32: e-pass unrolled 8 x vec"
    assert n_lo == n_ex2, f"{n_lo} LO fmas for {n_ex2} ex2"
    if sched.fastexp:
        assert n_rm == 0 and n_fma_hi == 0, f"accurate expf traces: fma.rm={n_rm} HI-fma={n_fma_hi}"
        fast = re.findall(
            r"mul\.rn\.f32\s+(%r\d+), (%r\d+), (?:%r\d+|0f3FB8AA3B);\s*"
            r"fma\.rn\.f32\s+(%r\d+), \2, 0f32A57060, \1;\s*"
            r"ex2\.approx\.ftz\.f32\s+%r\d+, \3;", ptx)
        assert len(fast) == n_ex2, f"{len(fast)} mul.rn/fma.rn/ex2 triples for {n_ex2} ex2"
        assert "0f3FB8AA3B" in ptx
    else:
        assert n_rm == n_ex2 and n_fma_hi == n_ex2, (
            f"accurate expf expected per exp: fma.rm={n_rm} HI-fma={n_fma_hi} ex2={n_ex2}")


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("cfg,sched", BASE, ids=[f"c{c}d{d}-{s.tag}" for (c, d), s in BASE])
def test_goreuse_loads_grad_out_once(cfg, sched, arch):
    """goreuse only drops the phase-4 reload of the grad_out vec: one bf16 global load less."""
    coff, d = cfg
    loads = {}
    for g in (False, True):
        ptx, _, _, _ = _built(coff, d, _flip(sched, goreuse=g), arch)
        loads[g] = _count(r"\bld\.global(?:\.nc)?(?:\.v\d)?\.b16\b", ptx)
    assert loads[False] == loads[True] + 1, f"bf16 global loads by goreuse: {loads}"


def test_rows_per_cta_and_zero_dape_are_runtime_arguments():
    (coff, d), sched = BASE[0]
    _, _, _, fn = _built(coff, d, sched, ARCHES[0])
    sig = str(fn.execution_args.signature)  # Constexpr parameters are dropped from it
    assert re.search(r"rows_per_cta: [\w.]*Int32, zero_dape: [\w.]*Int32", sig), sig


def _is_zero(operand: str, ptx: str) -> bool:
    """A PTX store operand that is +0.0: a literal, a vector of them, or a register moved from
    them (sm_100a packs two fp32 zeros into a b64 register first)."""
    parts = [p for p in re.split(r"[{},\s]+", operand) if p]
    if len(parts) > 1:
        return all(_is_zero(p, ptx) for p in parts)
    if parts[0] in ("0", "0f00000000"):
        return True
    src = re.findall(rf"\bmov\.b(?:32|64)\s+{re.escape(parts[0])},\s*([^;]+);", ptx)
    return len(src) == 1 and _is_zero(src[0], ptx)


@pytest.mark.parametrize("arch", ARCHES)
def test_launcher_carries_the_dape_zeroing_kernel(arch):
    """The default launcher's module: the backward and one zeroing kernel, which only stores
    +0.0, 16 bytes at a time (launched first when zero_dape != 0: api.backward's fresh dAPE
    without a torch zeros_like); the deterministic launcher's dAPE is a partials slice: no
    zeroing kernel."""
    (coff, d), sched = BASE[0]
    entries = ptx_entries(_module_ptx(coff, d, sched, arch))
    zero = [text for name, text in entries.items() if ZERO_KERNEL in name]
    assert len(entries) == 2 and len(zero) == 1, list(entries)
    stores = re.findall(r"\bst\.global([\w.]*)\s+\[[^\]]+\],\s*([^;]+);", zero[0])
    assert stores and all(kind in (".v4.b32", ".v2.b64") and _is_zero(value, zero[0])
                          for kind, value in stores), stores
    assert not re.search(r"\b(?:ld\.global|red|atom|bar)\b", zero[0])
    det_entries = ptx_entries(_module_ptx(coff, d, sched, arch, deterministic=True))
    assert len(det_entries) == 1 and ZERO_KERNEL not in next(iter(det_entries))


def _first(pattern: str, text: str) -> int:
    m = re.search(pattern, text)
    return m.start() if m else -1


@pytest.mark.parametrize("arch", ARCHES)
def test_default_backward_overlaps_the_dape_zeroing_through_pdl(arch):
    """The default launcher starts the zeroing and the backward as programmatic dependents
    (PDL) of the kernel before each: the zeroing waits for its predecessor, then releases the
    backward (griddepcontrol.launch_dependents before its store); the backward waits
    (griddepcontrol.wait) before its first load when it follows any other kernel
    (zero_dape == 0) and, in every case, before its first dAPE atomic. The deterministic
    kernel never waits."""
    (coff, d), sched = BASE[0]
    entries = ptx_entries(_module_ptx(coff, d, sched, arch))
    zero = next(text for name, text in entries.items() if ZERO_KERNEL in name)
    body = next(text for name, text in entries.items() if ZERO_KERNEL not in name)
    # the zeroing waits for the kernel before it (it is a dependent too), then releases the
    # backward, then stores
    assert (0 <= _first(r"griddepcontrol\.wait", zero)
            < _first(r"griddepcontrol\.launch_dependents", zero) < _first(r"\bst\.global", zero))
    waits = [m.start() for m in re.finditer(r"griddepcontrol\.wait", body)]
    assert len(waits) == 2, waits
    assert waits[0] < _first(r"\bld\.global", body)
    reds = [m.start() for m in re.finditer(r"\bred\.[\w.]*global", body)]
    assert reds and waits[1] < reds[0] and waits[1] > _first(r"\bst\.global", body)
    det = _module_ptx(coff, d, sched, arch, deterministic=True)
    assert all("griddepcontrol.wait" not in text for text in ptx_entries(det).values())


def test_rejects_invalid_schedules():
    from csagate.kernels.r128_bwd import bwd_kernel

    with pytest.raises(ValueError, match="vec=4"):
        bwd_kernel(128, 1, BwdSchedule(4, 4, 32, True, False))
    with pytest.raises(ValueError, match="straddles"):
        bwd_kernel(128, 2, BwdSchedule(2, 1, 32, True, False))
    with pytest.raises(ValueError, match="multiple of threads_x"):
        bwd_kernel(96, 1, BwdSchedule(2, 8, 32, True, False))
    op = bwd_kernel(512, 2, BwdSchedule(2, 8, 32, True, True))
    assert (op.chunk, op.cols_pc, op.gy, op.smem_bytes) == (32, 64, 8, 105024)


def test_launch_nothing_without_rows():
    import torch
    from csagate.kernels.r128_bwd import launch_bwd

    def boom(*args):
        raise AssertionError("launched with N == 0")

    (coff, d), sched = BASE[0]
    kv = torch.zeros(256, coff * d, dtype=torch.bfloat16)
    dkv = torch.full_like(kv, 7.0)
    launch_bwd(boom, sched=sched, kv=kv, score=kv, ape=torch.zeros(128, coff * d),
               cu=torch.tensor([0, 256], dtype=torch.int32),
               cuc=torch.tensor([0, 0], dtype=torch.int32),
               grad_out=torch.empty(0, d, dtype=torch.bfloat16), dkv=dkv, dscore=dkv,
               dape=torch.zeros(128, coff * d), rows_per_cta=1)
    assert bool((dkv == 7.0).all())


def test_launch_passes_rows_per_cta_and_the_zero_flag_last():
    import torch
    from csagate.kernels.r128_bwd import launch_bwd

    calls = []
    (coff, d), sched = BASE[0]
    kv = torch.zeros(256, coff * d, dtype=torch.bfloat16)
    tensors = dict(kv=kv, score=kv, ape=torch.zeros(128, coff * d),
                   cu=torch.tensor([0, 256], dtype=torch.int32),
                   cuc=torch.tensor([0, 2], dtype=torch.int32),
                   grad_out=torch.zeros(2, d, dtype=torch.bfloat16), dkv=kv, dscore=kv,
                   dape=torch.zeros(128, coff * d))
    for zero in (False, True):
        launch_bwd(lambda *a: calls.append(a[9:]), sched=sched, **tensors, rows_per_cta=3,
                   zero_dape=zero)
    launch_bwd(lambda *a: calls.append(a[9:]), sched=sched, **tensors, rows_per_cta=2)
    assert calls == [(3, 0), (3, 1), (2, 0)]


def flipped(sched: BwdSchedule, *, goreuse: bool | None = None,
            fastexp: bool | None = None) -> BwdSchedule:
    """The same schedule with goreuse and/or fastexp replaced (just another BwdSchedule)."""
    return _flip(sched, goreuse=goreuse, fastexp=fastexp)


def grid_of(*, d: int, sched: BwdSchedule, n_rows: int, rows_per_cta: int) -> tuple:
    """The launch grid (gx, gy, 1) for N rows."""
    return (-(-n_rows // rows_per_cta), -(-(d // sched.vec) // sched.threads_x), 1)


def test_flipped_schedule_and_grid():
    s = BwdSchedule(2, 8, 32, True, True)
    assert flipped(s, goreuse=False) == BwdSchedule(2, 8, 32, True, False)
    assert flipped(s, fastexp=False) == BwdSchedule(2, 8, 32, False, True)
    assert flipped(s) == s
    assert grid_of(d=128, sched=s, n_rows=1024, rows_per_cta=6) == (171, 2, 1)
    assert grid_of(d=128, sched=BwdSchedule(1, 8, 32, False, True), n_rows=5,
                   rows_per_cta=16) == (1, 4, 1)


# --- regwin -----------------------------------------------------------------------------------


def _regs(log: str) -> int:
    return _main_usage(log)[0]


def _fetch_runs(ptx: str, coff: int, d: int, chunk: int) -> list[int]:
    """PTX line numbers of the runs of exactly 2*C back-to-back 16/32-bit global loads at
    offsets that are whole token rows (coff*d bf16) from their base: the window fetches."""
    row = 2 * coff * d
    runs, cur, start = [], [], 0
    for n, line in enumerate(ptx.splitlines() + [""]):
        m = re.match(r"\s*ld\.global\.b(?:16|32)\s+%\w+, \[%rd\d+(?:\+(\d+))?\];", line)
        if m:
            if not cur:
                start = n
            cur.append(int(m.group(1) or 0))
            continue
        if len(cur) == 2 * chunk and all(off % row == 0 for off in cur):
            runs.append(start)
        cur = []
    return runs


@pytest.mark.parametrize("coff,d,sched,arch", REGWIN_VARIANTS, ids=REGWIN_IDS)
def test_regwin_builds_without_spill_within_the_register_cap(coff, d, sched, arch, ptxas):
    ptx, log, rc, _ = _built(coff, d, sched, arch)
    assert rc == 0, f"ptxas -arch={arch} failed:\n{log}"
    regs, *usage = _main_usage(log)
    assert tuple(usage) == (0, 0, 0), f"regs={regs} spill/stack={usage}\n{log}"
    # REGWIN_THREADS_PER_SM resident threads per SM: 128 registers per thread.
    cap = 65536 // REGWIN_THREADS_PER_SM
    assert regs <= cap, f"{regs} registers > {cap}"
    local = re.findall(r"\b(?:ld|st)\.local\b[^\n]*", ptx)
    assert not local, f"{len(local)} local-memory accesses, first: {local[0]}"


@pytest.mark.parametrize("coff,d,sched,arch", REGWIN_VARIANTS, ids=REGWIN_IDS)
def test_regwin_ptx_facts(coff, d, sched, arch):
    ptx, _, _, _ = _built(coff, d, sched, arch)
    chunk = window(coff) // sched.tchunks
    cv = chunk * sched.vec
    threads = sched.threads_x * sched.tchunks
    # The register cap: .maxntid of the resident threads per SM, not the block (.reqntid).
    per_sm = REGWIN_THREADS_PER_SM // threads
    assert re.search(rf"\.maxntid {sched.threads_x}, {sched.tchunks * per_sm}, 1\b", ptx)
    assert ".reqntid" not in ptx
    # 3 barriers per row and one before the dAPE epilogue.
    bars = [n for n, line in enumerate(ptx.splitlines()) if re.search(r"\bbar\.sync\s+0;", line)]
    assert len(bars) == 4, f"{len(bars)} bar.sync"
    # The window fetch: 2*C score/kv loads back to back, once before the row loop and once
    # in it, between the row's first barrier and its second (so before its stores).
    runs = _fetch_runs(ptx, coff, d, chunk)
    assert len(runs) == 2, f"fetch runs of {2 * chunk} loads at PTX lines {runs}"
    assert runs[0] < bars[0] < runs[1] < bars[1], f"fetches at {runs}, barriers at {bars}"
    stores = [n for n, line in enumerate(ptx.splitlines()) if re.search(r"\bst\.global\b", line)]
    assert any(n > bars[2] for n in stores), "no gradient stores after the merge barrier"
    assert not any(bars[0] < n < runs[1] for n in stores), "a store precedes the next fetch"
    # No window in shared memory: no bf16 shared accesses, and per row only the partials,
    # the per-column results and the thread's dAPE sums (at most 2*C*vec accesses).
    assert not re.search(r"\b(?:ld|st)\.shared(?:\.v\d)?\.b16\b", ptx)
    n_shared = len(re.findall(r"\b(?:ld|st)\.shared\b", ptx))
    bound = 3 * sched.tchunks + 8 + 3 * cv + 8
    if sched.ape is not ApeCopy.GLOBAL:  # the APE copy: C*vec values stored once, read once
        bound += 2 * cv
    assert n_shared <= bound, f"{n_shared} shared accesses > {bound}"
    # dAPE: one fp32 reduction per (window position, column), sums read from shared memory.
    n_red = len(re.findall(r"\b(?:red|atom)(?:\.[a-z]+)*\.add\.f32\b", ptx))
    assert n_red == cv, f"{n_red} fp32 atomics, expected C*vec={cv}"
    # Numerics as in the staged kernel: pinned rounding, 2 IEEE divisions per column.
    for op in (r"mul\.rn\.f32", r"fma\.rn\.f32", r"add\.rn\.f32"):
        assert re.search(op, ptx), f"no {op} in the PTX"
    assert len(re.findall(r"\b(?:rcp\.rn\.f32|div\.rn\.f32)", ptx)) == 2
    assert not re.search(r"\bdiv\.(?:approx|full)\.f32", ptx)
    assert re.search(r"cvt\.rn\.bf16(?:x2)?\.f32", ptx)
    # e is computed once, in the exp pass (kept for the gradient pass): C*vec exps, fast
    # (mul.rn, fma.rn LO, ex2) or accurate (fma.rm range reduction), per the field.
    n_ex2 = len(re.findall(r"\bex2\.approx\.ftz\.f32\b", ptx))
    n_lo = len(re.findall(r"\bfma\.rn\.f32\s+%r\d+, %r\d+, 0f32A57060, %r\d+;", ptx))
    n_rm = len(re.findall(r"\bfma\.rm\.f32\b", ptx))
    exps = cv
    assert n_ex2 == exps and n_lo == n_ex2, f"ex2={n_ex2} LO-fma={n_lo}, expected {exps}"
    assert n_rm == (0 if sched.fastexp else n_ex2), f"fma.rm={n_rm} (fastexp={sched.fastexp})"
    # APE is loaded once per row, in pass 1: C loads (at vec 2 its fp32 pair is the only
    # 2 x 32-bit load; at vec 1 it shares ld.global.b32 with cu/cuc); ape=shared: C, once,
    # before the row loop (the rows read the shared copy; a pair only moved to shared memory
    # may load as one b64); ape=async: none, C cp.async copies instead, waited for before the
    # first barrier.
    if sched.vec == 2:
        n_ape = len(re.findall(APE_PAIR, ptx))
        passes = 0 if sched.ape is ApeCopy.ASYNC else 1
        assert n_ape == chunk * passes, f"{n_ape} APE loads, C={chunk}"
    lines_ = ptx.splitlines()
    ape_copies = [n for n, line in enumerate(lines_)
                  if re.search(rf"\bcp\.async\.ca\.shared\.global \[[^]]+\], \[g\], "
                               rf"{4 * sched.vec};", line)]
    go_copies = [n for n, line in enumerate(lines_)
                 if re.search(r"\bcp\.async\.ca\.shared\.global \[[^]]+\], \[g\], 4;", line)]
    apeasync = sched.ape is ApeCopy.ASYNC
    gosm = sched.go is GradOut.SHARED
    if apeasync:
        assert len(ape_copies) >= chunk and ape_copies[chunk - 1] < bars[0]
    # go=shared: the grad_out word of the prologue's and the loop's fetch by cp.async (4 bytes),
    # waited for (cp.async.wait_group) before each row's pass 1 reads it.
    n_go = len(go_copies) - (chunk if apeasync and sched.vec == 1 else 0)
    assert n_go == (2 if gosm else 0), f"{n_go} grad_out copies (go={sched.go})"
    n_wait = len(re.findall(r"\bcp\.async\.wait_group\s+0;", ptx))
    assert n_wait == int(apeasync) + int(gosm), f"{n_wait} cp.async waits"
    assert not re.search(r"\bprefetch\.global", ptx)


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("cfg,sched", REGWIN_GOREUSE,
                         ids=[f"c{c}d{d}-{s.tag}" for (c, d), s in REGWIN_GOREUSE])
def test_regwin_goreuse_loads_grad_out_once(cfg, sched, arch):
    """goreuse only drops the gradient pass's reload of the grad_out vec."""
    coff, d = cfg
    loads = {}
    for g in (False, True):
        ptx, _, _, _ = _built(coff, d, _flip(sched, goreuse=g), arch)
        loads[g] = len(re.findall(r"\bld\.global(?:\.nc)?(?:\.v\d)?\.b16\b", ptx))
    assert loads[False] == loads[True] + 1, f"bf16 global loads by goreuse: {loads}"


def test_regwin_schedule_rules():
    ok = [BwdSchedule(v, t, 32, True, True, True) for v, t in ((1, 8), (2, 8), (1, 16), (2, 16))]
    for d in (128, 512):
        for s in ok:
            assert config_problems(1, d, s) == [], s
        for s in ok[2:]:
            assert config_problems(2, d, s) == [], s
    # 4*C registers of window per thread: C=32 is too many (c1 tchunks 4, c2 tchunks 8).
    for coff, s in ((1, BwdSchedule(2, 4, 32, True, True, True)),
                    (1, BwdSchedule(1, 4, 32, True, True, True)),
                    (2, BwdSchedule(2, 8, 32, True, True, True))):
        assert any("4*C = 128 registers" in p for p in config_problems(coff, 128, s)), s
    # 1024 threads per CTA do not fit 512 resident threads per SM.
    wide = BwdSchedule(2, 32, 32, True, True, True)
    assert any("divide 512" in p for p in config_problems(2, 512, wide))
    # Shared memory: partials, per-column results and the fp32 dAPE sums of the window.
    assert bwd_smem_bytes(1, BwdSchedule(2, 8, 32, True, True, True)) == 39488
    assert bwd_smem_bytes(2, BwdSchedule(2, 16, 32, True, True, True)) == 78400
    assert bwd_smem_bytes(2, BwdSchedule(1, 16, 32, True, True, True)) == 39232
    # ape=shared: the thread-private APE copy, one fp32 per window slot and column more; a
    # register-window option whose CTAs must still fit the SM's shared memory.
    aps = BwdSchedule(2, 8, 32, True, True, True, ape=ApeCopy.SHARED)
    assert bwd_smem_bytes(1, aps) == 39488 + 128 * 64 * 4 and config_problems(1, 128, aps) == []
    for staged in (BwdSchedule(2, 8, 32, True, True, ape=ApeCopy.SHARED),
                   BwdSchedule(2, 8, 32, True, True, go=GradOut.PACKED),
                   BwdSchedule(2, 8, 32, True, True, keepdp=True),
                   BwdSchedule(2, 8, 32, True, True, vsm=True)):
        assert any("needs the register window" in p for p in config_problems(1, 128, staged))
    assert aps.tag == "v2t8x32_fastexp_goreuse_regwin_ape_shared"
    # go=shared: vec 2 (a 4-byte copy), read once (no goreuse); two 4-byte slots per thread
    gs = dataclasses.replace(aps, goreuse=False, go=GradOut.SHARED)
    assert config_problems(1, 128, gs) == []
    assert gs.tag == "v2t8x32_fastexp_regwin_go_shared_ape_shared"
    assert bwd_smem_bytes(1, gs) == bwd_smem_bytes(1, aps) + 2 * 256 * 4
    for bad in (dataclasses.replace(gs, goreuse=True), dataclasses.replace(gs, vec=1)):
        assert any(p.startswith("go=shared needs vec 2") for p in
                   config_problems(1, 128, bad)), bad


def test_regwin_occupancy_matches_rows_per_cta():
    """The kernel's register cap and schedule.rows_per_cta assume the same CTAs per SM."""
    from csagate.kernels.r128_bwd import bwd_kernel

    for (coff, d), sched in REGWIN:
        op = bwd_kernel(d, coff, sched)
        gy = op.gy
        # With sm_count = gy and N = 4 * K rows, one wave of K CTAs per SM takes R = 4.
        assert rows_per_cta(4 * op.ctas_per_sm, d, coff, sched, gy) == 4, (coff, d, sched)
        assert op.ctas_per_sm * sched.threads_x * sched.tchunks == REGWIN_THREADS_PER_SM


def test_flipped_keeps_regwin():
    s = BwdSchedule(2, 8, 32, True, True, True)
    assert flipped(s, goreuse=False) == BwdSchedule(2, 8, 32, True, False, True)
    assert flipped(s, fastexp=False).regwin
