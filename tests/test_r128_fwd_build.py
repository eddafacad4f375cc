"""CPU: every selectable ratio=128 forward kernel builds for sm_90a and sm_100a, and its PTX
has the structure the design promises (docs/KERNELS.md section 1).

No GPU is needed: the kernels are cross-compiled, ``ptxas -v`` assembles the PTX, and the
PTX is read for facts that could silently go wrong (spills, scalar instead of vector loads,
the wrong exp in the loop, a second barrier, a contracted den sum).

Besides the table kernels (vec 1, 2 and 4, unroll 2, 4 and 8, the three forms, ``prefetch``:
software-pipelined loads, checked by data flow in the PTX), ``VARIANTS`` holds their plain
twins (``kernel_variants.fwd_twin``), the bitwise oracles of the GPU tests.
"""

from __future__ import annotations

import re
from collections import Counter

import pytest
from csagate.kernels._dsl import dsl_available
from csagate.kernels.schedule import RATIO, FwdForm, FwdSchedule, config_name
from csagate.kernels.schedule import TABLE_ARCHES as ARCHES  # sm_103a: test_cache_probe
from kernel_variants import FWD_KERNELS as KERNELS
from kernel_variants import FWD_TWINS

_OK, _WHY = dsl_available()
pytestmark = pytest.mark.skipif(not _OK, reason=_WHY)

VARIANTS = list(dict.fromkeys((cfg, twin) for cfg, _, twin in FWD_TWINS
                               if (cfg, twin) not in KERNELS))
ALL = KERNELS + VARIANTS
CASES = [(arch, cfg, sched) for arch in ARCHES for cfg, sched in ALL]
IDS = [f"{arch}-{config_name(*cfg)}-{sched.tag}" for arch, cfg, sched in CASES]

_PTX: dict = {}


def ptx_for(arch: str, cfg: tuple[int, int], sched: FwdSchedule) -> str:
    """Build once per (arch, config, schedule) for the whole module."""
    key = (arch, cfg, sched)
    if key not in _PTX:
        from csagate.kernels._dsl import ptx_of
        from csagate.kernels.cache import CACHE
        from csagate.kernels.registry import make_key

        coff, d = cfg
        fn = CACHE.get(make_key("fwd", 128, coff, d, sched, arch))  # the test run's cache
        ptx = ptx_of(fn)
        assert ptx, f"no PTX retained for {key} (CUTE_DSL_KEEP must include ptx)"
        _PTX[key] = ptx
    return _PTX[key]


def ptxas_report(arch: str, ptx: str, ptxas: str) -> tuple[int, str]:
    from csagate.perf.probe import assemble

    return assemble(ptx, arch, ptxas)


L2E_LO, L2E_HI = "0f32A57060", "0f3FB8AA3B"


def exp_sites(ptx: str) -> tuple[int, int, int, int]:
    """(fast, exact, other, negated) counts of ex2.approx.ftz.f32, by its input's producer.

    fast:  y = fma.rn(x, 0f32A57060, mul.rn(x, L2E_HI));  ex2.approx.ftz(y)
    exact: cute.math.exp's reduction, whose last step is fma.rn(x, 0f32A57060, fma.rn(x,
           0f3FB8AA3B, .)) (the same LO constant, so its mere presence proves nothing).
    negated: sites whose x is a negation (oneexp's exp(-|d|)). The compiler moves that sign
           onto a constant or a neg.f32 of either product's operand; signs are tracked
           through neg.f32 and sign bits of constants, so both products must see the same x.
    """
    defs = {}
    for m in re.finditer(r"^\s*([a-z][\w.]*)\s+(%\w+),\s*([^;]*);", ptx, re.M):
        defs[m.group(2)] = (m.group(1), [a.strip() for a in m.group(3).split(",")])

    def signed(arg: str) -> tuple[int, str]:
        sign = 1
        while arg in defs and defs[arg][0] in ("neg.f32", "mov.b32"):
            op, args = defs[arg]
            sign, arg = (-sign if op == "neg.f32" else sign), args[0]
        if arg.startswith("0f") and int(arg[2:], 16) & 0x80000000:
            sign, arg = -sign, f"0f{int(arg[2:], 16) & 0x7FFFFFFF:08X}"
        return sign, arg

    def times(a: str, b: str, const: str) -> tuple[int, str] | None:
        """The signed register x of a product x * (+-const), or None."""
        (sa, ra), (sb, rb) = signed(a), signed(b)
        return (sa * sb, ra) if rb == const else None

    fast = exact = other = negated = 0
    for m in re.finditer(r"ex2\.approx\.ftz\.f32\s+%\w+,\s*(%\w+);", ptx):
        op, args = defs.get(m.group(1), ("?", []))
        x = times(args[0], args[1], L2E_LO) if op == "fma.rn.f32" and len(args) == 3 else None
        inner_op, inner = defs.get(args[2], ("?", [])) if x else ("?", [])
        if inner_op in ("mul.rn.f32", "fma.rn.f32") and times(inner[0], inner[1], L2E_HI) == x:
            fast += inner_op == "mul.rn.f32"
            exact += inner_op == "fma.rn.f32"
            negated += x[0] < 0
        else:
            other += 1
    return fast, exact, other, negated


def load_widths(ptx: str) -> Counter:
    """Bytes per global load instruction -> count (ld.global.v4.b32 = 16 B)."""
    widths = Counter()
    for tok in re.findall(r"\bld\.global[\w.:]*", ptx):
        parts = tok.split(".")
        lanes = next((int(p[1:]) for p in parts if re.fullmatch(r"v\d", p)), 1)
        widths[lanes * int(parts[-1][1:]) // 8] += 1
    return widths


def loops(ptx: str) -> list[list[str]]:
    """Each loop's body: the lines from a label to the last branch back to it."""
    lines = ptx.splitlines()
    out = []
    for i, line in enumerate(lines):
        m = re.match(r"^(\$L__BB\d+_\d+):", line)
        if not m:
            continue
        back = [j for j in range(i + 1, len(lines))
                if re.search(rf"\bbra(?:\.uni)?\s+{re.escape(m.group(1))};", lines[j])]
        if back:
            out.append(lines[i + 1:back[-1] + 1])
    return out


_MATH = re.compile(r"^(?:ex2|fma|mul|add|sub|setp|max|min|selp|div|neg|abs)\b[\w.]*\.f32\b")


def instruction(line: str) -> tuple[bool, str, str]:
    """(predicated, opcode, operands) of one PTX line; opcode '' for a blank line."""
    text = line.split("//")[0].strip().rstrip(";")
    guarded = text.startswith("@")
    if guarded:
        text = text.split(None, 1)[1] if " " in text else ""
    op, _, rest = text.partition(" ")
    return guarded, op, rest.strip()


def same_iteration_math(body: list[str]) -> list[str]:
    """fp32 math in a loop body that reads (through any chain) a load of the same pass.

    Walks the body in order (a topological order of its forward branches), tainting the
    registers a global load writes and whatever is computed from them; a def from untainted
    sources clears the taint (PTX registers are reused), a predicated one keeps it.
    """
    tainted: set[str] = set()
    hits = []
    for line in body:
        guarded, op, rest = instruction(line)
        if not op or op.startswith(("$", ".")):
            continue
        if op.startswith(("st.", "bra", "bar", "ret", "red.", "atom.")):
            continue
        if rest.startswith("{"):
            dst_text, _, src_text = rest[1:].partition("}")
        else:
            dst_text, _, src_text = rest.partition(",")
        dests = re.findall(r"%\w+", dst_text)
        srcs = re.findall(r"%\w+", src_text)
        if op.startswith("ld.global"):
            tainted.update(dests)
            continue
        hot = any(r in tainted for r in srcs)
        if hot and _MATH.match(op):
            hits.append(line.strip())
        if hot:
            tainted.update(dests)
        elif not guarded:
            tainted.difference_update(dests)
    return hits


def geometry(cfg, sched) -> dict:
    """Static facts the PTX must show: slot copies per pass, passes, loop exps, ..."""

    coff, _ = cfg
    chunk = coff * RATIO // sched.tchunks
    unroll = min(sched.unroll, chunk)
    prefetch = sched.prefetch
    groups = chunk // unroll
    # Slot copies of one pass: the unrolled loop body; with prefetch the ring loop's body and
    # the peeled last group (no loop at all when the chunk is one group). With two groups
    # the ring loop runs once and the compiler unrolls it: straight-line code.
    sites = unroll * (2 if prefetch and groups > 1 else 1)
    return dict(sites=sites, prefetch=prefetch, groups=groups, unroll=unroll,
                ring_loop=prefetch and groups > 2, straight=prefetch and groups <= 2,
                oneexp=sched.form is FwdForm.ONEEXP,
                passes=2 if _twophase(sched) else 1)


def _twophase(sched) -> bool:
    return sched.form is FwdForm.TWOPHASE


def register_cap(cfg, sched) -> int:
    """A blow-up guard, not a tuning target: 64 (upstream 32-51), plus two groups of raw
    loads (~4 registers per column-slot) with prefetch."""
    g = geometry(cfg, sched)
    cap = 64
    return cap + (4 * min(sched.unroll, g["sites"]) * sched.vec if g["prefetch"] else 0)


@pytest.mark.parametrize("arch,cfg,sched", CASES, ids=IDS)
def test_builds_without_spill_or_stack(arch, cfg, sched, ptxas):
    ptx = ptx_for(arch, cfg, sched)
    rc, out = ptxas_report(arch, ptx, ptxas)
    assert rc == 0, f"ptxas failed:\n{out}"
    regs = [int(x) for x in re.findall(r"Used (\d+) registers", out)]
    frame = re.findall(r"(\d+) bytes stack frame, (\d+) bytes spill stores, "
                       r"(\d+) bytes spill loads", out)
    assert len(regs) == 1 and len(frame) == 1, f"one kernel expected:\n{out}"
    assert frame[0] == ("0", "0", "0"), f"stack/spill stores/spill loads = {frame[0]}:\n{out}"
    cap = register_cap(cfg, sched)
    assert regs[0] <= cap, f"{regs[0]} registers > {cap} (window state must stay flat)"
    assert not re.search(r"\b(?:ld|st)\.local\b", ptx), "local memory traffic in the PTX"


@pytest.mark.parametrize("arch,cfg,sched", CASES, ids=IDS)
def test_ptx_structure(arch, cfg, sched):
    ptx = ptx_for(arch, cfg, sched)
    vec, tch, tx = sched.vec, sched.tchunks, sched.threads_x
    g = geometry(cfg, sched)
    sites, passes = g["sites"], g["passes"]

    assert f".reqntid {tx}, {tch}, 1" in ptx, "block must be .reqntid (threads_x, tchunks, 1)"
    assert len(re.findall(r"\bbar\.sync\b", ptx)) == 1, "exactly one CTA barrier (the merge)"

    # Every global load by width: 4 scalar int32 (the cuc scan, cuc[seg], cu[seg], cuc[B]);
    # 2*vec-byte bf16 loads of score and kv, 2 per slot copy online, 3 two-phase (pass A
    # reads score only); 4*vec-byte fp32 APE per slot copy and pass, in 16-byte pieces.
    # Never a narrower (scalar bf16) load. The store is one 2*vec-byte bf16 vector.
    want = Counter({4: 4})
    want[2 * vec] += (3 if _twophase(sched) else 2) * sites
    want[min(4 * vec, 16)] += passes * sites * max(1, 4 * vec // 16)
    got = load_widths(ptx)
    assert got == want, f"global loads by width {dict(got)}, want {dict(want)}"
    store = {1: r"st\.global\.b16", 2: r"st\.global\.b32", 4: r"st\.global\.v2\.b32",
             8: r"st\.global\.v4\.b32"}[vec]
    assert len(re.findall(r"\bst\.global", ptx)) == 1, "one store"
    assert len(re.findall(store, ptx)) == 1, f"one vec-wide bf16 store ({store})"
    if vec == 1:
        assert len(re.findall(r"cvt\.rn\.bf16\.f32", ptx)) == 1, "RN bf16 rounding"
    else:
        assert len(re.findall(r"cvt\.rn\.bf16x2\.f32", ptx)) == vec // 2, "RN bf16 packing"

    # Pinned rounding: den += e is add.rn (one per column per slot copy of the main loop;
    # oneexp adds the 1 + (s - s) weight of a rescaled slot, with s - s a sub.rn), the final
    # division is IEEE div.rn, the merge max is max.f32. (sm_100a also folds the bf16->fp32
    # convert of score + ape into add.rn.f32.bf16: exact, and not counted here.)
    one = vec * sites if g["oneexp"] else 0
    assert len(re.findall(r"add\.rn\.f32\s", ptx)) == vec * sites + one, (
        "den must be add.rn.f32")
    assert len(re.findall(r"sub\.rn\.f32\s", ptx)) == one, "oneexp: s - s as sub.rn.f32"
    assert len(re.findall(r"div\.rn\.f32", ptx)) == vec, "acc / den must be div.rn.f32"
    assert len(re.findall(r"\bmax\.f32", ptx)) == vec, "merge max per column"

    # Which exp where: the merge always uses the exact exp (2 per column); the main loop
    # uses exp once per slot (two-phase pass B, oneexp) or twice (online: rescale + weight).
    loop_exps = vec * sites * (1 if _twophase(sched) or g["oneexp"] else 2)
    fast, exact, other, negated = exp_sites(ptx)
    want_fast = loop_exps if sched.fastexp else 0
    want_exact = 2 * vec + (0 if sched.fastexp else loop_exps)
    assert (fast, exact, other) == (want_fast, want_exact, 0), (
        f"exp sites (fast, exact, unclassified) = {(fast, exact, other)}, "
        f"want {(want_fast, want_exact, 0)}")
    assert negated == (loop_exps if g["oneexp"] else 0), f"{negated} exp(-|x|) sites"

    # Online form rescales den and acc with mul.rn on a strict s > m; two-phase has no
    # rescale (pass A is a select-max). mul.rn count: rescale 2/column/slot online, 1 per
    # fast exp, and the merge's two mul.rn per column.
    # In straight-line code the first slot starts from the known (-inf, 0, 0): its den and
    # acc rescales are the same mul.rn(0, scale) and the compiler computes it once.
    rescale = 0 if _twophase(sched) else 2 * vec * sites - (vec if g["straight"] else 0)
    want_mul = rescale + want_fast + 2 * vec
    got_mul = len(re.findall(r"mul\.rn\.f32", ptx))
    assert got_mul == want_mul, f"mul.rn.f32 count {got_mul}, want {want_mul}"


@pytest.mark.parametrize("arch,cfg,sched", CASES, ids=IDS)
def test_prefetch_loads_run_ahead_of_the_math(arch, cfg, sched):
    """With prefetch, no fp32 math of a ring-loop iteration reads that iteration's loads (they
    feed the next one); without it, the loop's math reads the loads of its own body."""
    g = geometry(cfg, sched)
    ring = [body for body in loops(ptx_for(arch, cfg, sched))
            if any("ld.global" in x for x in body)
            and any(_MATH.match(instruction(x)[1]) for x in body)]
    if g["prefetch"]:
        assert len(ring) == (g["passes"] if g["ring_loop"] else 0), (
            f"{len(ring)} loops with loads and math, want one per pass")
        for body in ring:
            hits = same_iteration_math(body)
            assert not hits, "math waits on a load of its own iteration:\n" + "\n".join(hits[:5])
    else:
        assert ring and all(same_iteration_math(body) for body in ring), (
            "the plain loop should use its own loads (the checker would be vacuous)")


def test_every_arch_table_kernel_is_covered():
    from csagate.kernels.schedule import TABLE_ARCHES, selectable

    for arch in TABLE_ARCHES:
        assert selectable("fwd", arch) <= set(KERNELS)


def test_variants_are_new_and_valid():
    from csagate.kernels.schedule import config_problems

    kernels = [(cfg, s) for cfg, s in ALL]
    assert len(set(kernels)) == len(kernels), "a variant duplicates a table kernel"
    for (coff, d), sched in VARIANTS:
        assert not config_problems(coff, d, sched), sched.tag


def test_knobs_default_off_and_invalid_ones_are_refused():
    from csagate.kernels.r128_fwd import R128FwdKernel

    plain = R128FwdKernel(128, 1, FwdSchedule(2, 4, 32))
    assert (plain.prefetch, plain.oneexp, plain.twophase) == (False, False, False)
    with pytest.raises(ValueError, match="prefetch"):  # an online-form option
        R128FwdKernel(128, 1, FwdSchedule(4, 4, 32, True, FwdForm.TWOPHASE, prefetch=True))
    with pytest.raises(ValueError, match="prefetch"):  # a ring of 4 x 8 columns spills
        R128FwdKernel(512, 1, FwdSchedule(4, 4, 32, True, unroll=8, prefetch=True))
    with pytest.raises(ValueError, match="vec=8"):
        R128FwdKernel(512, 1, FwdSchedule(8, 4, 32))


def test_launch_with_no_rows_launches_nothing():
    torch = pytest.importorskip("torch")
    from csagate.kernels.r128_fwd import launch_fwd

    coff, d, sched = 1, 128, KERNELS[0][1]
    kv = torch.zeros(128, coff * d, dtype=torch.bfloat16)
    ape = torch.zeros(128, coff * d)
    cu = torch.tensor([0, 3], dtype=torch.int32)
    out = torch.empty(0, d, dtype=torch.bfloat16)

    def must_not_run(*args):
        raise AssertionError("launch_fwd called the kernel for N == 0")

    launch_fwd(must_not_run, sched=sched, kv=kv, score=kv, ape=ape, cu=cu, cuc=cu * 0,
               out=out)


def test_rejects_invalid_schedule():
    from csagate.kernels.r128_fwd import R128FwdKernel

    with pytest.raises(ValueError, match="straddles"):
        R128FwdKernel(128, 2, FwdSchedule(2, 1, 32))
