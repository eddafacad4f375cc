"""The ratio=128 dispatch tables: boundaries, validity, enumeration, rows per CTA."""

import dataclasses
import itertools

import pytest
from csagate.kernels import schedule as S

FWD_EXPECTED = {  # the upstream test's hardcoded selections, (vec, tchunks, thr_x, 2ph, fexp)
    (1, 128, 64): (2, 8, 32, False, False), (1, 128, 256): (2, 4, 32, False, False),
    (1, 128, 1024): (4, 4, 32, True, True), (2, 128, 64): (2, 16, 32, False, True),
    (2, 128, 256): (2, 8, 32, False, True), (1, 512, 256): (2, 4, 32, False, False),
    (1, 512, 1024): (4, 4, 32, False, True), (2, 512, 64): (2, 8, 32, False, True),
    (2, 512, 256): (4, 4, 32, False, False), (2, 512, 1024): (4, 4, 32, False, True),
}
BWD_EXPECTED = {  # (vec, tchunks, thr_x, fexp, goreuse)
    (1, 128, 64): (1, 8, 32, False, True), (1, 128, 256): (2, 8, 32, True, False),
    (2, 128, 64): (1, 8, 32, False, True), (2, 128, 256): (2, 8, 32, True, True),
    (1, 512, 256): (2, 4, 32, True, True), (2, 512, 64): (2, 8, 32, True, True),
    (2, 512, 256): (2, 8, 32, True, True),
}


@pytest.mark.parametrize("key", sorted(FWD_EXPECTED))
def test_forward_selection(key):
    assert S.select_fwd(*key).astuple() == FWD_EXPECTED[key]


@pytest.mark.parametrize("key", sorted(BWD_EXPECTED))
def test_backward_selection(key):
    assert S.select_bwd(*key).astuple() == BWD_EXPECTED[key]


@pytest.mark.parametrize("coff,d", S.CONFIGS)
def test_bucket_boundaries(coff, d):
    f = lambda n: S.select_fwd(coff, d, n)
    assert (f(128) != f(129)) == ((coff, d) in S.FWD_SMALL)
    assert f(129) == f(1023)
    assert (f(1024) != f(1023)) == ((coff, d) in S.FWD_LARGE)
    b = lambda n: S.select_bwd(coff, d, n)
    assert (b(192) != b(193)) == ((coff, d) in S.BWD_SMALL)
    assert b(193) == b(1 << 20)


@pytest.mark.parametrize("arch", S.TABLE_ARCHES)
def test_every_entry_is_valid_and_enumeration_matches_tables(arch):
    for tables, kind in ((S.FWD_TABLES[arch], "fwd"), (S.BWD_TABLES[arch], "bwd")):
        listed = {(cfg, sched) for t in tables.values() for cfg, sched in t.items()}
        for (coff, d), sched in listed:
            assert S.config_problems(coff, d, sched) == [], (coff, d, sched)
        assert S.selectable(kind, arch) == listed
    # upstream: 10 + 6 distinct kernels; a table may map two buckets to one kernel
    assert len(S.selectable("fwd", arch)) <= 10 and len(S.selectable("bwd", arch)) <= 6
    if arch == S.UPSTREAM_ARCH:
        assert len(S.selectable("fwd", arch)) == 10 and len(S.selectable("bwd", arch)) == 6


def test_arch_tables_share_the_bucket_structure():
    for tables in (S.FWD_TABLES, S.BWD_TABLES):
        shapes = {arch: {b: set(t) for b, t in tables[arch].items()} for arch in S.TABLE_ARCHES}
        assert shapes["sm_90a"] == shapes["sm_100a"]
    with pytest.raises(ValueError, match="no ratio=128 tables"):
        S.select_fwd(1, 128, 64, "sm_80")


def test_validity_predicate_rejects():
    bad = S.FwdSchedule(3, 4, 32)
    assert "vec=3 is not one of" in S.config_problems(1, 128, bad)[0]
    straddle = S.FwdSchedule(2, 3, 32)                        # 256 % 3 != 0
    assert any("window" in p for p in S.config_problems(2, 128, straddle))
    half = S.FwdSchedule(2, 64, 32)                           # 2048 threads
    assert any("exceed" in p for p in S.config_problems(2, 512, half))
    wide = S.BwdSchedule(4, 8, 32, True, True)
    assert any("vec=4" in p for p in S.config_problems(2, 512, wide))
    with pytest.raises(ValueError, match="validated for head_dim"):
        S.select_fwd(1, 96, 64)


def test_smem_formula_matches_upstream_table():
    got = {cfg: S.bwd_smem_bytes(cfg[0], s) for cfg, s in S.BWD_DEFAULT.items()}
    assert got == {(1, 128): 55872, (2, 128): 105024, (1, 512): 52800, (2, 512): 105024}
    assert S.bwd_smem_bytes(1, S.BWD_SMALL[(1, 128)]) == 27968


def test_rows_per_cta_fills_one_wave():
    sched = S.select_bwd(1, 128, 1024)
    assert S.rows_per_cta(1024, 128, 1, sched, 148) == 5    # B200
    assert S.rows_per_cta(1024, 128, 1, sched, 132) == 6    # H200
    assert S.rows_per_cta(1, 128, 1, sched, 132) == 1
    assert S.rows_per_cta(10**6, 512, 2, S.select_bwd(2, 512, 10**6), 132) == 16


def test_register_window_rows_per_cta_fills_one_wave():
    """1024 rows, gy = 4 column slices, 132 SMs, 512-thread CTAs: one CTA per SM, 33 per
    slice, 32 rows each."""
    rw = S.BwdSchedule(1, 16, 32, True, True, True)
    assert S.rows_per_cta(1024, 128, 1, rw, 132) == 32
    assert any("do not divide 512" in p for p in S.config_problems(
        1, 128, S.BwdSchedule(1, 32, 32, True, True, True)))


def _space(direction):
    return [((coff, d), s) for coff, d in S.CONFIGS for s in S.schedule_space(direction, coff, d)]


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_tags_are_injective_over_the_space(direction):
    """Two different schedules of one config never share a tag, so a tag names a kernel
    (the deterministic mode is the key's: KernelKey.tag)."""
    space = _space(direction)
    scheds = {s for _, s in space}
    by_tag = {}
    for s in scheds:
        assert by_tag.setdefault(s.tag, s) == s, (s, by_tag[s.tag])


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_tags_are_derived_from_the_fields(direction):
    """A field off its default shows in the tag under its own name."""
    for _, s in _space(direction):
        for f in dataclasses.fields(s):
            if f.name not in S.GEOMETRY and getattr(s, f.name) != f.default:
                assert any(p.startswith(f.name) for p in s.tag.split("_")), (f.name, s.tag)


@pytest.mark.parametrize("arch", S.TABLE_ARCHES)
def test_every_table_entry_is_in_the_space(arch):
    for direction in ("fwd", "bwd"):
        space = set(_space(direction))
        assert S.selectable(direction, arch) <= space


def test_every_option_value_is_shipped():
    """Each value of each field of the space is selected by some table entry (the kernels
    carry what ships), except tchunks values the sweep may try."""
    for direction, space in (("fwd", S.FWD_SPACE), ("bwd", S.BWD_SPACE)):
        shipped = [s for _, s in S.selectable_any(direction)]
        for name, values in space.items():
            if name != "tchunks":
                assert {getattr(s, name) for s in shipped} == set(values), (direction, name)


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_nested_options_exist_only_under_their_parent(direction):
    """An option whose rule fails is a problem naming it, and ``restrict`` drops exactly it."""
    needs = S.FWD_NEEDS if direction == "fwd" else S.BWD_NEEDS
    space = S.FWD_SPACE if direction == "fwd" else S.BWD_SPACE
    cls = S.FwdSchedule if direction == "fwd" else S.BwdSchedule
    checked = set()
    for values in itertools.product(*space.values()):
        kw = dict(zip(space, values))
        sched = cls(threads_x=S.threads_x_for(128, kw["vec"]), **kw)
        for n in needs:
            default = next(f.default for f in dataclasses.fields(sched) if f.name == n.field)
            if getattr(sched, n.field) != default and not n.ok(sched):
                assert any(p.startswith(f"{n.field}=") for p in S.config_problems(1, 128, sched))
                assert getattr(S.restrict(sched), n.field) == default
                checked.add(n)
    assert checked == set(needs)
