"""The PDL A/B tool's pure parts (perf/pdl_ab.py): its shapes, its verdict, its line."""

from dataclasses import replace

from csagate.perf import pdl_ab as P


def test_default_shapes_are_the_large_ones_then_8192_tokens():
    shapes = P.default_shapes()
    assert len(shapes) == len(set(shapes)) == 8
    assert shapes[:4] == list(P.LARGE)
    assert {(c, d) for c, d, t in shapes[4:]} == {(c, d) for c, d, _ in P.LARGE}
    assert all(t == 8192 for _, _, t in shapes[4:])


def test_a_row_passes_on_same_bits_and_atomic_noise_only():
    row = P.PdlRow("c1d128:8192", "v1t16x32_fexp_rw_ks", True, 4.8e-7, (11.1, 11.2),
                   (12.6, 12.5), (6.80, 6.81), (7.73, 7.78))
    assert row.ok
    assert not replace(row, bits_equal=False).ok
    assert not replace(row, dape_diff=1e-3).ok
    line = P.format_row(row)
    assert "12.60 ->   11.10 /   12.50 ->   11.20" in line
    assert "7.73 ->    6.80" in line and "same bits" in line
    assert "DIFFERENT" in P.format_row(replace(row, bits_equal=False))
