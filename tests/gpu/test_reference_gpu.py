"""The reference on the GPU (docs/CONTRACT.md section 3.1): its bits do not depend on the
device except through ``exp``, and the small-ratio kernels are bitwise to it at head dims
no named case uses.

* ``exp``: torch.exp on the CPU and CUDA's expf compared over every fp32 argument the
  reference can hand it (``s - m`` in [-104, 0]); the measured count is printed (``-s``) and
  CONTRACT section 3.1 quotes it.
* the reference on the CPU and on the GPU: the same bits, except in windows that hold an exp
  argument on which the two exps differ.
* the kernels (``csagate.kernels.api``) against the reference: out, dKV and dScore bitwise
  (bit patterns) over a sweep of head dims at every small ratio, on ragged packs with
  capacity rows and token padding.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

CHUNK = 1 << 26


def _negative_floats(hi_bits: int, start: int):
    """fp32 values with bit patterns [start, min(start + CHUNK, hi)) in the negative range."""
    bits = torch.arange(start, min(start + CHUNK, hi_bits), dtype=torch.int64)
    return (bits - (1 << 32)).to(torch.int32).view(torch.float32)


def test_exp_cpu_and_cuda_differ_within_their_error_bounds():
    """Every fp32 x in [-104, -0]: torch.exp on the CPU vs on CUDA. CUDA's expf is within 2 ulp
    of exp (CUDA C++ Programming Guide), a vectorized libm expf within 1, so they differ by at
    most 3 ulp (measured on the H200 host: at most 2, on 9.2% of the arguments)."""
    lo = 0x80000000                      # -0.0
    hi = int(torch.tensor(-104.0).view(torch.int32)) + (1 << 32) + 1
    n_diff = n_total = 0
    worst = 0
    for start in range(lo, hi, CHUNK):
        x = _negative_floats(hi, start)
        cpu = torch.exp(x).view(torch.int32).long()
        gpu = torch.exp(x.cuda()).cpu().view(torch.int32).long()
        diff = (cpu - gpu).abs()
        n_diff += int((diff != 0).sum())
        worst = max(worst, int(diff.max()))
        n_total += x.numel()
    print(f"\nexp: {n_diff} of {n_total} fp32 arguments in [-104, 0] differ CPU vs CUDA "
          f"(at most {worst} ulp), torch {torch.__version__}")
    assert worst <= 3


def _tainted(pack, device_a, device_b):
    """(N, d) windows of ``pack`` holding an exp argument on which the two devices differ."""
    from csagate.reference import compressor as C

    slots = C._slots(pack.cu, pack.cuc, pack.n_rows, pack.ratio, pack.coff)
    s, _ = C._windows(pack.kv, pack.score, pack.ape, slots, pack.coff, torch.float32)
    m = s[0]
    for k in range(1, s.shape[0]):
        m = torch.where(s[k] > m, s[k], m)
    x = s - m
    a = torch.exp(x.to(device_a)).cpu()
    b = torch.exp(x.to(device_b)).cpu()
    return (a.view(torch.int32) != b.view(torch.int32)).any(dim=0), slots


@pytest.mark.parametrize("lens,ratio,coff,d", [
    ((1023, 2048, 509), 4, 2, 128),
    ((300, 1089, 701), 32, 2, 64),
    ((8192,), 128, 2, 128),
    ((127, 515, 0, 129, 3), 16, 1, 96),
])
def test_reference_cpu_and_gpu_differ_only_where_exp_does(lens, ratio, coff, d):
    from csagate.gates.comparators import bit_view
    from csagate.reference import backward, make_grad_out, make_pack
    from csagate.reference.compressor import _scatter

    pack = make_pack(lens, ratio=ratio, coff=coff, d=d, pad_rows=3, pad_tokens=7, seed=99)
    go = make_grad_out(pack.n_rows, d, seed=98)
    cpu = backward(*pack.inputs(), go, ratio=ratio, coff=coff)
    dev = make_pack(lens, ratio=ratio, coff=coff, d=d, pad_rows=3, pad_tokens=7, seed=99,
                    device="cuda")
    gpu = backward(*dev.inputs(), go.cuda(), ratio=ratio, coff=coff)
    tainted, slots = _tainted(pack, "cpu", "cuda")
    out_diff = bit_view(cpu.out) != bit_view(gpu.out.cpu())
    assert not (out_diff & ~tainted).any()
    n_valid = pack.n_valid_rows
    reach = tainted[None, :n_valid].expand(slots.token.shape[0], -1, -1)
    slot_tainted = torch.zeros((pack.kv.shape[0], coff, d), dtype=torch.bfloat16)
    _scatter(slot_tainted, reach.to(torch.bfloat16), slots.rows(0, n_valid))
    slot_tainted = slot_tainted.view(pack.kv.shape) != 0
    for name in ("dkv", "dscore"):
        differs = bit_view(getattr(cpu, name)) != bit_view(getattr(gpu, name).cpu())
        assert not (differs & ~slot_tainted).any(), name
    print(f"\n{lens} r{ratio} c{coff}d{d}: {int(tainted.sum())} windows with an exp that "
          f"differs; out differs at {int(out_diff.sum())}")


def _head_dims(ratio: int, coff: int):
    dims = (4, 8, 12, 24, 36, 48, 64, 65, 72, 96, 100, 128, 130, 192, 256, 320, 512)
    from csagate.kernels.small_schedule import config_problems

    return [d for d in dims if not config_problems(ratio, coff, d)]


SWEEP = [(r, c, d) for r in (2, 4, 8, 16, 32) for c in (1, 2) for d in _head_dims(r, c)]


@pytest.mark.parametrize("ratio,coff,d", SWEEP, ids=[f"r{r}-c{c}d{d}" for r, c, d in SWEEP])
def test_small_kernels_bitwise_to_the_reference_at_every_head_dim(ratio, coff, d, needs_dsl):
    from csagate.gates.comparators import bitwise
    from csagate.kernels import api
    from csagate.reference import backward, make_grad_out, make_pack

    lens = (0, 1089, 3, 2 * ratio, 701)
    pack = make_pack(lens, ratio=ratio, coff=coff, d=d, pad_rows=3, pad_tokens=37,
                     seed=ratio * 1000 + d, scale=8.0 if d % 3 == 0 else 1.0, device="cuda")
    go = make_grad_out(pack.n_rows, d, seed=d, device="cuda")
    out = api.forward(*pack.inputs(), ratio=ratio, coff=coff, n_rows=pack.n_rows)
    dkv, dscore, _ = api.backward(*pack.inputs(), go, ratio=ratio, coff=coff)
    ref = backward(*pack.inputs(), go, ratio=ratio, coff=coff)
    for name, got, want in (("out", out, ref.out), ("dkv", dkv, ref.dkv),
                            ("dscore", dscore, ref.dscore)):
        found = bitwise(got, want)
        assert found.ok, f"{name}: {found.summary()}"


@pytest.mark.parametrize("ratio,coff,d", [(4, 2, 128), (4, 1, 512), (32, 2, 128), (128, 1, 128),
                                          (128, 2, 512), (16, 1, 128)])
def test_torch_eager_happens_to_be_the_reference_at_wide_heads(ratio, coff, d):
    """A measured property of torch's CUDA kernels (CONTRACT section 3.2), not the definition:
    at d >= 128 (and windows of at most 64 positions, or any window at d > 64) torch's fp32
    eager softmax reduces serially along the window, so its dKV and dScore are the
    reference's bits."""
    from csagate.gates.comparators import bitwise
    from csagate.reference import backward, make_grad_out, make_pack
    from csagate.reference.compressor import _torch_eager_backward

    pack = make_pack((1023, 2048, 509), ratio=ratio, coff=coff, d=d, device="cuda")
    go = make_grad_out(pack.n_rows, d, device="cuda")
    ref = backward(*pack.inputs(), go, ratio=ratio, coff=coff)
    torch_eager = _torch_eager_backward(*pack.inputs(), go, ratio=ratio, coff=coff,
                                        precision="fp32")
    for name in ("dkv", "dscore"):
        found = bitwise(getattr(torch_eager, name), getattr(ref, name))
        assert found.ok, f"{name}: {found.summary()}"
