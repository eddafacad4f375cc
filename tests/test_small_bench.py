"""CPU checks of the small-ratio bench: its shapes, its bytes, its table, its usage errors."""

from click.testing import CliRunner
from csagate.perf import bench, small_bench

from csagate.cli import cli


def test_shapes_cover_every_config_short_and_long():
    for ratio, shapes in small_bench.SHAPES.items():
        assert {(c, d) for _, c, d, _ in shapes} == set(small_bench.CONFIGS)
        assert {t for *_, t in shapes} == {8192, 131072}
        assert all(r == ratio for r, *_ in shapes)


def test_op_bytes_count_the_ape_of_the_ratio():
    base = bench.op_bytes("bwd", coff=2, d=128, n_tokens=8192, n_rows=4096, ratio=2)
    other = bench.op_bytes("bwd", coff=2, d=128, n_tokens=8192, n_rows=4096, ratio=4)
    assert other - base == 2 * 2 * 256 * 4  # two more APE rows, read once and written once


def test_small_table_renders_cold_and_copy_columns():
    from csagate.commands.bench import small_table

    row = bench.ShapeRow("r2 c1d128", 8192, 4096, "r2fwd_c1d128_v2", "r2bwd_c1d128_v1r8",
                         fused_fwd_cold_us=10.0, fused_bwd_cold_us=20.0,
                         fwd_bytes=4_000_000, bwd_bytes=8_000_000, copy_bw=4e12,
                         copy_fwd_cold_us=8.0, copy_bwd_cold_us=16.0)
    table = small_table([row], 4e12)
    cells = [list(c.cells) for c in table.columns]
    assert cells[2] == ["v2"] and cells[7] == ["v1r8"]
    assert cells[5] == ["10%"] and cells[6] == ["80%"]   # 4 MB in 10 us of 4 TB/s; copy 8/10


def test_ratio128_only_options_are_usage_errors():
    r = CliRunner().invoke(cli, ["bench", "--ratio", "2", "--ab", "goreuse"])
    assert r.exit_code == 2 and "ratio=128 options" in r.output


def _vec_row(us, equal=(True, True, True)):
    return small_bench.FormABRow("bwd", "r4 c1d128", 131072, 400_000_000, 4e12,
                                 ("v1r8", "v2r8", "v4r8"), us, equal)


def test_form_ab_names_a_vector_form_only_when_it_wins_both_orders():
    win = _vec_row(((100.0, 101.0), (80.0, 81.0), (90.0, 89.0)))
    assert win.fastest == "v2r8" and win.wins(1) and win.wins(2)
    split = _vec_row(((100.0, 100.0), (90.0, 101.0), (99.8, 99.9)))  # loses order 2
    assert split.fastest == "v1r8 (tie)" and not split.wins(1)
    slower = _vec_row(((100.0, 100.0), (110.0, 111.0), (120.0, 121.0)))
    assert slower.fastest == "v1r8"
    line = win.line()
    assert "v2r8   80.5 (80.0/81.0) 124%" in line and "fastest v2r8" in line


def test_form_ab_never_times_or_picks_a_form_whose_bits_differ():
    row = _vec_row(((100.0, 100.0), (0.0, 0.0), (90.0, 90.0)), equal=(True, False, True))
    assert row.fastest == "v4r8" and not row.wins(1)
    assert "v2r8 BITS DIFFER" in row.line()


def test_form_ab_shapes_are_ratios_2_and_4_long_and_short():
    shapes = small_bench.AB_SHAPES
    assert {(r, c, d) for r, c, d, _ in shapes} == {
        (r, c, d) for r in (2, 4) for c, d in small_bench.CONFIGS}
    assert {t for _, _, d, t in shapes if d == 512} == {65536, 8192}
    assert {t for _, _, d, t in shapes if d == 128} == {131072, 8192}


def test_form_ab_shapes_of_other_ratios_are_the_configs_they_serve():
    from csagate.kernels import small_schedule as SS

    for ratio in (8, 16, 32):
        got = {(c, d) for _, c, d, _ in small_bench.ab_shapes((ratio,))}
        assert got == {(c, d) for c, d in small_bench.CONFIGS
                       if not SS.config_problems(ratio, c, d)}
        assert got


def test_form_ab_entry_refuses_without_a_gpu_or_the_flag(capsys):
    import pytest
    import torch

    with pytest.raises(SystemExit) as exc:
        small_bench.main([])
    assert exc.value.code == 2
    if not torch.cuda.is_available():
        assert small_bench.main(["--ab-forms", "all"]) == 3
        assert "needs a CUDA GPU" in capsys.readouterr().err


def test_backward_forms_list_the_rule_then_its_aim_where_the_waves_moved_it():
    """forms_of: the rule's rows (with the GPU's occupancy) first, the IEEE twin second, the
    aim third only where the rule moved it; no (form, rows) twice."""
    from csagate.kernels import small_schedule as SS

    n = 16384  # r16 c2d128 at 262144 tokens: 512 CTAs, 0.78 of 660 resident
    plain = small_bench.forms_of("bwd", 16, 2, 128, n, "sm_90a")
    waves = small_bench.forms_of("bwd", 16, 2, 128, n, "sm_90a", 132, 5)
    table = SS.small_schedule("bwd", 128, ratio=16, coff=2, arch="sm_90a")
    rule = SS.bwd_rows_per_cta(n, 128, 2, table, 132, 5)
    aim = SS.bwd_rows_per_cta(n, 128, 2, table)
    assert rule != aim
    tags = list(waves)
    assert tags[0] == f"{table.tag} rule {rule}" and tags[1].startswith(f"{table.tag}_div rule")
    assert tags[2] == f"{table.tag} aim {aim}" and not any(" aim " in t for t in plain)
    assert len(set(waves.values())) == len(waves)


def test_stage_twins_are_the_table_form_staged_at_the_rule_and_twice():
    """--stages: the table's backward as each staged form it can build, at the rule's rows and
    at twice them (at most the schedule's); a one-column form has none."""
    import dataclasses

    from csagate.kernels import small_schedule as SS

    table = dataclasses.replace(SS.small_schedule("bwd", 128, ratio=4, coff=2, arch="sm_90a"),
                                stages=0, prefetch=True)
    twins = small_bench.stage_twins(4, 2, 128, table, 32)
    assert {(s.stages, s.prefetch, s.vec, r) for s, r in twins.values()} == {
        (st, False, table.vec, r) for st in SS.BWD_STAGES for r in (32, 64)}
    assert small_bench.stage_twins(4, 2, 128, table, 64).keys() == {
        f"{dataclasses.replace(table, stages=st, prefetch=False).tag} 64"
        for st in SS.BWD_STAGES}
    one = SS.small_schedule("bwd", 128, ratio=16, coff=2, arch="sm_90a")
    assert one.vec == 1 and small_bench.stage_twins(16, 2, 128, one, 8) == {}


def test_rows_sweep_row_names_the_best_and_the_rule_against_the_aim():
    row = small_bench.RowsSweepRow("r4 c1d128", 131072, 640, 1, 32768, 64, 52, (48, 52, 64),
                                   ((50.0, 52.0), (48.0, 49.0), (52.0, 53.0)))
    assert row.best == 52 and row.mean_us(64) == 52.5
    line = row.line()
    assert "aim 64 52.5" in line and "rule 52 48.5 (-7.6%)" in line and "52:631 48.5" in line
