"""The case table is the contract's: 21 named cases in order, kinds, seeds, coverage."""

from collections import Counter

from csagate.gates.cases import CASES, DRIFT, EDGEPACK, RAGGED3
from csagate.kernels import schedule as S


def test_twenty_one_named_cases_in_contract_order():
    assert len(CASES) == 21
    assert len({c.name for c in CASES}) == 21 and DRIFT.name not in {c.name for c in CASES}
    kinds = [c.kind for c in CASES]
    assert Counter(kinds) == {"union": 15, "scaled": 1, "padding": 4, "overflow": 1}
    # union first, then scaled, then padding, then overflow
    assert kinds == sorted(kinds, key=["union", "scaled", "padding", "overflow"].index)
    union = [(c.config, c.lens) for c in CASES if c.kind == "union"]
    assert union == [
        ("c1d128", (8192,)), ("c1d128", (8192,) * 3), ("c1d128", RAGGED3), ("c1d128", EDGEPACK),
        ("c1d128", (65536,)), ("c1d128", (131072,)),
        ("c2d128", (8192,)), ("c2d128", EDGEPACK), ("c2d128", (65536,)),
        ("c1d512", (8192,)), ("c1d512", (65536,)), ("c1d512", (131072,)),
        ("c2d512", (8192,)), ("c2d512", (65536,)), ("c2d512", (131072,)),
    ]
    padding = [(c.config, c.pad_rows, c.pad_tokens, c.lens) for c in CASES if c.kind == "padding"]
    assert padding == [("c1d512", 8, 37, RAGGED3), ("c2d512", 8, 21, RAGGED3),
                       ("c1d128", 5, 37, RAGGED3), ("c2d128", 5, 21, RAGGED3)]


def test_seeds_and_scale_as_documented():
    for c in CASES:
        assert c.input_seed == 1234 and c.ratio == 128
        if c.kind == "padding":
            assert (c.grad_seed, c.pad_seed) == (11, 13)
        else:
            assert c.grad_seed == 7
    scaled = [c for c in CASES if c.kind == "scaled"]
    assert [(c.config, c.lens, c.scale) for c in scaled] == [("c2d128", (8192,), 64.0)]
    over = [c for c in CASES if c.kind == "overflow"][0]
    assert (over.config, over.lens) == ("c1d128", (128,))
    assert (DRIFT.ratio, DRIFT.coff, DRIFT.d, DRIFT.lens) == (4, 2, 128, (2048,))


def test_cases_cover_every_selectable_kernel_of_every_arch():
    for arch in S.TABLE_ARCHES:
        for direction, select in (("fwd", S.select_fwd), ("bwd", S.select_bwd)):
            chosen = {((c.coff, c.d), select(c.coff, c.d, c.rows, arch)) for c in CASES}
            assert chosen == S.selectable(direction, arch), (arch, direction)


def test_three_hardening_cases_after_the_21():
    from csagate.gates.cases import DETERMINISTIC, HARDENING
    from csagate.gates.contracts import R128

    assert R128.all_cases == CASES + HARDENING + DETERMINISTIC
    assert [(c.config, c.lens, c.inputs, c.kind) for c in HARDENING] == [
        ("c2d128", RAGGED3, "partial_overflow", "hardening"),
        ("c1d512", RAGGED3, "partial_overflow", "hardening"),
        ("c2d128", EDGEPACK, "pad_nonfinite", "hardening"),
    ]
    pad = HARDENING[2]
    assert (pad.pad_rows, pad.pad_tokens, pad.grad_seed) == (5, 21, 11)
    assert EDGEPACK[0] < pad.ratio   # segment 0 is read by the padding rows only
    assert {c.name for c in HARDENING}.isdisjoint(c.name for c in CASES)


def test_r4_cases_are_the_contracts():
    from csagate.gates.cases import R4_CASES, R4_DETERMINISTIC, SHORT4
    from csagate.gates.contracts import R4

    assert R4.all_cases == R4_CASES + R4_DETERMINISTIC
    assert all(c.ratio == 4 and c.name.startswith("r4/") for c in R4_CASES)
    union = [(c.config, c.lens) for c in R4_CASES if c.kind == "union"]
    for config in ("c1d128", "c2d128", "c1d512", "c2d512"):
        for lens in ((8192,), RAGGED3, EDGEPACK):
            assert (config, lens) in union
    assert [u for u in union if u[1] == (65536,)] == [("c2d128", (65536,)),
                                                      ("c2d512", (65536,))]
    # beyond the table configs: an odd head dim and one not a multiple of 32, both coffs
    beyond = {(c.coff, c.d) for c in R4_CASES if c.d not in (128, 512)}
    assert any(d % 2 for _, d in beyond) and any(d % 32 and not d % 2 for _, d in beyond)
    assert {coff for coff, _ in beyond} == {1, 2}
    padding = [(c.config, c.lens, c.pad_rows, c.pad_tokens) for c in R4_CASES
               if c.kind == "padding"]
    assert padding == [("c2d128", RAGGED3, 8, 21), ("c1d512", SHORT4, 8, 37)]
    assert SHORT4[0] < 4    # the padding rows read across the first segment's boundary
    kinds = {c.kind: c for c in R4_CASES}
    assert kinds["overflow"].inputs == "overflow" and kinds["overflow"].lens == (128,)
    assert kinds["partial-overflow"].inputs == "partial_overflow"
    assert len({c.name for c in R4_CASES}) == len(R4_CASES)


def test_case_names_are_unique_across_both_contracts():
    from csagate.gates.cases import (
        DETERMINISTIC,
        DRIFT,
        HARDENING,
        R4_CASES,
        R4_DETERMINISTIC,
        case_by_name,
    )

    names = [c.name for c in (DRIFT, *CASES, *HARDENING, *R4_CASES, *DETERMINISTIC,
                              *R4_DETERMINISTIC)]
    assert len(names) == len(set(names))
    assert case_by_name("r4/c2d128/ragged3/partial-overflow").ratio == 4


def test_deterministic_cases():
    """CONTRACT.md 2.5: ratio=128 one per config on a ragged/edge pack, ratio=4 two; each runs
    the backward with deterministic=True (G1 then covers dAPE too)."""
    from csagate.gates.cases import DETERMINISTIC, R4_DETERMINISTIC, case_by_name

    assert {c.config for c in DETERMINISTIC} == {"c1d128", "c2d128", "c1d512", "c2d512"}
    assert len(DETERMINISTIC) == 4 and len(R4_DETERMINISTIC) == 2
    assert {c.coff for c in R4_DETERMINISTIC} == {1, 2}
    for c in DETERMINISTIC + R4_DETERMINISTIC:
        assert c.deterministic and c.kind == "deterministic" and c.inputs == "random"
        assert c.lens in (RAGGED3, EDGEPACK) and c.name.endswith("/deterministic")
        assert case_by_name(c.name) == c
    assert not any(c.deterministic for c in CASES)


# --- the other small ratios (2, 8, 16, 32) -------------------------------------------------


def _small_contracts():
    from csagate.gates.contracts import CONTRACTS

    return {r: k for r, k in CONTRACTS.items() if r not in (4, 128)}


def test_every_small_ratio_has_a_contract_of_its_own():
    from csagate.gates.contracts import CONTRACTS, R4
    from csagate.kernels import registry

    assert set(CONTRACTS) == set(registry.RATIOS)
    for ratio, k in _small_contracts().items():
        assert k.ratio == ratio and k.drift == DRIFT and not k.hardening and not k.edges
        assert k.coverage_configs == R4.coverage_configs
        # the ratio=4 rules (the forward's rate and noise floor follow each case's window)
        assert k.g2 == R4.g2
        assert all(c.ratio == ratio and c.name.startswith(f"r{ratio}/") for c in k.all_cases)


def test_small_ratio_cases_hold_every_edge():
    """Ragged packs with tails, empty and short segments, exact multiples, capacity padding
    with a first segment shorter than ratio, overflow, partial overflow, scaled inputs and a
    coff=1 zero-APE case: at each small ratio, by the packs' own arithmetic."""
    for ratio, k in _small_contracts().items():
        kinds = Counter(c.kind for c in k.all_cases)
        assert {"union", "padding", "overflow", "partial-overflow", "scaled", "zero-ape",
                "deterministic"} <= set(kinds), (ratio, kinds)
        lens = [n for c in k.all_cases for n in c.lens]
        assert any(n % ratio for n in lens), ratio          # tails
        assert 0 in lens, ratio                             # an empty segment
        assert any(0 < n < ratio for n in lens), ratio      # a segment with no block
        assert any(n and n % ratio == 0 for n in lens)      # an exact multiple
        pads = [c for c in k.cases if c.kind == "padding"]
        assert any(c.lens[0] < ratio for c in pads) and all(c.pad_rows and c.pad_tokens
                                                            for c in pads)
        zero = [c for c in k.cases if c.kind == "zero-ape"]
        assert zero and all(c.coff == 1 and c.inputs == "zero_ape" for c in zero)
        scaled = [c for c in k.cases if c.kind == "scaled"]
        assert [c.scale for c in scaled] == [64.0]
        twin = [c for c in k.cases if c.kind == "union" and (c.coff, c.d, c.lens) ==
                (scaled[0].coff, scaled[0].d, scaled[0].lens)]
        assert twin, "the scaled case needs a unit-scale twin"
        det = [c for c in k.all_cases if c.deterministic]
        assert {c.coff for c in det} == {1, 2} and det == list(k.deterministic_cases)
        assert len({c.name for c in k.all_cases}) == len(k.all_cases)


def test_small_ratio_cases_cover_their_tables():
    """Coverage through the tables: the cases of each small ratio select every kernel the
    registry builds for the contract's four configs, in both directions, on every arch."""
    from csagate.kernels import registry

    for ratio, k in _small_contracts().items():
        for arch in S.ARCHES:
            for direction in ("fwd", "bwd"):
                fam = registry.family(ratio, direction)
                expected = {(cfg, fam.select(*cfg, 1, arch)) for cfg in k.coverage_configs}
                chosen = {((c.coff, c.d), fam.select(c.coff, c.d, c.rows, arch))
                          for c in k.all_cases}
                assert expected <= chosen, (ratio, arch, direction)


def test_csa2_case_and_names_resolve():
    from csagate.gates.cases import case_by_name

    csa2 = case_by_name("r2/c1d128/1x32768/zero-ape")
    assert (csa2.ratio, csa2.coff, csa2.inputs, csa2.rows) == (2, 1, "zero_ape", 16384)
    for k in _small_contracts().values():
        for c in k.all_cases:
            assert case_by_name(c.name) == c


def _partial_last_fwd_cta(case, arch) -> bool:
    """Whether the case's forward has a last CTA whose column groups do not fill its threads."""
    from csagate.kernels.small_schedule import small_schedule

    sched = small_schedule("fwd", case.d, ratio=case.ratio, coff=case.coff, arch=arch)
    return (case.d // sched.vec) % sched.threads != 0


def test_small_ratio_cases_reach_head_dims_that_are_not_a_multiple_of_32():
    """Every small ratio has a case at a head dim that is not a multiple of 32; ratios 4 and 32
    one whose forward's last CTA is partial on every arch (a guard that rounded down would skip
    its columns); ratio 32 a small head dim (<= 64) at its 64-position window; every such
    config is one the kernels accept (small_schedule.check_config, validate.check_support)."""
    import torch
    from csagate.gates.contracts import CONTRACTS
    from csagate.kernels import validate
    from csagate.kernels.registry import has_tables
    from csagate.kernels.small_schedule import MAX_WINDOW, check_config

    for ratio, k in CONTRACTS.items():
        if has_tables(ratio):
            continue
        odd = [c for c in k.all_cases if c.d % 32]
        assert odd, ratio
        if ratio in (4, 32):
            for arch in S.ARCHES:
                assert any(_partial_last_fwd_cta(c, arch) for c in odd), (ratio, arch)
        if 2 * ratio == MAX_WINDOW:
            assert any(c.coff == 2 and c.d <= 64 for c in odd)
        for c in odd:
            check_config(ratio, c.coff, c.d)
            meta = {"device": "meta"}
            kv = torch.empty(c.tokens, c.coff * c.d, dtype=torch.bfloat16, **meta)
            cu = torch.empty(len(c.lens) + 1, dtype=torch.int32, **meta)
            validate.check_support(kv, kv, torch.empty(ratio, c.coff * c.d, **meta), cu, cu,
                                   torch.empty(c.rows, c.d, dtype=torch.bfloat16, **meta),
                                   ratio=ratio, coff=c.coff, devices=False)
