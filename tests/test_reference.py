"""The reference against its scalar derivation (``reference.scalar``), and hand-checked facts."""

from __future__ import annotations

import math

import csagate.reference as R
import pytest
import torch
from csagate.reference.scalar import agreement, check_oracle, derive

FAMILIES = [
    # (lens, ratio, coff, d, pad_rows, pad_tokens)
    ((16,), 4, 1, 3, 0, 0),
    ((16,), 4, 2, 3, 0, 0),
    ((9, 0, 13, 3, 8), 4, 1, 2, 0, 0),          # tails, empty and short segments
    ((9, 0, 13, 3, 8), 4, 2, 2, 2, 5),          # + capacity rows and token padding
    ((5, 4, 11), 4, 2, 5, 3, 0),                # odd d, first-block rule per segment
    ((300, 129, 0, 127), 128, 1, 2, 1, 3),      # ratio 128: tails, empty, short
    ((300, 129, 0, 127), 128, 2, 2, 2, 7),
]


@pytest.mark.parametrize("lens,ratio,coff,d,pad_rows,pad_tokens", FAMILIES)
def test_oracle_agrees_with_its_scalar_derivation(lens, ratio, coff, d, pad_rows, pad_tokens):
    """The fp64 oracle against ``reference.scalar`` (one row and column at a time, from the
    contract's table), and the fp32 reference within bf16 rounding of both."""
    pack = R.make_pack(lens, ratio=ratio, coff=coff, d=d, pad_rows=pad_rows,
                       pad_tokens=pad_tokens)
    go = R.make_grad_out(pack.n_rows, d)
    derived = derive(*pack.inputs(), go, ratio=ratio, coff=coff)
    want = [torch.tensor(getattr(derived, n), dtype=torch.float64).reshape(-1, w)
            for n, w in (("out", d), ("dkv", coff * d), ("dscore", coff * d),
                         ("dape", coff * d))]
    got = R.backward(*pack.inputs(), go, ratio=ratio, coff=coff, precision="fp64")
    found = agreement(got, derived)
    assert found.ok, found.summary()
    for name, g, w in zip(("out", "dkv", "dscore", "dape"), (got.out, got.dkv, got.dscore,
                                                              got.dape), want):
        assert g.dtype == torch.float64, name
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12, msg=name)
    f32 = R.backward(*pack.inputs(), go, ratio=ratio, coff=coff, precision="fp32")
    # fp32 vs fp64 agree to bf16 rounding: out within one bf16 step of the oracle.
    step = torch.finfo(torch.bfloat16).eps * want[0].abs().clamp_min(2.0**-8)
    assert ((f32.out.double() - want[0]).abs() <= step).all()
    torch.testing.assert_close(f32.dkv.double(), want[1], rtol=2**-7, atol=1e-6)
    torch.testing.assert_close(f32.dscore.double(), want[2], rtol=2**-7, atol=1e-5)
    torch.testing.assert_close(f32.dape.double(), want[3], rtol=1e-4, atol=1e-5)


def test_the_scalar_derivation_sees_a_slot_the_oracle_gets_wrong(monkeypatch):
    """Independent in form: a geometry slip shared by the fp32 reference and the oracle (an
    APE row off by one) makes them disagree with it."""
    from csagate.reference import compressor

    real = compressor._slots

    def shifted(cu, cuc, n_rows, ratio, coff):
        s = real(cu, cuc, n_rows, ratio, coff)
        return compressor._Slots(s.token, s.valid, s.half, (s.ape_row + 1) % ratio)

    assert check_oracle(4, 2, 3, (9, 0, 13, 3, 8), 2, 5).ok
    monkeypatch.setattr(compressor, "_slots", shifted)
    found = check_oracle(4, 2, 3, (9, 0, 13, 3, 8), 2, 5)
    assert not found.ok and "DISAGREE" in found.summary()


@pytest.mark.parametrize("rows_per_chunk", [1, 3, 4096])
def test_the_row_chunks_change_no_bit(monkeypatch, rows_per_chunk):
    """The references evaluate rows in chunks (bounded working memory): any chunking gives
    the bits of one whole evaluation, dAPE's block sums included."""
    from csagate.reference import compressor

    pack = R.make_pack((300, 129, 0, 127, 77), ratio=4, coff=2, d=5, pad_rows=3, pad_tokens=2)
    go = R.make_grad_out(pack.n_rows, 5)
    whole = {p: R.backward(*pack.inputs(), go, ratio=4, coff=2, precision=p)
             for p in ("fp32", "fp64")}
    monkeypatch.setattr(compressor, "CHUNK_ELEMENTS", rows_per_chunk * 8 * 5)
    assert len(compressor.row_chunks(pack.n_rows, 8, 5)) > (1 if rows_per_chunk < 4096 else 0)
    for precision, want in whole.items():
        got = R.backward(*pack.inputs(), go, ratio=4, coff=2, precision=precision)
        for name in ("out", "dkv", "dscore", "dape"):
            a, b = getattr(got, name), getattr(want, name)
            ints = {torch.bfloat16: torch.int16, torch.float32: torch.int32,
                    torch.float64: torch.int64}[a.dtype]
            assert torch.equal(a.view(ints), b.view(ints)), (precision, name)


def test_dtypes_and_shapes():
    pack = R.make_pack((1023, 2048, 509), ratio=128, coff=2, d=8, pad_rows=5, pad_tokens=21)
    go = R.make_grad_out(pack.n_rows, 8)
    g = R.backward(*pack.inputs(), go, ratio=128, coff=2)
    assert g.out.shape == (pack.n_rows, 8) and g.out.dtype == torch.bfloat16
    assert g.dkv.shape == pack.kv.shape and g.dkv.dtype == torch.bfloat16
    assert g.dscore.dtype == torch.bfloat16 and g.dape.dtype == torch.float32
    up = R.backward(*pack.inputs(), go, ratio=128, coff=2, precision="upstream")
    assert up.out.dtype == torch.bfloat16
    assert (up.out.float() - g.out.float()).abs().max() < 0.1


def test_first_block_rule_coff2():
    """A segment's first block has no previous half; other blocks read the previous block."""
    pack = R.make_pack((8, 8), ratio=4, coff=2, d=2)
    base = R.forward(*pack.inputs(), ratio=4, coff=2)
    kv = pack.kv.clone()
    kv[4:8, :2] = 100   # segment 0's last block, columns [0, d): row 2 reads it without the rule
    moved = R.forward(kv, pack.score, pack.ape, pack.cu, pack.cuc, ratio=4, coff=2)
    assert torch.equal(moved, base)
    kv = pack.kv.clone()
    kv[0:4, :2] = 100   # block 0's first-half columns: the previous half of row 1 only
    moved = R.forward(kv, pack.score, pack.ape, pack.cu, pack.cuc, ratio=4, coff=2)
    assert torch.equal(moved[[0, 2, 3]], base[[0, 2, 3]])
    assert not torch.equal(moved[1], base[1])


def test_padding_rows_replicate_token0_window():
    pack = R.make_pack((7, 9), ratio=4, coff=2, d=3, pad_rows=3)
    out = R.forward(*pack.inputs(), ratio=4, coff=2, n_rows=pack.n_rows)
    first = R.forward(*pack.inputs(), ratio=4, coff=2)[0]
    for b in range(pack.n_valid_rows, pack.n_rows):
        assert torch.equal(out[b], first)


def test_padding_grad_out_is_ignored():
    pack = R.make_pack((1023, 509), ratio=128, coff=2, d=4, pad_rows=4, pad_tokens=9)
    go = R.make_grad_out(pack.n_rows, 4, seed=11)
    zeroed = go.clone()
    zeroed[pack.n_valid_rows:] = 0
    a = R.backward(*pack.inputs(), go, ratio=128, coff=2)
    b = R.backward(*pack.inputs(), zeroed, ratio=128, coff=2)
    assert go[pack.n_valid_rows:].abs().sum() > 0
    for x, y in zip((a.dkv, a.dscore, a.dape), (b.dkv, b.dscore, b.dape)):
        assert torch.equal(x, y)


@pytest.mark.parametrize("coff", [1, 2])
def test_zero_classes_are_exact_zeros(coff):
    lens = (300, 0, 129, 127, 3, 256)
    pack = R.make_pack(lens, ratio=128, coff=coff, d=4, pad_rows=2, pad_tokens=11)
    go = R.make_grad_out(pack.n_rows, 4)
    g = R.backward(*pack.inputs(), go, ratio=128, coff=coff)
    mask = R.never_consumed_mask(pack.cu, ratio=128, coff=coff, d=4, n_tokens=pack.n_tokens)
    # Hand-counted slots per class: (a) tails 44+1+0, (c) 127+3+0, (d) 11 tokens (all columns);
    # (b) coff=2 only: 3 segments with blocks x 128 tokens x d columns.
    width = coff * 4
    expect = (44 + 1 + 127 + 3 + 11) * width + (3 * 128 * 4 if coff == 2 else 0)
    assert int(mask.sum()) == expect
    assert (g.dkv[mask] == 0).all() and (g.dscore[mask] == 0).all()
    assert (g.dkv[~mask] != 0).float().mean() > 0.99   # consumed slots carry gradient


def test_dape_sums_over_rows():
    pack = R.make_pack((512,), ratio=128, coff=1, d=4)
    go = R.make_grad_out(pack.n_rows, 4)
    g = R.backward(*pack.inputs(), go, ratio=128, coff=1, precision="fp64")
    # coff=1: window position k of row b is token 128*b + k, so dAPE[k] = sum_b dScore[128b+k].
    want = g.dscore.reshape(4, 128, 4).sum(0)
    torch.testing.assert_close(g.dape, want, rtol=1e-12, atol=1e-14)


def test_overflow_case():
    pack, go = R.overflow_pack()
    g = R.backward(*pack.inputs(), go, ratio=128, coff=1)
    for t in (g.out, g.dkv, g.dscore, g.dape):
        assert t.isnan().all()
    o = R.backward(*pack.inputs(), go, ratio=128, coff=1, precision="fp64")
    assert torch.equal(o.out, torch.ones_like(o.out))
    for t in (o.dkv, o.dscore, o.dape):
        assert torch.isfinite(t).all()


def test_inputs_are_reproducible_and_distributed():
    a = R.make_pack((8192,), ratio=128, coff=1, d=128)
    b = R.make_pack((8192,), ratio=128, coff=1, d=128)
    assert all(torch.equal(x, y) for x, y in zip(a.inputs(), b.inputs()))
    assert a.kv.dtype == torch.bfloat16 and a.ape.dtype == torch.float32
    assert abs(a.kv.float().std().item() - 1.0) < 0.01
    assert abs(a.score.float().std().item() - 1.5) < 0.015
    assert abs(a.ape.std().item() - 0.25) < 0.01
    c = R.make_pack((8192,), ratio=128, coff=1, d=128, scale=64.0)
    assert torch.equal(c.kv, a.kv * 64) and torch.equal(c.score, a.score)
    assert a.cu.dtype == torch.int32 and a.cuc.tolist() == [0, 64]


def test_bad_precision_rejected():
    pack = R.make_pack((8,), ratio=4, coff=1, d=2)
    with pytest.raises(ValueError, match="precision"):
        R.forward(*pack.inputs(), ratio=4, coff=1, precision="fp16")


# --- capacity padding rows are excluded from the backward (CONTRACT.md 2.3) ------------------


def _multiply_by_zero_backward(kv, score, ape, cu, cuc, grad_out, *, ratio, coff):
    """Padding rows left in torch's eager graph with their grad_out zeroed (what the contract
    forbids, section 2.3): 0 * inf = NaN reaches the gradients."""
    from csagate.reference.compressor import _row_geometry, _torch_eager

    leaves = [t.detach().clone().requires_grad_(True) for t in (kv, score, ape)]
    out = _torch_eager(*leaves, cu, cuc, ratio=ratio, coff=coff, n_rows=grad_out.shape[0],
                       precision="fp32")
    _, _, valid = _row_geometry(cu, cuc, grad_out.shape[0], ratio)
    out.backward(torch.where(valid[:, None], grad_out.to(out.dtype),
                             torch.zeros((), dtype=out.dtype)))
    return (out.detach(), *(t.grad for t in leaves))


def _bits(t):
    from csagate.gates.comparators import bit_view

    return bit_view(t)


PADDED = [
    # (lens, ratio, coff, d, pad_rows, pad_tokens): short first segments make the padding rows
    # read across a segment boundary
    ((3, 515, 1024, 129), 4, 2, 16, 8, 21),
    ((3, 515, 1024, 129), 4, 1, 16, 8, 37),
    ((1023, 2048, 509), 128, 2, 8, 5, 21),
    ((127, 8192, 0, 129, 128, 3, 515, 1024), 128, 1, 4, 5, 37),
    ((127, 8192, 0, 129, 128, 3, 515, 1024), 128, 2, 4, 5, 21),
    ((7, 64, 0, 9, 8, 3, 35), 8, 2, 16, 3, 5),
]


@pytest.mark.parametrize("precision", ["fp32", "fp64"])   # upstream: torch's order, by shape
@pytest.mark.parametrize("lens,ratio,coff,d,pad_rows,pad_tokens", PADDED)
def test_padding_rows_change_no_gradient_bit(lens, ratio, coff, d, pad_rows, pad_tokens,
                                             precision):
    """The gradients of a pack with capacity padding rows (nonzero grad_out there) are the
    bits of the same pack without them (signs of zero included)."""
    pack = R.make_pack(lens, ratio=ratio, coff=coff, d=d, pad_rows=pad_rows,
                       pad_tokens=pad_tokens)
    go = R.make_grad_out(pack.n_rows, d, seed=11)
    new = R.backward(*pack.inputs(), go, ratio=ratio, coff=coff, precision=precision)
    bare = R.backward(*pack.inputs(), go[:pack.n_valid_rows], ratio=ratio, coff=coff,
                      precision=precision)
    assert go[pack.n_valid_rows:].abs().sum() > 0
    for name, a, b in zip(("out", "dkv", "dscore", "dape"), (new.out[:pack.n_valid_rows],
                                                              new.dkv, new.dscore, new.dape),
                          (bare.out, bare.dkv, bare.dscore, bare.dape)):
        assert a.dtype == b.dtype and torch.equal(_bits(a), _bits(b)), name


@pytest.mark.parametrize("coff", [1, 2])
def test_non_finite_values_only_padding_rows_read_reach_no_gradient(coff):
    """A first segment shorter than ratio: its tokens are read by the padding rows only."""
    d = 4
    pack = R.make_pack((127, 8192, 0, 129), ratio=128, coff=coff, d=d, pad_rows=3, pad_tokens=5)
    go = R.make_grad_out(pack.n_rows, d, seed=11)
    kv, score = pack.kv.clone(), pack.score.clone()
    own = d * (coff - 1)   # the columns a first block (padding rows) reads
    score[2, own] = float("inf")
    kv[9, own + 1] = float("nan")
    kv[60, own + 2] = float("-inf")
    score[100, own + 3] = float("nan")
    got = R.backward(kv, score, pack.ape, pack.cu, pack.cuc, go, ratio=128, coff=coff)
    clean = R.backward(*pack.inputs(), go, ratio=128, coff=coff)
    for a, b in ((got.dkv, clean.dkv), (got.dscore, clean.dscore), (got.dape, clean.dape)):
        assert torch.isfinite(a).all() and torch.equal(_bits(a), _bits(b))
    # the forward still computes the padding rows as eager does: NaN where they read NaN/inf
    n_valid = pack.n_valid_rows
    assert got.out[n_valid:].isnan().any() and not got.out[:n_valid].isnan().any()
    old = _multiply_by_zero_backward(kv, score, pack.ape, pack.cu, pack.cuc, go, ratio=128,
                                     coff=coff)
    assert not torch.isfinite(old[3]).all()   # 0 * inf = NaN: why the rows are excluded


# --- non-finite placements of the hardening cases (CONTRACT.md 5.3) ---------------------------


@pytest.mark.parametrize("ratio,coff,d", [(128, 2, 8), (128, 1, 8), (4, 2, 8), (8, 1, 16)])
def test_partial_overflow_placements(ratio, coff, d):
    """Every value sits in a consumed slot, at a window position outside chunk 0 for every
    tchunks of the tables, and poisons exactly its own window's column."""
    lens = (1023, 2048, 509) if ratio != 8 else (23, 40, 9)
    slots = R.partial_overflow_slots(lens, ratio=ratio, coff=coff, d=d)
    pack = R.make_pack(lens, ratio=ratio, coff=coff, d=d)
    mask = R.never_consumed_mask(pack.cu, ratio=ratio, coff=coff, d=d, n_tokens=pack.n_tokens)
    assert [(name, v != v) for name, *_, v in slots] == \
        [("score", False)] * 3 + [("kv", True)]
    late = ratio - 1 - ratio // 8
    for _, token, column, _ in slots:
        assert not mask[token, column]
    if ratio == 128:   # window position >= late: outside chunk 0 for 4, 8 and 16 chunks
        assert all(late >= coff * ratio // tchunks for tchunks in (4, 8, 16))
    go = R.make_grad_out(pack.n_rows, d)
    g = R.backward(*R.with_values(pack, slots).inputs(), go, ratio=ratio, coff=coff)
    assert int(g.out.isnan().sum()) == 3        # three windows, one column each
    assert not g.out.isinf().any()
    if coff == 2:                               # W2: +inf in both halves of one window
        (_, t_prev, c_prev, _), (_, t_own, c_own, _) = slots[1], slots[2]
        assert t_own - t_prev == ratio and c_own - c_prev == d
    o = R.backward(*R.with_values(pack, slots).inputs(), go, ratio=ratio, coff=coff,
                   precision="fp64")
    for a, b in ((g.out, o.out), (g.dkv, o.dkv), (g.dscore, o.dscore), (g.dape, o.dape)):
        assert torch.equal(a.isnan(), b.isnan())   # the oracle is NaN at the same positions


def test_pad_nonfinite_placements_are_read_by_padding_rows_only():
    lens = (127, 8192, 0, 129)
    for coff in (1, 2):
        slots = R.pad_nonfinite_slots(lens, ratio=128, coff=coff, d=8)
        pack = R.make_pack(lens, ratio=128, coff=coff, d=8, pad_rows=3)
        mask = R.never_consumed_mask(pack.cu, ratio=128, coff=coff, d=8,
                                     n_tokens=pack.n_tokens)
        assert all(mask[t, c] for _, t, c, _ in slots)   # no valid row reads them
        assert all(c >= 8 * (coff - 1) for _, _, c, _ in slots)   # the columns padding rows read
        values = sorted(str(v) for *_, v in slots)
        assert values == ["-inf", "inf", "nan", "nan"]
    with pytest.raises(ValueError, match="segment 0"):
        R.pad_nonfinite_slots((128, 5), ratio=128, coff=1, d=8)


# --- the reference defines its own order (CONTRACT.md 3.1) ---------------------------------------


def _serial_loop(pack, grad_out):
    """The documented fp32 order as scalar loops over rows, columns and window positions (0-d
    fp32 tensors, so every step is one IEEE fp32 operation; exp is torch.exp as in the
    reference)."""
    f32 = torch.float32
    kv, score, ape = pack.kv.float(), pack.score.float(), pack.ape
    cu, cuc = pack.cu.tolist(), pack.cuc.tolist()
    r, coff, d = pack.ratio, pack.coff, pack.d
    n_rows = grad_out.shape[0]
    out = torch.zeros(n_rows, d, dtype=torch.bfloat16)
    dkv = torch.zeros(kv.shape, dtype=torch.bfloat16)
    dscore = torch.zeros(kv.shape, dtype=torch.bfloat16)
    zero, ninf = torch.tensor(0.0, dtype=f32), torch.tensor(-math.inf, dtype=f32)
    for b in range(n_rows):
        if b < cuc[-1]:
            seg = max(i for i in range(len(cu) - 1) if cuc[i] <= b < cuc[i + 1])
            i, tok0 = b - cuc[seg], cu[seg] + (b - cuc[seg]) * r
        else:
            i, tok0 = 0, 0
        for j in range(d):
            if coff == 1:
                slots = [(tok0 + k, j, k) for k in range(r)]
            else:
                slots = [None if i == 0 else (tok0 - r + k, j, k) for k in range(r)]
                slots += [(tok0 + k, d + j, k) for k in range(r)]
            s = [ninf if sl is None else score[sl[0], sl[1]] + ape[sl[2], sl[1]] for sl in slots]
            u = [zero if sl is None else kv[sl[0], sl[1]] for sl in slots]
            m = s[0]
            for x in s[1:]:
                m = x if x > m else m
            e = [torch.exp(x - m) for x in s]
            den = zero
            for x in e:
                den = den + x
            p = [x / den for x in e]
            acc = zero
            for pk, uk in zip(p, u):
                acc = acc + uk * pk
            out[b, j] = acc.to(torch.bfloat16)
            if b >= cuc[-1]:
                continue
            go = grad_out[b, j].float()
            t = [(go * uk) * pk for uk, pk in zip(u, p)]
            big_s = zero
            for x in t:
                big_s = big_s + x
            for sl, pk, tk in zip(slots, p, t):
                if sl is not None:
                    dkv[sl[0], sl[1]] = (go * pk).to(torch.bfloat16)
                    dscore[sl[0], sl[1]] = _fma_exact(pk, -big_s, tk).to(torch.bfloat16)
    return out, dkv, dscore


def _fma_exact(a, b, c):
    """a*b + c rounded once to fp32, from exact rationals (the test's own fma)."""
    from fractions import Fraction

    a, b, c = float(a), float(b), float(c)
    if not all(map(math.isfinite, (a, b, c))):
        return torch.tensor(a * b + c, dtype=torch.float32)
    exact = Fraction(a) * Fraction(b) + Fraction(c)
    if exact == 0:   # IEEE: an exact zero sum is +0 unless both addends are -0
        neg = math.copysign(1, a * b) < 0 and math.copysign(1, c) < 0
        return torch.tensor(-0.0 if neg else 0.0, dtype=torch.float32)
    near = torch.tensor(float(exact), dtype=torch.float32)
    cands = [near, torch.nextafter(near, torch.tensor(math.inf)),
             torch.nextafter(near, torch.tensor(-math.inf))]
    return min(cands, key=lambda t: (abs(Fraction(float(t)) - exact),
                                     int(t.view(torch.int32)) & 1))


@pytest.mark.parametrize("lens,ratio,coff,d,pad_rows", [
    ((9, 0, 13, 3, 8), 4, 2, 3, 2),
    ((5, 4, 11), 4, 1, 2, 1),
    ((70, 35), 32, 2, 2, 1),
    ((20,), 8, 2, 5, 0),
])
def test_fp32_reference_is_the_documented_serial_order(lens, ratio, coff, d, pad_rows):
    """Bit for bit (signs of zero included) the scalar loop of the documented order."""
    pack = R.make_pack(lens, ratio=ratio, coff=coff, d=d, pad_rows=pad_rows)
    go = R.make_grad_out(pack.n_rows, d)
    got = R.backward(*pack.inputs(), go, ratio=ratio, coff=coff)
    want = _serial_loop(pack, go)
    for name, a, b in zip(("out", "dkv", "dscore"), (got.out, got.dkv, got.dscore), want):
        assert torch.equal(_bits(a), _bits(b)), name


def test_fma_is_one_rounding():
    """``_fma`` against exact rationals: cancellation, signed zeros, non-finite values."""
    from csagate.reference.compressor import _fma

    gen = torch.Generator().manual_seed(5)
    a = torch.randn(3000, generator=gen)
    b = torch.randn(3000, generator=gen)
    c = -(a * b) * (1 + torch.randn(3000, generator=gen) * 2.0**-20)   # deep cancellation
    c[:1000] = torch.randn(1000, generator=gen) * 1e-3
    specials = torch.tensor([[0.0, 0.0, -0.0], [-0.0, 1.0, -0.0], [0.0, -1.0, 0.0],
                             [1e-30, 1e-30, -0.0], [math.inf, 1.0, -math.inf],
                             [math.nan, 1.0, 0.0], [3.0, 0.0, -0.0], [1e-38, 1e-3, 0.0]])
    a = torch.cat([a, specials[:, 0]])
    b = torch.cat([b, specials[:, 1]])
    c = torch.cat([c, specials[:, 2]])
    got = _fma(a, b, c)
    for i in range(a.numel()):
        want = _fma_exact(a[i], b[i], c[i])
        if math.isnan(float(want)):
            assert math.isnan(float(got[i])), i
        else:
            assert int(got[i].view(torch.int32)) == int(want.view(torch.int32)), i


def test_zero_signs_follow_the_expression():
    """grad_out = 0 and kv < 0: t_k = (0 * u_k) * p_k = -0, so ds_k = fma(p_k, -0, -0) = -0.
    The reference keeps that -0 (torch's autograd adds +0 contributions and turns it +0)."""
    pack = R.make_pack((16,), ratio=4, coff=1, d=4)
    go = torch.zeros(pack.n_rows, 4, dtype=torch.bfloat16)
    g = R.backward(*pack.inputs(), go, ratio=4, coff=1)
    negative = pack.kv < 0
    bits = _bits(g.dscore)
    assert negative.any() and (bits[negative] == torch.tensor(-0x8000, dtype=torch.int16)).all()
    assert (bits[~negative] == 0).all()


@pytest.mark.parametrize("ratio,coff", [(32, 2), (128, 1), (4, 2)])
def test_same_bits_for_the_same_columns_at_every_head_dim(ratio, coff):
    """Columns [0, 64) of a d=128 pack and the d=64 pack made of them: the same bits (torch's
    CUDA softmax picks another reduction tree for d <= 64 at a 64-position window)."""
    big = R.make_pack((300, 1090, 77), ratio=ratio, coff=coff, d=128, pad_rows=2)
    go = R.make_grad_out(big.n_rows, 128)
    keep = torch.cat([torch.arange(64) + h * 128 for h in range(coff)])
    small = R.Pack(big.kv[:, keep].contiguous(), big.score[:, keep].contiguous(),
                   big.ape[:, keep].contiguous(), big.cu, big.cuc, big.n_rows, ratio, coff, 64,
                   big.lens)
    a = R.backward(*big.inputs(), go, ratio=ratio, coff=coff)
    b = R.backward(*small.inputs(), go[:, :64].contiguous(), ratio=ratio, coff=coff)
    assert torch.equal(_bits(a.out[:, :64]), _bits(b.out))
    assert torch.equal(_bits(a.dkv[:, keep]), _bits(b.dkv))
    assert torch.equal(_bits(a.dscore[:, keep]), _bits(b.dscore))
