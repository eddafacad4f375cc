"""GPU: the host API (kernels/api.py) end to end: empty outputs, deterministic mode, CUDA
graph capture and replay with in-place new data, the capture guard, alignment, dAPE
accumulation, explicit streams and devices.

Contract (docs/CONTRACT.md section 4, upstream's TOL): ratio 4 dKV/dScore are bitwise equal to the
fp32 eager reference; ratio 128 grads and every forward meet TOL (n_diff <= max(1,
int(0.001 * numel)), max_abs <= 1.6e-2); dAPE max_abs <= 1e-3 (fp32 atomics).
"""

from __future__ import annotations

import warnings

import csagate.reference as R
import pytest
import torch
from csagate.kernels.cache import CACHE
from csagate.reference.seeds import INPUT_SEED

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("needs_dsl")]

TOL_ABS = 1.6e-2
DAPE_ABS = 1e-3


def api():
    from csagate.kernels import api as A

    return A


# --- diagnostics -----------------------------------------------------------------------


def _where(mask: torch.Tensor, shape) -> str:
    flat = int(mask.reshape(-1).nonzero()[0])
    return str(tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), shape)))


def assert_bitwise(name: str, got: torch.Tensor, ref: torch.Tensor) -> None:
    assert got.shape == ref.shape and got.dtype == ref.dtype, \
        f"{name}: {got.shape}/{got.dtype} vs {ref.shape}/{ref.dtype}"
    if torch.equal(got, ref):
        return
    g, r = got.float(), ref.float()
    diff = (g != r) & ~(g.isnan() & r.isnan())
    first = diff.reshape(-1).nonzero()[0].item()
    raise AssertionError(
        f"{name}: {int(diff.sum())}/{got.numel()} elements differ; first at "
        f"{_where(diff, got.shape)}: got {g.reshape(-1)[first].item()!r} ref "
        f"{r.reshape(-1)[first].item()!r}; max |diff| "
        f"{(g - r).abs().nan_to_num(0.0).max().item():.3g}")


def assert_tol(name: str, got: torch.Tensor, ref: torch.Tensor, max_abs: float = TOL_ABS
               ) -> None:
    assert got.shape == ref.shape, f"{name}: shape {got.shape} vs {ref.shape}"
    g, r = got.float(), ref.float()
    assert not g.isnan().any(), f"{name}: {int(g.isnan().sum())} NaN in the fused result"
    diff = (g - r).abs()
    n_diff = int((g != r).sum())
    allowed = max(1, int(0.001 * got.numel()))
    worst = diff.max().item() if got.numel() else 0.0
    if n_diff <= allowed and worst <= max_abs:
        return
    at = _where(diff == worst, got.shape) if got.numel() else "-"
    raise AssertionError(f"{name}: n_diff {n_diff} (allowed {allowed}), max_abs {worst:.3g} "
                         f"(allowed {max_abs}) at {at}")


def assert_close(name: str, got: torch.Tensor, ref: torch.Tensor, atol: float) -> None:
    worst = (got.double() - ref.double()).abs().max().item() if got.numel() else 0.0
    assert worst <= atol, f"{name}: max |diff| {worst:.3g} > {atol}"


def assert_same_run(tag: str, got, ref) -> None:
    """Two runs of (out, dkv, dscore, dape): bitwise except dAPE (fp32 atomics)."""
    for name, a, b in zip(("out", "dkv", "dscore"), got[:3], ref[:3], strict=True):
        assert_bitwise(f"{tag} {name}", a, b)
    assert_close(f"{tag} dape", got[3], ref[3], DAPE_ABS)


def check_grads(tag: str, ratio: int, got, ref) -> None:
    """(out, dkv, dscore, dape) against the fp32 reference, per the ratio's contract."""
    out, dkv, dscore, dape = got
    assert_tol(f"{tag} out", out, ref.out)
    grad_check = assert_bitwise if ratio == 4 else assert_tol
    grad_check(f"{tag} dkv", dkv, ref.dkv)
    grad_check(f"{tag} dscore", dscore, ref.dscore)
    assert_close(f"{tag} dape", dape, ref.dape, DAPE_ABS)


def cuda_pack(lens, *, ratio, coff, d, seed=INPUT_SEED, pad_rows=0, pad_tokens=0):
    return R.make_pack(lens, ratio=ratio, coff=coff, d=d, seed=seed, pad_rows=pad_rows,
                       pad_tokens=pad_tokens, device="cuda")


def fused(pack, go, **kw):
    A = api()
    args = pack.inputs()
    out = A.forward(*args, ratio=pack.ratio, coff=pack.coff, n_rows=go.shape[0], **kw)
    dkv, dscore, dape = A.backward(*args, go, ratio=pack.ratio, coff=pack.coff, **kw)
    return out, dkv, dscore, dape


def reference(pack_inputs, go, *, ratio, coff):
    return R.backward(*pack_inputs, go, ratio=ratio, coff=coff, precision="fp32")


# --- plain calls -----------------------------------------------------------------------


@pytest.mark.parametrize("ratio,coff,d", [(4, 1, 128), (4, 2, 128), (4, 2, 65), (128, 1, 128),
                                          (128, 2, 512)])
def test_api_matches_reference(ratio, coff, d):
    pack = cuda_pack((1023, 2048, 509), ratio=ratio, coff=coff, d=d, pad_rows=5, pad_tokens=21)
    go = R.make_grad_out(pack.n_rows, d, device="cuda")
    got = fused(pack, go)
    torch.cuda.synchronize()
    check_grads(f"r{ratio} c{coff}d{d}", ratio, got, reference(pack.inputs(), go, ratio=ratio,
                                                               coff=coff))
    mask = R.never_consumed_mask(pack.cu, ratio=ratio, coff=coff, d=d, n_tokens=pack.n_tokens)
    for name, g in (("dkv", got[1]), ("dscore", got[2])):
        nonzero = (g != 0) & mask
        assert not nonzero.any(), f"{name}: {int(nonzero.sum())} never-consumed slots not 0"


def test_run_forms_return_the_dispatched_key():
    A = api()
    from csagate.kernels._dsl import device_arch

    pack = cuda_pack((640, 259), ratio=128, coff=1, d=128)
    go = R.make_grad_out(pack.n_rows, 128, device="cuda")
    out = torch.empty(pack.n_rows, 128, dtype=torch.bfloat16, device="cuda")
    key = A.run_forward(*pack.inputs(), out, ratio=128, coff=1)
    assert key == A.kernel_for("fwd", 128, 1, 128, pack.n_rows, device_arch())
    dkv, dscore = torch.empty_like(pack.kv), torch.empty_like(pack.score)
    dape = torch.zeros_like(pack.ape)
    key = A.run_backward(*pack.inputs(), go, dkv, dscore, dape, ratio=128, coff=1,
                         rows_per_cta=3)
    assert key == A.kernel_for("bwd", 128, 1, 128, pack.n_rows, device_arch())
    torch.cuda.synchronize()
    check_grads("r128 c1d128 R=3", 128, (out, dkv, dscore, dape),
                reference(pack.inputs(), go, ratio=128, coff=1))


@pytest.mark.parametrize("ratio,coff", [(4, 1), (4, 2), (128, 1)])
def test_empty_output(ratio, coff):
    A = api()
    pack = cuda_pack((3, 2, 1), ratio=ratio, coff=coff, d=128)  # every segment < ratio: N = 0
    assert pack.n_rows == 0
    out = A.forward(*pack.inputs(), ratio=ratio, coff=coff)  # n_rows from cuc[-1]
    assert out.shape == (0, 128) and out.dtype == torch.bfloat16 and out.is_cuda
    go = torch.empty(0, 128, dtype=torch.bfloat16, device="cuda")
    dkv, dscore, dape = A.backward(*pack.inputs(), go, ratio=ratio, coff=coff)
    torch.cuda.synchronize()
    for name, g, like in (("dkv", dkv, pack.kv), ("dscore", dscore, pack.score),
                          ("dape", dape, pack.ape)):
        assert g.shape == like.shape and g.dtype == like.dtype, name
        assert int((g != 0).sum()) == 0, f"{name}: nonzero with N == 0"
    assert A.run_forward(*pack.inputs(), out, ratio=ratio, coff=coff) is None


# --- deterministic mode ----------------------------------------------------------------


@pytest.mark.parametrize("coff", [1, 2])
def test_deterministic_mode_follows_torch(coff):
    """Under torch.use_deterministic_algorithms(True) (warn-only too) the backward runs the
    deterministic path: no error, no warning, dKV/dScore bitwise as the default mode, dAPE
    bitwise as an explicit deterministic=True call. tests/gpu/test_deterministic.py has more."""
    A = api()
    pack = cuda_pack((512, 256), ratio=4, coff=coff, d=128)
    go = R.make_grad_out(pack.n_rows, 128, device="cuda")
    args = (*pack.inputs(), go)
    normal = A.backward(*args, ratio=4, coff=coff, deterministic=False)
    explicit = A.backward(*args, ratio=4, coff=coff, deterministic=True)
    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    try:
        for only in (False, True):
            torch.use_deterministic_algorithms(True, warn_only=only)
            A.forward(*pack.inputs(), ratio=4, coff=coff, n_rows=pack.n_rows)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                det = A.backward(*args, ratio=4, coff=coff)
            torch.cuda.synchronize()
            assert not [w for w in caught if issubclass(w.category, RuntimeWarning)]
            assert_bitwise("deterministic dkv", det[0], normal[0])
            assert_bitwise("deterministic dscore", det[1], normal[1])
            assert_bitwise("deterministic dape", det[2], explicit[2])
            assert_close("deterministic dape", det[2], normal[2], DAPE_ABS)
    finally:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)


# --- CUDA graphs -----------------------------------------------------------------------


def _capture_flow(ratio: int, coff: int, d: int, lens, new_lens):
    """Warm up, capture forward+backward through the wrappers at a static capacity, replay.

    Returns (graph, static inputs, static grad_out, captured outputs, step function).
    """
    A = api()
    pack = cuda_pack(lens, ratio=ratio, coff=coff, d=d)
    capacity = pack.n_rows + 8
    kv, score, ape, cu, cuc = (t.clone() for t in pack.inputs())
    go = R.make_grad_out(capacity, d, device="cuda")
    assert sum(new_lens) <= kv.shape[0] and len(new_lens) == len(lens)

    def step():
        out = A.forward(kv, score, ape, cu, cuc, ratio=ratio, coff=coff, n_rows=capacity)
        dkv, dscore, dape = A.backward(kv, score, ape, cu, cuc, go, ratio=ratio, coff=coff)
        return out, dkv, dscore, dape

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up: compiles and loads every kernel the capture will launch
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = step()
    return graph, (kv, score, ape, cu, cuc), go, static, step


def _replay_then_new_data(ratio, coff, d, lens, new_lens):
    graph, inputs, go, static, step = _capture_flow(ratio, coff, d, lens, new_lens)
    tag = f"r{ratio} c{coff}d{d}"
    graph.replay()
    direct = step()
    torch.cuda.synchronize()
    assert_same_run(f"{tag} replay vs direct", static, direct)

    # New data in place: fewer tokens and rows, same capacity; cu/cuc rewritten on the device.
    kv, score, ape, cu, cuc = inputs
    new = cuda_pack(new_lens, ratio=ratio, coff=coff, d=d, seed=99)
    kv[:new.n_tokens].copy_(new.kv)
    score[:new.n_tokens].copy_(new.score)
    ape.copy_(new.ape)
    cu.copy_(new.cu)
    cuc.copy_(new.cuc)
    graph.replay()
    torch.cuda.synchronize()
    ref = reference(inputs, go, ratio=ratio, coff=coff)
    check_grads(f"{tag} replay on new data", ratio, static, ref)
    mask = R.never_consumed_mask(cu, ratio=ratio, coff=coff, d=d, n_tokens=kv.shape[0])
    for name, g in (("dkv", static[1]), ("dscore", static[2])):
        nonzero = (g != 0) & mask
        assert not nonzero.any(), f"{tag} {name}: {int(nonzero.sum())} never-consumed slots != 0"
    direct = step()
    torch.cuda.synchronize()
    assert_same_run(f"{tag} new-data replay vs direct", static, direct)
    return graph, inputs, go, static, step


@pytest.mark.parametrize("coff", [1, 2])
def test_cuda_graph_capture_r4(coff):
    A = api()
    from csagate.kernels._dsl import device_arch

    graph, inputs, go, static, step = _replay_then_new_data(
        4, coff, 128, (512, 256), (384, 128))

    # A first call for a config nothing compiled yet (d=192) is refused under capture...
    other = cuda_pack((64,), ratio=4, coff=coff, d=192)
    key = A.kernel_for("fwd", 4, coff, 192, other.n_rows, device_arch())
    if CACHE.contains(key):
        pytest.skip(f"{key.tag} was compiled by an earlier test")
    refused = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="CUDA graph capture"):
        with torch.cuda.graph(refused):
            A.forward(*other.inputs(), ratio=4, coff=coff, n_rows=other.n_rows)
    assert not CACHE.contains(key)
    # ...and the context still works: eager calls, the earlier graph, the new config eagerly.
    graph.replay()
    direct = step()
    torch.cuda.synchronize()
    assert_same_run("after refused capture: replay vs direct", static, direct)
    go192 = R.make_grad_out(other.n_rows, 192, device="cuda")
    got = fused(other, go192)
    torch.cuda.synchronize()
    check_grads("r4 d192 eager after refused capture", 4, got,
                reference(other.inputs(), go192, ratio=4, coff=coff))


def test_cuda_graph_capture_r128():
    _replay_then_new_data(128, 1, 128, (640, 259), (384, 128))


def test_forward_default_n_rows_is_refused_under_capture():
    A = api()
    pack = cuda_pack((512,), ratio=4, coff=2, d=128)
    A.forward(*pack.inputs(), ratio=4, coff=2)  # warm-up
    g = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="pass n_rows"):
        with torch.cuda.graph(g):
            A.forward(*pack.inputs(), ratio=4, coff=2)


# --- buffers ---------------------------------------------------------------------------


def _misaligned(t: torch.Tensor, elements: int = 2) -> torch.Tensor:
    """A copy of ``t`` whose storage starts ``elements`` elements past a 16-byte boundary."""
    flat = torch.empty(t.numel() + elements, dtype=t.dtype, device=t.device)
    view = flat[elements:].view(t.shape)
    view.copy_(t)
    return view


def test_misaligned_base_pointer_rejected():
    A = api()
    pack = cuda_pack((512, 256), ratio=4, coff=2, d=128)
    kv, score, ape, cu, cuc = pack.inputs()
    with pytest.raises(ValueError, match="kv base pointer .* aligned"):
        A.forward(_misaligned(kv), score, ape, cu, cuc, ratio=4, coff=2, n_rows=pack.n_rows)
    out = _misaligned(torch.empty(pack.n_rows, 128, dtype=torch.bfloat16, device="cuda"))
    with pytest.raises(ValueError, match="out base pointer .* aligned"):
        A.run_forward(kv, score, ape, cu, cuc, out, ratio=4, coff=2)
    go = R.make_grad_out(pack.n_rows, 128, device="cuda")
    with pytest.raises(ValueError, match="dape base pointer .* aligned"):
        A.run_backward(kv, score, ape, cu, cuc, go, torch.empty_like(kv),
                       torch.empty_like(score), _misaligned(torch.zeros_like(ape), 1),
                       ratio=4, coff=2)
    # int32 offsets need 4 bytes only: one element past a 16-byte boundary is fine.
    A.forward(kv, score, ape, _misaligned(cu, 1), _misaligned(cuc, 1), ratio=4, coff=2,
              n_rows=pack.n_rows)


def test_dape_accumulates():
    """The kernel only adds into dape: the caller zeroes it (run_backward); backward()
    hands back a fresh zeroed one."""
    A = api()
    pack = cuda_pack((640, 259), ratio=128, coff=1, d=128)
    go = R.make_grad_out(pack.n_rows, 128, device="cuda")
    ref = reference(pack.inputs(), go, ratio=128, coff=1)
    dkv, dscore = torch.empty_like(pack.kv), torch.empty_like(pack.score)
    dape = torch.zeros_like(pack.ape)
    for _ in range(2):
        A.run_backward(*pack.inputs(), go, dkv, dscore, dape, ratio=128, coff=1)
    torch.cuda.synchronize()
    assert_close("2 run_backward calls: dape vs 2 x ref", dape, 2 * ref.dape, 2e-3)

    dape.zero_()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        A.run_backward(*pack.inputs(), go, dkv, dscore, dape, ratio=128, coff=1)
    graph.replay()
    graph.replay()
    torch.cuda.synchronize()
    assert_close("2 replays: dape vs 2 x ref", dape, 2 * ref.dape, 2e-3)

    for _ in range(2):
        fresh = A.backward(*pack.inputs(), go, ratio=128, coff=1)[2]
    torch.cuda.synchronize()
    assert_close("backward(): fresh dape vs ref", fresh, ref.dape, DAPE_ABS)


def test_explicit_stream_input_lifetime():
    """Inputs freed on the current stream while the kernel is still queued on another one
    must not be recycled under it (the API records them on the launch stream)."""
    A = api()
    pack = cuda_pack((2048, 1024), ratio=4, coff=2, d=128)
    expected = A.forward(*pack.inputs(), ratio=4, coff=2, n_rows=pack.n_rows)
    torch.cuda.synchronize()
    inputs = [t.clone() for t in pack.inputs()]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)  # hold the side stream while the host races ahead
    out = A.forward(*inputs, ratio=4, coff=2, n_rows=pack.n_rows, stream=side)
    shapes = [(t.shape, t.dtype) for t in inputs]
    del inputs
    junk = [torch.full(s, 7, dtype=dt, device="cuda") for s, dt in shapes]
    side.synchronize()
    torch.cuda.synchronize()
    assert_bitwise("forward on an explicit stream after its inputs were freed", out, expected)
    del junk


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize("ratio,coff,d", [(4, 2, 128), (128, 1, 128), (128, 2, 512)])
def test_launch_is_anchored_to_the_tensors_device(ratio, coff, d):
    """Tensors on cuda:0 with cuda:1 current, and tensors on cuda:1 with cuda:0 current: each
    launch runs on the tensors' device (twice: the first call of a signature takes the full
    path, the second the fast one) and gives the bits of the native launch."""
    pack = cuda_pack((1023, 2048, 509), ratio=ratio, coff=coff, d=d)
    go = R.make_grad_out(pack.n_rows, d, device="cuda")
    native = fused(pack, go)
    torch.cuda.synchronize()
    for _ in range(2):
        with torch.cuda.device(1):
            foreign = fused(pack, go)
        torch.cuda.synchronize()
        assert foreign[0].abs().sum() > 0 and foreign[0].device.index == 0
        assert_same_run("launch with cuda:1 current", foreign, native)
    A = api()
    args1 = [t.to("cuda:1") for t in pack.inputs()]
    go1 = go.to("cuda:1")
    for _ in range(2):
        with torch.cuda.device(0):
            out = A.forward(*args1, ratio=ratio, coff=coff, n_rows=go1.shape[0])
            grads = A.backward(*args1, go1, ratio=ratio, coff=coff)
        torch.cuda.synchronize(1)
        assert all(t.device.index == 1 for t in (out, *grads))
        assert_same_run("tensors on cuda:1, cuda:0 current",
                        [t.to("cuda:0") for t in (out, *grads)], native)


def test_build_loads_every_bucket_for_capture():
    A = api()
    records = A.build(128, coff=2, d=128)
    assert len(records) == 4  # c2d128: 2 forward + 2 backward kernels
    again = A.build(128, coff=2, d=128, n_rows=64)
    assert len(again) == 2 and all(r.hit for r in again)


@pytest.mark.parametrize("coff,d,lens", [(1, 128, (8192,)), (2, 512, (1023, 2048, 509))])
def test_schedule_launcher_runs_the_given_schedule(coff, d, lens):
    """The A/B launcher with the dispatched schedule reproduces the API bitwise."""
    from csagate.kernels import schedule as S
    from csagate.perf import bench as B

    pack = cuda_pack(lens, ratio=128, coff=coff, d=d)
    go = R.make_grad_out(pack.n_rows, d, device="cuda")
    via_api = fused(pack, go)
    from csagate.kernels._dsl import device_arch

    arch = device_arch()  # the API dispatches through this device's tables
    fwd = B.schedule_launcher("fwd", pack, go, S.select_fwd(coff, d, pack.n_rows, arch))
    bwd = B.schedule_launcher("bwd", pack, go, S.select_bwd(coff, d, pack.n_rows, arch))
    fwd()
    bwd()
    torch.cuda.synchronize()
    assert_same_run(f"schedule_launcher c{coff}d{d}", (*fwd.buffers, *bwd.buffers), via_api)


# --- check=True: the cu/cuc values -------------------------------------------------------


@pytest.mark.parametrize("ratio,coff,d,lens", [(128, 1, 128, (300, 129, 0)), (4, 2, 128, (9, 3))])
def test_check_passes_a_pack_and_refuses_bad_offsets_before_launching(ratio, coff, d, lens):
    """check=True reads cu/cuc: a valid pack gives the unchecked call's bits; a cuc whose
    segment row count is off, or a non-monotonic cu, is a one-line ValueError and nothing
    launches (the NaN-filled out stays NaN)."""
    A = api()
    pack = cuda_pack(lens, ratio=ratio, coff=coff, d=d, pad_rows=1)
    go = R.make_grad_out(pack.n_rows, d, device="cuda")
    checked = fused(pack, go, check=True)
    torch.cuda.synchronize()
    assert_same_run("check=True", checked, fused(pack, go))
    kv, score, ape, cu, cuc = pack.inputs()
    bad_cuc = cuc.clone()
    bad_cuc[1:] += 1  # one row too many in segment 0
    bad_cu = cu.clone()
    bad_cu[1] = cu[2] + 1  # cu[1] > cu[2]
    for args, rule in (((kv, score, ape, cu, bad_cuc), "cu_seqlens_comp\\[1\\] - "),
                       ((kv, score, ape, bad_cu, cuc), "non-decreasing")):
        out = torch.full((pack.n_rows + 1, d), float("nan"), dtype=torch.bfloat16,
                         device="cuda")
        with pytest.raises(ValueError, match=rule):
            A.run_forward(*args, out, ratio=ratio, coff=coff, check=True)
        with pytest.raises(ValueError, match=rule):
            A.backward(*args, go, ratio=ratio, coff=coff, check=True)
        torch.cuda.synchronize()
        assert torch.isnan(out.float()).all()


def test_the_deterministic_reduction_is_a_compile_cache_entry():
    """The dAPE reduction compiles through kernels/cache.py (one ReduceKey per arch)."""
    from csagate.kernels._dsl import device_arch
    from csagate.kernels.registry import ReduceKey

    A = api()
    pack = cuda_pack((512,), ratio=128, coff=1, d=128)
    go = R.make_grad_out(pack.n_rows, 128, device="cuda")
    A.backward(*pack.inputs(), go, ratio=128, coff=1, deterministic=True)
    torch.cuda.synchronize()
    assert CACHE.contains(ReduceKey(device_arch()))
