"""The small-ratio kernels on the GPU against the fp32 eager reference (docs/CONTRACT.md section
4.1), at every small ratio (2, 4, 8, 16, 32).

The kernels are launched directly (``csagate.kernels.small.launch_*``) into buffers allocated
here:
dKV/dScore start NaN-filled, so a slot the backward fails to write shows up as NaN. Contract:
dKV and dScore ``torch.equal`` to the reference; the forward differs on at most
max(1, int(1e-4 * numel)) elements, each by at most one bf16 step (or, where the sum cancels
far below its terms, by less than the fp32 summation-order noise ``FWD_NOISE_ATOL``); dAPE
within 1e-3; exact zeros on every never-consumed slot. The api, the torch op, the
deterministic mode and CUDA graphs are checked at the new ratios at the end.
"""

from __future__ import annotations

import functools

import pytest
import torch
from csagate.kernels import registry

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("needs_dsl")]

SMALL_RATIOS = registry.SMALL_RATIOS
# Reordering a w-term fp32 sum with sum|u*p| <= max|kv| ~ 6 moves it by <= (w-1) * 2^-24 * 6
# (2.5e-6 at w = 8); the two bf16 roundings can add that again (gates.contracts.fwd_noise_atol).


def _noise_atol(ratio: int, coff: int) -> float:
    from csagate.gates.contracts import fwd_noise_atol

    return fwd_noise_atol(ratio * coff)


def _fraction(ratio: int, coff: int) -> float:
    """The share of forward elements allowed one bf16 step off (gates.contracts.fwd_fraction)."""
    from csagate.gates.contracts import fwd_fraction

    return fwd_fraction(ratio * coff)

DAPE_ATOL = 1e-3
RAGGED3 = (1023, 2048, 509)
PACKS = [  # (lens, d): ratio=4
    ((2048,), 128),
    (RAGGED3, 128),
    ((3, 515, 1024, 129), 128),  # short first segment: the capacity rows read across it
    ((64, 0, 253, 3), 128),  # empty and short segments
    ((260,), 65),  # odd d: the vec=1 forward
    ((2048,), 512),
]
OTHER_PACKS = [  # (lens, d): the other small ratios
    (RAGGED3, 128),
    ((64, 0, 253, 3, 1), 128),  # empty and short segments (1 token: short at ratio 2 too)
    ((260,), 65),  # odd d: the vec=1 forward (ratio 2: coff 2 only)
    ((2048,), 512),
]


def _served(ratio: int, coff: int, d: int) -> bool:
    from csagate.kernels.small_schedule import config_problems

    return not config_problems(ratio, coff, d)


CASES = [(lens, d, coff, ratio) for ratio in SMALL_RATIOS for coff in (2, 1)
         for lens, d in (PACKS if ratio == 4 else OTHER_PACKS) if _served(ratio, coff, d)]


def _case_id(case) -> str:
    lens, d, coff, ratio = case
    return f"r{ratio}-c{coff}d{d}-" + "_".join(map(str, lens))


# ----------------------------------------------------------------------------------------
# Running the kernels
# ----------------------------------------------------------------------------------------


@functools.cache
def _kernels(d: int, coff: int, ratio: int = 4):
    from csagate.kernels import small
    from csagate.kernels._dsl import device_arch

    arch = device_arch()
    return (small.build_fwd(d=d, coff=coff, arch=arch, ratio=ratio),
            small.build_bwd(d=d, coff=coff, arch=arch, ratio=ratio))


def _pack(lens, d, coff, ratio=4, **kw):
    from csagate.reference import make_pack

    return make_pack(lens, ratio=ratio, coff=coff, d=d, device="cuda", **kw)


def _run_fwd(pack, *, fill=float("nan"), stream=None) -> torch.Tensor:
    from csagate.kernels import small

    kv, score, ape, cu, cuc = pack.inputs()
    out = torch.full((pack.n_rows, pack.d), fill, dtype=torch.bfloat16, device="cuda")
    if stream is not None:  # the fill above runs on the current stream
        stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream or torch.cuda.current_stream()):  # launches on the current
        small.launch_fwd(_kernels(pack.d, pack.coff, pack.ratio)[0], kv=kv, score=score,
                         ape=ape, cu=cu, cuc=cuc, out=out)
    torch.cuda.synchronize()
    return out


def _table_rows(pack) -> int:
    """The rows per CTA a launch takes by default (``bwd_rows_per_cta``)."""
    from csagate.kernels._dsl import device_arch
    from csagate.kernels.small_schedule import bwd_rows_per_cta, small_schedule

    sched = small_schedule("bwd", pack.d, ratio=pack.ratio, coff=pack.coff,
                           arch=device_arch())
    return bwd_rows_per_cta(pack.n_rows, pack.d, pack.coff, sched)


def _run_bwd(pack, grad_out, *, fill=float("nan"), stream=None, rows_per_cta=None):
    from csagate.kernels import small

    kv, score, ape, cu, cuc = pack.inputs()
    dkv = torch.full_like(kv, fill)
    dscore = torch.full_like(score, fill)
    dape = torch.zeros_like(ape)
    if stream is not None:  # the fills above run on the current stream
        stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream or torch.cuda.current_stream()):
        small.launch_bwd(_kernels(pack.d, pack.coff, pack.ratio)[1], kv=kv, score=score,
                         ape=ape, cu=cu, cuc=cuc, grad_out=grad_out, dkv=dkv, dscore=dscore,
                         dape=dape, rows_per_cta=rows_per_cta or _table_rows(pack))
    torch.cuda.synchronize()
    return dkv, dscore, dape


def _ref_out(pack) -> torch.Tensor:
    """The fp32 eager reference out over all N rows (capacity padding rows included)."""
    from csagate.reference import forward

    kv, score, ape, cu, cuc = pack.inputs()
    return forward(kv, score, ape, cu, cuc, ratio=pack.ratio, coff=pack.coff,
                   n_rows=pack.n_rows, precision="fp32")


def _ref_grads(pack, grad_out):
    """The fp32 eager reference gradients, grad_out of capacity padding rows zeroed."""
    from csagate.reference import backward

    kv, score, ape, cu, cuc = pack.inputs()
    go = grad_out.clone()
    go[pack.n_valid_rows:] = 0
    return backward(kv, score, ape, cu, cuc, go, ratio=pack.ratio, coff=pack.coff,
                    precision="fp32")


def _mask(pack) -> torch.Tensor:
    from csagate.reference import never_consumed_mask

    return never_consumed_mask(pack.cu, ratio=pack.ratio, coff=pack.coff, d=pack.d,
                               n_tokens=pack.n_tokens).to("cuda")


# ----------------------------------------------------------------------------------------
# Diagnostics
# ----------------------------------------------------------------------------------------


def _slot(pack, index) -> str:
    """Where a (token, column) slot of dKV/dScore sits in the pack, or a row of out."""
    if len(index) != 2 or pack is None:
        return str(tuple(index))
    tok, col = index
    bounds = pack.cu.tolist()
    half = "own/only half" if pack.coff == 1 or col >= pack.d else "previous-block half"
    for s in range(len(bounds) - 1):
        if bounds[s] <= tok < bounds[s + 1]:
            off = tok - bounds[s]
            return (f"(token {tok}, column {col}): segment {s} (len {bounds[s + 1] - bounds[s]})"
                    f" offset {off} = block {off // pack.ratio} position {off % pack.ratio},"
                    f" {half}")
    return f"(token {tok}, column {col}): token padding row (>= cu[B] = {bounds[-1]})"


def _mismatch(name, got, ref, pack=None) -> str:
    """Count, max |diff|, NaNs and the first differing element of two same-shape tensors."""
    g, r = got.float(), ref.float()
    same = (g == r) | (g.isnan() & r.isnan())
    bad = ~same
    n_bad = int(bad.sum())
    if n_bad == 0:
        return f"{name}: equal"
    first = bad.nonzero()[0].tolist()
    diff = (g - r).abs()[bad].nan_to_num(float("inf"))
    return (f"{name}: {n_bad}/{got.numel()} elements differ, max |diff| {diff.max().item():.3g},"
            f" NaN in kernel {int(g.isnan().sum())} / in reference {int(r.isnan().sum())};"
            f" first at {_slot(pack, first)}: kernel {g[tuple(first)].item()!r},"
            f" reference {r[tuple(first)].item()!r}")


def _bf16_ordinal(t: torch.Tensor) -> torch.Tensor:
    """A monotone integer image of bf16 values: adjacent representable values differ by 1."""
    bits = t.contiguous().view(torch.int16).to(torch.int32)
    mag = bits & 0x7FFF
    return torch.where(bits < 0, -mag, mag)


def _check_forward(out, ref_out, label, noise_atol=8e-6, fraction=1e-4):
    """Few elements differ, each by one bf16 step or by less than the fp32 summation noise.

    The kernel sums the ratio*coff products serially, torch's reduction in another order: the
    two fp32 sums differ by a few fp32 ulps of the largest product, so where the sum cancels
    to far below its terms the bf16 results can be several (tiny) bf16 steps apart.
    """
    assert not out.isnan().any(), (
        f"{label}: {int(out.isnan().sum())} NaN in out (unwritten rows start NaN); "
        + _mismatch("out", out, ref_out))
    steps = (_bf16_ordinal(out) - _bf16_ordinal(ref_out)).abs()
    diff = (out.float() - ref_out.float()).abs()
    n_diff = int((steps > 0).sum())
    allowed = max(1, int(fraction * out.numel()))
    too_far = (steps > 1) & (diff > noise_atol)
    worst = int(steps.max()) if steps.numel() else 0
    assert n_diff <= allowed and not too_far.any(), (
        f"{label}: forward differs from the fp32 reference on {n_diff} elements (allowed "
        f"{allowed}); {int(too_far.sum())} of them by more than one bf16 step and more than "
        f"{noise_atol:g} (worst {worst} steps); " + _mismatch("out", out, ref_out))


def _check_grads(pack, dkv, dscore, dape, res, label):
    for name, got, ref in (("dKV", dkv, res.dkv), ("dScore", dscore, res.dscore)):
        assert torch.equal(got, ref), f"{label}: " + _mismatch(name, got, ref, pack)
    err = (dape - res.dape).abs().max().item()
    assert err <= DAPE_ATOL, (
        f"{label}: dAPE max |diff| {err:.3g} > {DAPE_ATOL}; " + _mismatch("dAPE", dape, res.dape))


def _check_zero_slots(pack, dkv, dscore, res, label):
    mask = _mask(pack)
    for name, ref in (("dKV", res.dkv), ("dScore", res.dscore)):
        assert (ref[mask] == 0).all(), (
            f"{label}: the REFERENCE {name} is nonzero on never-consumed slots (mask or "
            "reference bug, not the kernel)")
    for name, got in (("dKV", dkv), ("dScore", dscore)):
        masked = got[mask].float()
        bad = ~(masked == 0)
        if bad.any():
            where = mask.nonzero()[bad.nonzero()[0].item()].tolist()
            raise AssertionError(
                f"{label}: {name} has {int(bad.sum())}/{masked.numel()} never-consumed slots "
                f"that are not exact zeros ({int(masked.isnan().sum())} NaN = never written); "
                f"first {_slot(pack, where)}: {got[tuple(where)].item()!r}")


# ----------------------------------------------------------------------------------------
# Tests
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_forward_vs_fp32_reference(case):
    lens, d, coff, ratio = case
    pack = _pack(lens, d, coff, ratio)
    _check_forward(_run_fwd(pack), _ref_out(pack), _case_id(case), _noise_atol(ratio, coff),
                   _fraction(ratio, coff))


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_backward_bitwise_vs_fp32_reference(case):
    from csagate.reference import make_grad_out

    lens, d, coff, ratio = case
    label = _case_id(case)
    pack = _pack(lens, d, coff, ratio)
    go = make_grad_out(pack.n_rows, d, device="cuda")
    dkv, dscore, dape = _run_bwd(pack, go)
    res = _ref_grads(pack, go)
    for name, got in (("dKV", dkv), ("dScore", dscore)):
        assert not got.isnan().any(), (
            f"{label}: {int(got.isnan().sum())} {name} slots never written (still NaN); "
            + _mismatch(name, got, getattr(res, name.lower()), pack))
    _check_zero_slots(pack, dkv, dscore, res, label)
    _check_grads(pack, dkv, dscore, dape, res, label)


def _window_exps(pack) -> torch.Tensor:
    """e_k = exp(s_k - max_k s_k) of every valid row's window, (window, rows, d), in fp32 from
    the reference's own window gather (a first block's previous half at coff=2: s = -inf,
    e = 0)."""
    from csagate.reference.compressor import _slots, _windows

    kv, score, ape, cu, cuc = (t.cpu() for t in pack.inputs())
    slots = _slots(cu, cuc, pack.n_valid_rows, pack.ratio, pack.coff)
    s, _ = _windows(kv, score, ape, slots, pack.coff, torch.float32)
    return torch.exp(s - s.amax(0))


@pytest.mark.parametrize("ratio", SMALL_RATIOS)
@pytest.mark.parametrize("coff", (2, 1))
def test_peaked_scores_bitwise(coff, ratio):
    """Scores x16 (``reference.inputs.peaked``): windows with an e_k below DIV_FAST_MIN, some
    subnormal or 0, divide one by one, the others share a reciprocal (kernels/device.py);
    either way dKV/dScore are bitwise the reference's and out within the contract."""
    from csagate.kernels.device import DIV_FAST_MIN
    from csagate.reference import make_grad_out, peaked

    if not _served(ratio, coff, 128):
        pytest.skip(f"ratio {ratio} c{coff}d128 is not served")
    label = f"r{ratio}-c{coff}d128-peaked"
    pack = peaked(_pack(RAGGED3, 128, coff, ratio))
    e = _window_exps(pack)
    assert (e.amin(0) < DIV_FAST_MIN).any(), f"{label}: no window takes the one-by-one path"
    assert ((e > 0) & (e < 2.0 ** -126)).any(), f"{label}: no subnormal e_k in the pack"
    _check_forward(_run_fwd(pack), _ref_out(pack), label, _noise_atol(ratio, coff),
                   _fraction(ratio, coff))
    go = make_grad_out(pack.n_rows, 128, device="cuda")
    dkv, dscore, dape = _run_bwd(pack, go)
    res = _ref_grads(pack, go)
    _check_zero_slots(pack, dkv, dscore, res, label)
    _check_grads(pack, dkv, dscore, dape, res, label)


PAD_PACKS = [(3, 515, 1024, 129), RAGGED3]


@pytest.mark.parametrize("ratio", SMALL_RATIOS)
@pytest.mark.parametrize("coff", (2, 1))
@pytest.mark.parametrize("lens", PAD_PACKS, ids=lambda lens: "_".join(map(str, lens)))
def test_capacity_padding(lens, coff, ratio):
    """8 capacity rows + 37 token-padding rows; NONZERO grad_out on the capacity rows."""
    from csagate.reference import make_grad_out

    d = 128
    label = f"r{ratio}-c{coff}d{d}-" + "_".join(map(str, lens)) + "-pad8-tok37"
    pack = _pack(lens, d, coff, ratio, pad_rows=8, pad_tokens=37)
    n_valid = pack.n_valid_rows
    assert pack.n_rows == n_valid + 8 and pack.n_tokens == sum(lens) + 37, (
        f"make_pack geometry: n_rows {pack.n_rows} (valid {n_valid}), T {pack.n_tokens}")
    go = make_grad_out(pack.n_rows, d, seed=11, device="cuda")
    assert (go[n_valid:] != 0).any(), "padding grad_out must be nonzero for this test"
    go_zeroed = go.clone()
    go_zeroed[n_valid:] = 0

    _check_forward(_run_fwd(pack), _ref_out(pack), label, _noise_atol(ratio, coff),
                   _fraction(ratio, coff))
    res = _ref_grads(pack, go_zeroed)

    dkv, dscore, dape = _run_bwd(pack, go)
    _check_grads(pack, dkv, dscore, dape, res, label)
    _check_zero_slots(pack, dkv, dscore, res, label)
    tail = slice(sum(lens), None)
    for name, got in (("dKV", dkv), ("dScore", dscore)):
        assert (got[tail] == 0).all(), (
            f"{label}: {name} token-padding rows [cu[B], T) are not exact zeros: "
            f"{int((got[tail] != 0).sum())} nonzero ({int(got[tail].isnan().sum())} NaN)")

    dkv0, dscore0, _ = _run_bwd(pack, go_zeroed)
    for name, a, b in (("dKV", dkv, dkv0), ("dScore", dscore, dscore0)):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16)), (
            f"{label}: {name} depends on the padding rows' grad_out; "
            + _mismatch(name, a, b, pack))


@pytest.mark.parametrize("ratio", SMALL_RATIOS)
@pytest.mark.parametrize("coff", (2, 1))
def test_three_run_determinism(coff, ratio):
    """Run 1 into zeros, runs 2-3 into NaN (run 3 on a side stream): bitwise identical."""
    from csagate.reference import make_grad_out

    d = 128
    pack = _pack(RAGGED3, d, coff, ratio)
    go = make_grad_out(pack.n_rows, d, device="cuda")
    runs = [(_run_fwd(pack, fill=0.0), *_run_bwd(pack, go, fill=0.0)),
            (_run_fwd(pack), *_run_bwd(pack, go))]
    side = torch.cuda.Stream()
    runs.append((_run_fwd(pack, stream=side), *_run_bwd(pack, go, stream=side)))
    names = ("out", "dKV", "dScore")
    for i in (1, 2):
        for name, a, b in zip(names, runs[0][:3], runs[i][:3], strict=True):
            assert torch.equal(a.view(torch.int16), b.view(torch.int16)), (
                f"r{ratio} c{coff}d{d} ragged3: run {i + 1} {name} differs from run 1 "
                "(zero-filled): "
                + _mismatch(name, b, a, pack if name != "out" else None))
        err = (runs[i][3] - runs[0][3]).abs().max().item()
        assert err <= DAPE_ATOL, f"run {i + 1} dAPE differs from run 1 by {err:.3g}"


@pytest.mark.parametrize("coff", (2, 1))
def test_no_rows_launches_nothing(coff):
    """lens [3, 2, 1]: N == 0, so nothing launches and every buffer keeps its NaN fill."""
    from csagate.kernels import small

    d = 128
    pack = _pack((3, 2, 1), d, coff)
    assert pack.n_rows == 0, f"expected no output rows, got {pack.n_rows}"
    kv, score, ape, cu, cuc = pack.inputs()
    fwd, bwd = _kernels(d, coff)
    out = torch.empty(0, d, dtype=torch.bfloat16, device="cuda")
    small.launch_fwd(fwd, kv=kv, score=score, ape=ape, cu=cu, cuc=cuc, out=out)
    go = torch.empty(0, d, dtype=torch.bfloat16, device="cuda")
    dkv = torch.full_like(kv, float("nan"))
    dscore = torch.full_like(score, float("nan"))
    dape = torch.full_like(ape, float("nan"))
    small.launch_bwd(bwd, kv=kv, score=score, ape=ape, cu=cu, cuc=cuc, grad_out=go, dkv=dkv,
                     dscore=dscore, dape=dape, rows_per_cta=1)
    torch.cuda.synchronize()
    for name, t in (("dKV", dkv), ("dScore", dscore), ("dAPE", dape)):
        assert t.isnan().all(), f"N == 0 but {name} was written ({int((~t.isnan()).sum())})"


# ----------------------------------------------------------------------------------------
# The new ratios through the api, the torch op, the deterministic mode and a CUDA graph
# ----------------------------------------------------------------------------------------

NEW_RATIOS = tuple(r for r in SMALL_RATIOS if r != 4)


def _api_grads(pack, go, **kw):
    from csagate.kernels import api

    return api.backward(*pack.inputs(), go, ratio=pack.ratio, coff=pack.coff, **kw)


@pytest.mark.parametrize("ratio", NEW_RATIOS)
@pytest.mark.parametrize("coff", (1, 2))
def test_api_op_and_deterministic_mode(ratio, coff):
    """api.forward/backward equal the direct launches bitwise (out, dKV, dScore); the torch op
    equals the api (dAPE within the atomics' order noise); deterministic=True gives the same
    dKV/dScore and a dAPE bitwise equal run to run, within 1e-3 of the reference."""
    from csagate.kernels import api, ops
    from csagate.reference import make_grad_out

    d = 128
    label = f"r{ratio} c{coff}d{d}"
    pack = _pack(RAGGED3, d, coff, ratio, pad_rows=3)
    go = make_grad_out(pack.n_rows, d, device="cuda")
    out = api.forward(*pack.inputs(), ratio=ratio, coff=coff, n_rows=pack.n_rows)
    assert torch.equal(out, _run_fwd(pack)), f"{label}: api forward != direct launch"
    dkv, dscore, dape = _api_grads(pack, go, deterministic=False)
    ref = _ref_grads(pack, go)
    _check_grads(pack, dkv, dscore, dape, ref, f"{label} api")

    leaves = [t.detach().clone().requires_grad_(True) for t in pack.inputs()[:3]]
    op_out = ops.csa_compress(*leaves, pack.cu, pack.cuc, ratio=ratio, coff=coff,
                              n_rows=pack.n_rows)
    op_out.backward(go)
    torch.cuda.synchronize()
    assert torch.equal(op_out, out), f"{label}: op forward != api"
    for name, got, want in (("dKV", leaves[0].grad, dkv), ("dScore", leaves[1].grad, dscore)):
        assert torch.equal(got, want), f"{label} op: " + _mismatch(name, got, want, pack)
    # fp32 atomics in another order: a few ulps of the largest accumulated value
    tol = 1e-5 * max(1.0, dape.abs().max().item())
    assert (leaves[2].grad - dape).abs().max().item() <= tol, f"{label}: op dAPE"

    runs = [_api_grads(pack, go, deterministic=True) for _ in range(2)]
    for det in runs:
        assert torch.equal(det[0], dkv) and torch.equal(det[1], dscore), (
            f"{label}: deterministic dKV/dScore differ from the default mode")
    assert torch.equal(runs[0][2].view(torch.int32), runs[1][2].view(torch.int32)), (
        f"{label}: deterministic dAPE differs run to run")
    assert (runs[0][2] - ref.dape).abs().max().item() <= DAPE_ATOL


@pytest.mark.parametrize("ratio", NEW_RATIOS)
def test_cuda_graph_replay(ratio):
    """A captured forward + backward replays to the eager results, then to the reference on
    new data copied into the same buffers (the segment layout changes with it)."""
    from csagate.kernels import api
    from csagate.reference import make_grad_out

    coff, d = 2, 128
    a = _pack((512, 256, 0), d, coff, ratio)  # the same T, N and B for both packs
    b = _pack((384, 128, 256), d, coff, ratio, seed=99)
    assert (a.n_tokens, a.n_rows, a.cu.shape) == (b.n_tokens, b.n_rows, b.cu.shape)
    kv, score, ape, cu, cuc = (t.clone() for t in a.inputs())
    go = make_grad_out(a.n_rows, d, device="cuda")
    n = a.n_rows

    def step():
        out = api.forward(kv, score, ape, cu, cuc, ratio=ratio, coff=coff, n_rows=n)
        return (out, *api.backward(kv, score, ape, cu, cuc, go, ratio=ratio, coff=coff))

    eager = step()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = step()
    graph.replay()
    torch.cuda.synchronize()
    for name, x, y in zip(("out", "dKV", "dScore"), static[:3], eager[:3], strict=True):
        assert torch.equal(x, y), f"r{ratio} replay {name} != eager"
    for dst, src in ((kv, b.kv), (score, b.score), (ape, b.ape), (cu, b.cu), (cuc, b.cuc)):
        dst.copy_(src)
    graph.replay()
    torch.cuda.synchronize()
    from csagate.reference import backward

    ref = backward(kv, score, ape, cu, cuc, go, ratio=ratio, coff=coff, precision="fp32")
    for name, got, want in (("dKV", static[1], ref.dkv), ("dScore", static[2], ref.dscore)):
        assert torch.equal(got, want), f"r{ratio} new-data replay: " + _mismatch(name, got, want)


# ----------------------------------------------------------------------------------------
# The backward at other rows per CTA (a launch argument), and the forward's other forms
# ----------------------------------------------------------------------------------------

FORM_PACKS = {  # name: (lens, pad_rows, pad_tokens)
    "ragged": ((1023, 2, 2048, 0, 509), 0, 0),  # tails at every ratio, a short and an empty
    "padded": ((3, 515, 1024, 129), 8, 37),  # capacity rows (nonzero grad_out), token padding
}


def _form_id(case) -> str:
    ratio, coff, d, sched = case
    return f"r{ratio}-c{coff}d{d}-{sched.tag}"


@pytest.mark.parametrize("pack_name", tuple(FORM_PACKS))
@pytest.mark.parametrize("rows", (1, 3, 32))
@pytest.mark.parametrize("ratio,coff", [(2, 1), (2, 2), (4, 1), (4, 2), (8, 2), (16, 1)])
def test_backward_rows_per_cta_bitwise(ratio, coff, rows, pack_name):
    """At any rows per CTA up to the schedule's, every dKV/dScore slot is written and bitwise
    the fp32 reference's; dAPE within the atomics' noise."""
    from csagate.reference import make_grad_out

    d = 128
    lens, pad_rows, pad_tokens = FORM_PACKS[pack_name]
    pack = _pack(lens, d, coff, ratio, pad_rows=pad_rows, pad_tokens=pad_tokens)
    go = make_grad_out(pack.n_rows, d, seed=5, device="cuda")
    dkv, dscore, dape = _run_bwd(pack, go, rows_per_cta=rows)
    ref = _ref_grads(pack, go)
    label = f"r{ratio} c{coff}d{d} rows {rows} {pack_name}"
    for name, got, want in (("dKV", dkv, ref.dkv), ("dScore", dscore, ref.dscore)):
        assert not got.isnan().any(), f"{label}: {int(got.isnan().sum())} {name} never written"
        assert torch.equal(got, want), f"{label}: " + _mismatch(name, got, want, pack)
    assert (dape - ref.dape).abs().max().item() <= DAPE_ATOL, f"{label}: dAPE"


def _bwd_form_cases():
    """Every backward form (vec 1, 2, 4 where the window allows) at d = 128, 512 and 136 (a
    partial warp of column groups), whether or not a table picks it."""
    from csagate.kernels.small_schedule import bwd_forms, small_schedule

    cases = []
    for ratio in SMALL_RATIOS:
        for coff in (1, 2):
            for d in (128, 136, 512):
                table = small_schedule("bwd", d, ratio=ratio, coff=coff)
                cases += [(ratio, coff, d, s) for s in (table, *bwd_forms(ratio, coff, d))
                          if s.vec > 1 or s.prefetch]
    return cases


@functools.cache
def _bwd_kernel(d: int, coff: int, ratio: int, sched):
    from csagate.kernels import small
    from csagate.kernels._dsl import device_arch

    return small.build_bwd(d=d, coff=coff, arch=device_arch(), sched=sched, ratio=ratio)


@pytest.mark.parametrize("pack_name", tuple(FORM_PACKS))
@pytest.mark.parametrize("case", _bwd_form_cases(), ids=_form_id)
def test_backward_vector_forms_bitwise(case, pack_name):
    """A vector backward form (vec columns per thread, lanes rows side by side, the lanes'
    dAPE sums merged in shared memory, one vector reduction per slot) or a prefetch form (a
    lane's next row loaded during this one) writes every dKV/dScore slot bitwise the fp32
    reference's at one row per lane, a ragged count and its most rows per CTA; dAPE within the
    atomics' noise."""
    from csagate.kernels import small
    from csagate.reference import make_grad_out

    ratio, coff, d, sched = case
    lens, pad_rows, pad_tokens = FORM_PACKS[pack_name]
    pack = _pack(lens, d, coff, ratio, pad_rows=pad_rows, pad_tokens=pad_tokens)
    go = make_grad_out(pack.n_rows, d, seed=7, device="cuda")
    ref = _ref_grads(pack, go)
    kv, score, ape, cu, cuc = pack.inputs()
    for rows in sorted({sched.lanes, 3 * sched.lanes + 1, sched.rows_per_cta}):
        rows = min(rows, sched.rows_per_cta)
        dkv, dscore = torch.full_like(kv, float("nan")), torch.full_like(score, float("nan"))
        dape = torch.full_like(ape, 7.0)  # zeroed inside the launch
        small.launch_bwd(_bwd_kernel(d, coff, ratio, sched), kv=kv, score=score, ape=ape,
                         cu=cu, cuc=cuc, grad_out=go, dkv=dkv, dscore=dscore, dape=dape,
                         rows_per_cta=rows, zero_dape=True)
        torch.cuda.synchronize()
        label = f"{_form_id(case)} rows {rows} {pack_name}"
        for name, got, want in (("dKV", dkv, ref.dkv), ("dScore", dscore, ref.dscore)):
            assert not got.isnan().any(), f"{label}: {int(got.isnan().sum())} {name} unwritten"
            assert torch.equal(got.view(torch.int16), want.view(torch.int16)), (
                f"{label}: " + _mismatch(name, got, want, pack))
        assert (dape - ref.dape).abs().max().item() <= DAPE_ATOL, f"{label}: dAPE"


# ----------------------------------------------------------------------------------------
# The forward's other forms (vec 4 columns per thread; 2 or 4 rows per thread) against the
# table's form
# ----------------------------------------------------------------------------------------


def _fwd_form_cases():
    from csagate.kernels.small_schedule import fwd_forms

    return [(ratio, coff, d, sched) for ratio in SMALL_RATIOS for coff in (1, 2)
            for d in (128, 512) for sched in fwd_forms(ratio, coff, d)]


@functools.cache
def _fwd_kernel(d: int, coff: int, ratio: int, sched):
    from csagate.kernels import small
    from csagate.kernels._dsl import device_arch

    return small.build_fwd(d=d, coff=coff, arch=device_arch(), sched=sched, ratio=ratio)


@pytest.mark.parametrize("pack_name", tuple(FORM_PACKS))
@pytest.mark.parametrize("case", _fwd_form_cases(), ids=_form_id)
def test_forward_forms_bitwise_vs_table(case, pack_name):
    """Every row's out (capacity padding rows included) of a forward form is bitwise the
    table form's: each column's softmax and sum run in the same order in every form."""
    from csagate.kernels import small
    from csagate.kernels.small_schedule import small_schedule

    ratio, coff, d, form = case
    lens, pad_rows, pad_tokens = FORM_PACKS[pack_name]
    label = f"{_form_id(case)} {pack_name}"
    pack = _pack(lens, d, coff, ratio, pad_rows=pad_rows, pad_tokens=pad_tokens)
    kv, score, ape, cu, cuc = pack.inputs()
    outs = []
    for sched in (small_schedule("fwd", d, ratio=ratio, coff=coff), form):
        out = torch.full((pack.n_rows, d), float("nan"), dtype=torch.bfloat16, device="cuda")
        small.launch_fwd(_fwd_kernel(d, coff, ratio, sched), kv=kv, score=score, ape=ape,
                         cu=cu, cuc=cuc, out=out)
        outs.append(out)
    torch.cuda.synchronize()
    table, got = outs
    assert not got.isnan().any(), f"{label}: {int(got.isnan().sum())} out slots never written"
    assert torch.equal(got.view(torch.int16), table.view(torch.int16)), (
        f"{label}: out != the table form's; " + _mismatch("out", got, table))
