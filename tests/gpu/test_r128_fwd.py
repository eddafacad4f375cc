"""GPU: the ratio=128 forward kernel against the eager references, every schedule.

Each forward table schedule is built and launched directly (regardless of the bucket
its N would select) on packs that stress the row/segment/window indexing, and held to the
contract's three gates (docs/CONTRACT.md section 4.2):

* G1: 3 runs into fresh buffers (zero-filled, NaN-filled, NaN-filled) are bitwise equal
  and NaN-free, so every output slot is written and the result is deterministic;
* G2: against the fp32 eager reference, n_diff <= max(1, int(0.001 * numel)) and
  max_abs <= 1.6e-2;
* G3: against the fp64 oracle, max|fused - fp64| <= max|eager - fp64| * (1 + 1e-6) + 1e-4.

Plus the overflow case (score + ape = +inf in fp32): all-NaN output, like the reference.

``VARIANTS`` (the table kernels' plain twins, ``kernel_variants.fwd_twin``) run the same gates,
and each table kernel with a twin is bitwise equal to it: the vec=2 unroll-4 plain kernel with
the same tchunks, two-phase choice and fastexp. Chunk boundaries, per-slot math and merge
order do not depend on vec, unroll, prefetch or the one-exp step, so any difference is an
indexing or pipelining bug (or an exp that is not 1 at 0).
"""

from __future__ import annotations

import functools

import csagate.reference as R
import pytest
import torch
from csagate.kernels.schedule import RATIO, FwdSchedule, config_name
from kernel_variants import FWD_KERNELS as KERNELS
from kernel_variants import FWD_TWINS

pytestmark = pytest.mark.gpu

VARIANTS = list(dict.fromkeys((cfg, twin) for cfg, _, twin in FWD_TWINS
                               if (cfg, twin) not in KERNELS))
VARIANT_IDS = [f"{config_name(*c)}-{s.tag}" for c, s in VARIANTS]
TWIN_IDS = [f"{config_name(*c)}-{s.tag}" for c, s, _ in FWD_TWINS]

EDGEPACK = (127, 8192, 0, 129, 128, 3, 515, 1024)  # short, empty, exact-128, tails
RAGGED3 = (1023, 2048, 509)
PACKS = {
    # name: (segment lengths, capacity padding rows, token padding rows)
    "1x8192": ((8192,), 0, 0),
    "ragged3": (RAGGED3, 0, 0),
    "edgepack": (EDGEPACK, 0, 0),
    "ragged3_pad8_tok21": (RAGGED3, 8, 21),
}
CASES = [(cfg, sched, name) for cfg, sched in KERNELS + VARIANTS for name in PACKS]
IDS = [f"{config_name(*cfg)}-{sched.tag}-{name}" for cfg, sched, name in CASES]


@functools.cache
def compiled(coff: int, d: int, sched: FwdSchedule):
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not importable")
    from csagate.kernels._dsl import device_arch
    from csagate.kernels.r128_fwd import build_fwd

    return build_fwd(d=d, coff=coff, sched=sched, arch=device_arch())


@functools.cache
def pack_and_refs(coff: int, d: int, name: str):
    lens, pad_rows, pad_tokens = PACKS[name]
    pack = R.make_pack(lens, ratio=RATIO, coff=coff, d=d, pad_rows=pad_rows,
                       pad_tokens=pad_tokens, device="cuda")
    kw = dict(ratio=RATIO, coff=coff, n_rows=pack.n_rows)
    ref32 = R.forward(*pack.inputs(), precision="fp32", **kw)
    ref64 = R.forward(*pack.inputs(), precision="fp64", **kw)
    return pack, ref32, ref64


def run_fused(coff: int, d: int, sched: FwdSchedule, pack, fill: float) -> torch.Tensor:
    from csagate.kernels.r128_fwd import launch_fwd

    out = torch.full((pack.n_rows, d), fill, dtype=torch.bfloat16, device="cuda")
    kv, score, ape, cu, cuc = pack.inputs()
    launch_fwd(compiled(coff, d, sched), sched=sched, kv=kv, score=score, ape=ape, cu=cu,
               cuc=cuc, out=out)
    torch.cuda.synchronize()
    return out


def first_index(mask: torch.Tensor):
    idx = mask.nonzero()
    return tuple(idx[0].tolist()) if idx.numel() else None


def describe(out: torch.Tensor, ref: torch.Tensor, mask: torch.Tensor) -> str:
    at = first_index(mask)
    if at is None:
        return "no differing element"
    return (f"{int(mask.sum())} of {mask.numel()} differ; first at (row, col) = {at}: "
            f"fused {out[at].item()!r} vs ref {ref[at].item()!r}")


@pytest.mark.parametrize("cfg,sched,name", CASES, ids=IDS)
def test_forward_gates(cfg, sched, name):
    coff, d = cfg
    pack, ref32, ref64 = pack_and_refs(coff, d, name)
    assert ref32.shape == (pack.n_rows, d)
    assert not torch.isnan(ref32).any(), "reference has NaN: the case is not finite"

    # G1: determinism, every slot written, no NaN.
    runs = [run_fused(coff, d, sched, pack, fill) for fill in (0.0, float("nan"), float("nan"))]
    bits = [r.view(torch.int16) for r in runs]
    for k in (1, 2):
        neq = bits[k] != bits[0]
        assert not neq.any(), f"G1: run {k} (NaN-filled) != run 0 (zero-filled): " + describe(
            runs[k], runs[0], neq)
    out = runs[0]
    nan = torch.isnan(out)
    assert not nan.any(), f"G1: {int(nan.sum())} NaN outputs, first at {first_index(nan)}"

    # G2: tolerance vs the fp32 eager reference.
    diff = (out.float() - ref32.float()).abs()
    neq = out.float() != ref32.float()
    n_diff, allowed = int(neq.sum()), max(1, int(0.001 * out.numel()))
    max_abs = diff.max().item()
    assert n_diff <= allowed, f"G2: n_diff {n_diff} > {allowed}; " + describe(out, ref32, neq)
    worst = first_index(diff == max_abs)
    assert max_abs <= 1.6e-2, (f"G2: max_abs {max_abs:.3e} > 1.6e-2 at {worst}: fused "
                               f"{out[worst].item()!r} vs ref {ref32[worst].item()!r}")

    # G3: parity with the fp64 oracle.
    err_fused = (out.double() - ref64).abs().max().item()
    err_eager = (ref32.double() - ref64).abs().max().item()
    bound = err_eager * (1 + 1e-6) + 1e-4
    assert err_fused <= bound, (f"G3: max|fused-fp64| {err_fused:.4e} > bound {bound:.4e} "
                                f"(max|eager-fp64| {err_eager:.4e}); n_diff vs fp32 {n_diff}")


@pytest.mark.parametrize("cfg,sched", KERNELS + VARIANTS,
                         ids=[f"{config_name(*c)}-{s.tag}" for c, s in KERNELS] + VARIANT_IDS)
def test_overflow_gives_nan_like_eager(cfg, sched):
    """kv = 1, score = bf16 max, ape = fp32 max: fp32 s = +inf, so out is NaN (inf - inf).

    The contract's case is c1d128; every schedule runs it here to cover the two-phase form,
    fast exp and the coff=2 merge with a skipped first half.
    """
    coff, d = cfg
    pack, _ = R.overflow_pack(coff=coff, d=d, device="cuda")
    ref32 = R.forward(*pack.inputs(), ratio=RATIO, coff=coff, precision="fp32")
    assert torch.isnan(ref32).all(), "the fp32 reference must be all NaN in this case"
    ref64 = R.forward(*pack.inputs(), ratio=RATIO, coff=coff, precision="fp64")
    assert torch.isfinite(ref64).all(), "the fp64 oracle must stay finite"
    runs = [run_fused(coff, d, sched, pack, fill) for fill in (0.0, float("nan"))]
    for fill, out in zip((0.0, "NaN"), runs, strict=True):
        finite = ~torch.isnan(out)
        at = first_index(finite)
        assert at is None, (f"{int(finite.sum())} non-NaN outputs ({fill}-filled run), first "
                            f"at {at}: {out[at].item()!r}")
    # G1 on NaN outputs compares bit patterns (NaN != NaN as floats).
    neq = runs[0].view(torch.int16) != runs[1].view(torch.int16)
    assert not neq.any(), f"NaN bit patterns differ between runs at {first_index(neq)}"


@pytest.mark.parametrize("name", list(PACKS))
@pytest.mark.parametrize("cfg,sched,base", FWD_TWINS, ids=TWIN_IDS)
def test_kernel_is_bitwise_its_twin(cfg, sched, base, name):
    """vec, unroll, prefetch and the one-exp step change no bit: same chunks, same math."""
    coff, d = cfg
    pack, _, _ = pack_and_refs(coff, d, name)
    out = run_fused(coff, d, sched, pack, float("nan"))
    ref = run_fused(coff, d, base, pack, float("nan"))
    neq = out.view(torch.int16) != ref.view(torch.int16)
    assert not neq.any(), f"{sched.tag} vs its twin {base.tag}: " + describe(out, ref, neq)
