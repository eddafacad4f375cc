"""GPU: the launch fast path (kernels/launch.py).

A call whose signature has launched before skips the Python validation. These tests pin what
that must not change: the same bits as the full path (dAPE bitwise in the deterministic
mode), the api's one-line errors for bad input arriving at a remembered signature, the
per-call rules the compiled checks cannot see, and that only default launches are remembered.
"""

from __future__ import annotations

import csagate.reference as R
import pytest
import torch
from csagate.kernels import launch
from csagate.kernels.launch import FAST

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("needs_dsl")]

# (ratio, coff, d, segment lengths, pad rows)
CASES = [(128, 1, 128, (3000, 129, 4000), 2), (128, 2, 512, (2048, 777), 0),
         (4, 2, 128, (512, 3, 257), 1)]


@pytest.fixture
def api():
    from csagate.kernels import api

    launch.FAST.clear()
    yield api
    launch.FAST.clear()
    launch.PARTIALS_FILL = None


def _pack(ratio, coff, d, lens, pad_rows):
    pack = R.make_pack(lens, ratio=ratio, coff=coff, d=d, pad_rows=pad_rows, device="cuda")
    return pack, R.make_grad_out(pack.n_rows, d, device="cuda")


def _sig(direction, deterministic, pack, kv):
    return (direction, deterministic, pack.ratio, pack.coff, kv.shape[1], kv.get_device(),
            pack.n_rows)


def _calls(api, pack, go, deterministic):
    args = pack.inputs()
    kw = dict(ratio=pack.ratio, coff=pack.coff)
    out = api.forward(*args, n_rows=pack.n_rows, **kw)
    grads = api.backward(*args, go, deterministic=deterministic, **kw)
    torch.cuda.synchronize()
    return (out, *grads)


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("ratio,coff,d,lens,pad_rows", CASES)
def test_fast_path_gives_the_full_paths_bits(api, ratio, coff, d, lens, pad_rows,
                                             deterministic):
    pack, go = _pack(ratio, coff, d, lens, pad_rows)
    kv = pack.inputs()[0]
    assert _sig("fwd", False, pack, kv) not in FAST
    full = _calls(api, pack, go, deterministic)  # full path; remembers the signatures
    assert _sig("fwd", False, pack, kv) in FAST and _sig("bwd", deterministic, pack, kv) in FAST
    if deterministic:
        launch.PARTIALS_FILL = float("nan")  # the fast path too writes every partials slot
    fast = _calls(api, pack, go, deterministic)
    for name, a, b in zip(("out", "dkv", "dscore"), full, fast, strict=False):
        assert torch.equal(a, b), f"{name}: {int((a != b).sum())} differ fast vs full"
    if deterministic:
        assert torch.equal(full[3], fast[3]), "deterministic dAPE differs fast vs full"
    else:
        torch.testing.assert_close(fast[3], full[3], rtol=0, atol=1e-3)
    # run_forward / run_backward take the same entries
    out = torch.full_like(full[0], float("nan"))
    api.run_forward(*pack.inputs(), out, ratio=ratio, coff=coff)
    torch.cuda.synchronize()
    assert torch.equal(out, full[0])


def _bad(kv, score, ape, cu, cuc):
    """Bad inputs at a remembered signature, with the api's message for each."""
    yield "ape must be torch.float32", (kv, score, ape.half(), cu, cuc)
    yield "score must be contiguous", (kv, score.t().contiguous().t(), ape, cu, cuc)
    yield "kv must be a torch.Tensor", (kv.tolist(), score, ape, cu, cuc)
    yield "cu_seqlens must be 1-D with B + 1 >= 2", (kv, score, ape, cu[:1], cuc[:1])
    yield "cu_seqlens_comp must be torch.int32", (kv, score, ape, cu, cuc.long())


@pytest.mark.parametrize("ratio,coff,d,lens,pad_rows", CASES[:1] + CASES[2:])
def test_bad_input_at_a_remembered_signature_gets_the_api_error(api, ratio, coff, d, lens,
                                                                 pad_rows):
    pack, go = _pack(ratio, coff, d, lens, pad_rows)
    _calls(api, pack, go, False)
    kw = dict(ratio=ratio, coff=coff)
    for message, args in _bad(*pack.inputs()):
        with pytest.raises(ValueError, match=message.replace("+", r"\+")):
            api.forward(*args, n_rows=pack.n_rows, **kw)
        with pytest.raises(ValueError, match=message.replace("+", r"\+")):
            api.backward(*args, go, **kw)


def test_too_few_tokens_at_a_remembered_signature(api):
    pack, go = _pack(128, 1, 128, (1024,), 0)
    _calls(api, pack, go, False)
    kv, score, ape, cu, cuc = pack.inputs()
    with pytest.raises(ValueError, match="requires at least ratio=128 tokens"):
        api.forward(kv[:100], score[:100], ape, cu, cuc, ratio=128, coff=1,
                    n_rows=pack.n_rows)


def test_explicit_rows_per_cta_is_not_remembered(api):
    from csagate.kernels._dsl import sm_count
    from csagate.kernels.schedule import rows_per_cta

    pack, go = _pack(128, 2, 128, (8192,), 0)
    kv, score, ape, cu, cuc = pack.inputs()
    dkv, dscore, dape = torch.empty_like(kv), torch.empty_like(score), torch.zeros_like(ape)
    key = api.run_backward(kv, score, ape, cu, cuc, go, dkv, dscore, dape, ratio=128, coff=2,
                           rows_per_cta=3)
    assert _sig("bwd", False, pack, kv) not in FAST
    api.run_backward(kv, score, ape, cu, cuc, go, dkv, dscore, dape.zero_(), ratio=128, coff=2)
    entry = FAST[_sig("bwd", False, pack, kv)]
    want = rows_per_cta(pack.n_rows, 128, 2, key.schedule, sm_count(kv.get_device()))
    assert entry.tail == (want,)


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("ratio,coff,d,lens,pad_rows", CASES)
def test_zero_dape_writes_dape_whatever_it_held(api, ratio, coff, d, lens, pad_rows,
                                                 deterministic):
    """``zero_dape=True`` (what api.backward uses, the launch zeroes dAPE first): a NaN-filled
    dape comes out as the accumulating path's result into zeros, on the full path (first call)
    and the fast path (second); the deterministic mode's bitwise, the atomics' within their
    reordering. dkv/dscore do not depend on the flag."""
    pack, go = _pack(ratio, coff, d, lens, pad_rows)
    args = pack.inputs()
    kw = dict(ratio=ratio, coff=coff, deterministic=deterministic)

    def run(fill, zero_dape):
        dkv, dscore = torch.empty_like(args[0]), torch.empty_like(args[1])
        dape = torch.full_like(args[2], fill)
        api.run_backward(*args, go, dkv, dscore, dape, zero_dape=zero_dape, **kw)
        torch.cuda.synchronize()
        return dkv, dscore, dape

    want = run(0.0, False)
    for path in ("full", "fast"):
        if path == "fast":
            assert _sig("bwd", deterministic, pack, args[0]) in FAST
        got = run(float("nan"), True)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), path
        assert not got[2].isnan().any(), f"{path}: dape slots left unwritten"
        if deterministic:
            assert torch.equal(got[2], want[2]), f"{path}: deterministic dAPE differs"
        else:
            torch.testing.assert_close(got[2], want[2], rtol=0, atol=1e-3)
    # api.backward: a fresh dAPE from an uninitialized buffer, equal to the same
    grads = api.backward(*args, go, **kw)
    torch.cuda.synchronize()
    assert torch.equal(grads[0], want[0]) and torch.equal(grads[1], want[1])
    if deterministic:
        assert torch.equal(grads[2], want[2])
    else:
        torch.testing.assert_close(grads[2], want[2], rtol=0, atol=1e-3)


def test_zero_dape_with_no_rows_zeroes_dape(api):
    pack, _ = _pack(128, 1, 128, (3000,), 0)
    args = pack.inputs()
    go = torch.empty(0, 128, dtype=torch.bfloat16, device="cuda")
    dkv, dscore = torch.empty_like(args[0]), torch.empty_like(args[1])
    dape = torch.full_like(args[2], float("nan"))
    assert api.run_backward(*args, go, dkv, dscore, dape, ratio=128, coff=1,
                            zero_dape=True) is None
    torch.cuda.synchronize()
    assert bool((dape == 0).all())
    kept = torch.full_like(args[2], 3.0)
    api.run_backward(*args, go, dkv, dscore, kept, ratio=128, coff=1)
    torch.cuda.synchronize()
    assert bool((kept == 3.0).all()), "zero_dape=False (default) must leave dape alone"
