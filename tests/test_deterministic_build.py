"""CPU checks of the deterministic backward: the ``_det`` kernels of every
selectable backward schedule (r128: staged and regwin, both coffs; r4: both coffs) build for
every target with 0 spill / 0 stack, their PTX has no ``red.``/``atom.`` (dAPE is stored per
CTA) while the default kernels' does, and the reduction kernel builds atomic-free.
The default kernels' PTX is pinned by perf/ptx_hashes.py (unchanged by this mode).
"""

from __future__ import annotations

import dataclasses
import re
import tempfile
import types
from pathlib import Path

import pytest
from csagate.kernels import schedule as S
from csagate.kernels import small_schedule as SS
from csagate.kernels._dsl import dsl_available
from csagate.kernels.cache import CACHE
from csagate.kernels.registry import make_key

_DSL_OK, _DSL_WHY = dsl_available()
pytestmark = pytest.mark.skipif(not _DSL_OK, reason=_DSL_WHY)

ATOMIC = re.compile(r"\b(?:red|atom)\.")


def _keys(arch: str):
    keys = [make_key("bwd", 128, c, d, s, arch) for (c, d), s in S.selectable("bwd", arch)]
    r4 = SS.small_schedule("bwd", 128, ratio=4)
    keys += [make_key("bwd", 4, c, 128, r4, arch) for c in S.COFFS]
    return sorted(keys, key=lambda k: k.tag)


def _det(key):
    return dataclasses.replace(key, deterministic=True)


CASES = [(k, a) for a in S.ARCHES for k in _keys(a)]


def test_tag_suffix_and_default_off():
    for key, _ in CASES:
        assert not key.deterministic
        assert "_det" not in key.tag and _det(key).tag == key.tag + "_deterministic"
        # the mode is the key's alone: a schedule has no such field
        assert not hasattr(key.schedule, "deterministic")
        assert _det(key).schedule == key.schedule
    with pytest.raises(ValueError, match="backward mode"):
        make_key("fwd", 4, 1, 128, SS.small_schedule("fwd", 128), "sm_90a", deterministic=True)


@pytest.mark.parametrize("key,arch", CASES, ids=[f"{k.tag}-{a}" for k, a in CASES])
def test_deterministic_kernel_stores_instead_of_atomics(key, arch, ptxas):
    from csagate.perf import probe

    # through the test run's compile cache: each kernel compiles once (the probe below and the
    # other build tests reuse it)
    default = probe.main_entry(CACHE.ptx(key))  # not its dAPE zeroing kernel
    det_key = _det(key)
    det = probe.main_entry(CACHE.ptx(det_key))
    assert ATOMIC.search(default), f"{key.tag}: the default kernel's dAPE atomic is gone"
    assert not ATOMIC.search(det), f"{det_key.tag}: red./atom. in the deterministic kernel"
    # the deterministic kernel lets its reduction be scheduled early (PDL) and depends on
    # nothing; the default signals no dependent but is one (of the dAPE zeroing or the kernel
    # before it: it waits before its first load or its first atomic)
    assert det.count("griddepcontrol.launch_dependents") == 1, det_key.tag
    assert "griddepcontrol.wait" not in det, det_key.tag
    assert "griddepcontrol.launch_dependents" not in default, key.tag
    assert default.count("griddepcontrol.wait") == 2, key.tag
    # the same number of dAPE slots: every atomic became one 32-bit global store (the coff=1
    # register-window kernels at C*vec = 32 store them in a rolled loop over the window
    # positions: vec per trip)
    n_red = len(re.findall(r"\bred\.[\w.]*f32", default))
    n_st = lambda p: len(re.findall(r"\bst\.global(?:\.\w+)*\.b32", p))
    if key.ratio == 128:  # one atomic per (window position, column) of the thread's chunk
        assert n_red == key.coff * 128 // key.schedule.tchunks * key.schedule.vec
    rolled = (getattr(key.schedule, "regwin", False) and key.coff == 1
              and 128 // key.schedule.tchunks * key.schedule.vec >= 32)
    assert n_st(det) - n_st(default) == (key.schedule.vec if rolled else n_red)
    with tempfile.TemporaryDirectory() as tmp:
        row = probe.probe_one(det_key, Path(tmp), ptxas)
    assert row.clean and row.spill_st == 0 and row.spill_ld == 0 and row.stack == 0, row


def _entries(ptx: str) -> list[str]:
    """The PTX of each kernel entry, in launch order."""
    starts = [m.start() for m in re.finditer(r"\.entry\s", ptx)]
    return [ptx[a:b] for a, b in zip(starts, [*starts[1:], len(ptx)], strict=True)]


@pytest.mark.parametrize("split", [False, True], ids=["one_pass", "split"])
@pytest.mark.parametrize("arch", S.ARCHES)
def test_reduce_kernel_builds(arch, split):
    from csagate.kernels.reduce import DEPTHS, WARPS
    from csagate.kernels.registry import ReduceKey

    ptx = CACHE.ptx(ReduceKey(arch, split=split))  # the reduction compiles through the cache
    assert ptx and not ATOMIC.search(ptx)
    kernels = _entries(ptx)
    assert len(kernels) == (2 if split else 1)  # split: the groups' pass, then the stage rows'
    sixteen = {"v4.b32", "v2.b64"}  # the same 16 bytes, as the arch's compiler spells them
    for i, body in enumerate(kernels):
        # 16-byte accesses only (VEC = 4 elements a lane): one slice load per lane for each
        # group size in DEPTHS (the groups' loads are issued together), one in the remainder
        # loop, and the output's previous value
        loads = re.findall(r"\bld\.global\.(v\d\.b\d+)", body)
        assert len(loads) == sum(DEPTHS) + 2 and set(loads) <= sixteen, loads
        stores = re.findall(r"\bst\.global\.(v\d\.b\d+)", body)
        assert len(stores) == 1 and set(stores) <= sixteen, stores
        assert len(re.findall(r"\b(?:ld|st)\.global", body)) == sum(DEPTHS) + 3  # none narrower
        first_group = body[:body.index("add.rn.f32")]  # the widest group: all loads, then adds
        assert len(re.findall(r"\bld\.global", first_group)) == DEPTHS[0]
        # a programmatic dependent: it waits for the kernel before it ahead of any load; the
        # first of two lets the second be scheduled early
        assert body.count("griddepcontrol.wait") == 1
        assert body.index("griddepcontrol.wait") < body.index("ld.global")
        assert body.count("griddepcontrol.launch_dependents") == (split and i == 0)
        # WARPS chains per element, combined in a fixed order through shared memory
        assert len(re.findall(r"\bbar\.sync\b", body)) == 1
        assert len(re.findall(r"\bld\.shared", body)) == WARPS
        assert not re.search(r"\bfma\.", body), "sums must not contract into FMAs"


def test_reduce_groups_rule():
    """The split form's groups: a function of the slice count and width alone, at least two
    groups of GROUP_MIN_SLICES slices where taken, about SPLIT_CTAS CTAs in the first pass."""
    from csagate.kernels import reduce as RD

    for n in (4, 512, 1024, 2048, 16384, 131072):
        blocks = -(-n // RD.SPAN)
        for n_parts in (1, 7, 64, RD.SPLIT_MIN_SLICES, RD.SPLIT_MIN_SLICES + 1, 300, 512,
                        2048, 8192, 100_000):
            g = RD.groups(n_parts, n)
            assert RD.partial_rows(n_parts, n) == n_parts + g
            if n_parts <= RD.SPLIT_MIN_SLICES:
                assert g == 0
                continue
            assert 2 <= g <= -(-n_parts // RD.GROUP_MIN_SLICES)
            assert g * blocks < RD.SPLIT_CTAS + blocks or g == 2
            per = -(-n_parts // g)  # the first pass's slices per group (the last may be short)
            assert (g - 1) * per < n_parts


def test_sweep_refuses_a_candidate_whose_deterministic_form_spills(monkeypatch):
    """The sweep's probe step (perf.bench.probe_problem) judges a backward candidate by its
    deterministic form too: the api derives that form from whatever the table ships."""
    from csagate.perf import bench, probe

    sched = S.BwdSchedule(2, 8, 32, True, False, regwin=True, vsm=True)

    def fake_probe(key, ptx_dir, ptxas):
        det = key.deterministic
        return types.SimpleNamespace(clean=not det, note="spills 8/8 B" if det else "")

    monkeypatch.setattr(probe, "probe_one", fake_probe)
    note = bench.probe_problem("bwd", 1, 128, sched, "sm_90a", Path("."), "ptxas")
    assert note.startswith("probe (deterministic form): spills"), note
    monkeypatch.setattr(probe, "probe_one",
                        lambda key, ptx_dir, ptxas: types.SimpleNamespace(clean=True, note=""))
    assert bench.probe_problem("bwd", 1, 128, sched, "sm_90a", Path("."), "ptxas") == ""
