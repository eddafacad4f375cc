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
