"""The torch op on the GPU (the ``gpu`` marker; run on an H100 or H200): opcheck, gradients equal to
the api's on the eager path (the autograd.Function) and on the custom ops' path (a dispatch
mode, the ops' own register_autograd), deterministic mode, ape.grad across calls,
torch.compile(fullgraph=True) training steps (backed and unbacked row counts), CUDA-graph
capture after a warm-up, the environment stream and an explicit stream, the api's one-line
errors through the op, and on two GPUs the launch anchored to the tensors' device. dAPE is
compared within 1e-5 (fp32 atomics: not bitwise run to run) except in deterministic mode; out,
dKV and dScore bitwise."""

from __future__ import annotations

import csagate.kernels.api as A
import csagate.reference as R
import pytest
import torch
from csagate.kernels import ops

pytestmark = pytest.mark.gpu

DEV = torch.device("cuda")
CONFIGS = [(128, 1, 128), (128, 2, 128), (128, 1, 512), (128, 2, 512), (4, 2, 128), (4, 1, 65)]


def pack(ratio, coff, d, lens=(8192 + 37, 300, 0, 129), pad_rows=2, seed=0):
    p = R.make_pack(lens, ratio=ratio, coff=coff, d=d, pad_rows=pad_rows, pad_tokens=5,
                    seed=seed, device=DEV)
    return p


def grad_out(p, seed=1):
    return R.make_grad_out(p.n_rows, p.d, seed=seed, device=DEV)


def _dape_close(a, b, what):
    """dAPE of two runs: fp32 atomics in a run-dependent order, so a few ulps of the largest
    values apart (seen on the H200: 1.5e-5 on ratio=4 c2d128 at 8.4k tokens)."""
    same = torch.equal(a, b)
    if not same:
        err = (a - b).abs().max().item()
        assert err <= 1e-6 * max(1.0, a.abs().max().item()) + 1e-5, (what, err)
    return same


# --- the op -----------------------------------------------------------------------------


@pytest.mark.parametrize("ratio, coff, d", CONFIGS[:2] + CONFIGS[4:5])
def test_opcheck(ratio, coff, d):
    p = pack(ratio, coff, d, lens=(300, 129))
    kv, score, ape, cu, cuc = p.inputs()
    for t in (kv, score, ape):
        t.requires_grad_(True)
    torch.library.opcheck(torch.ops.csagate.csa_compress_fwd.default,
                          (kv, score, ape, cu, cuc, ratio, coff, p.n_rows))
    torch.library.opcheck(torch.ops.csagate.csa_compress_fwd.default,
                          (kv, score, ape, cu, cuc, ratio, coff, None))
    go = grad_out(p)
    torch.library.opcheck(torch.ops.csagate.csa_compress_bwd.default,
                          (kv.detach(), score.detach(), ape.detach(), cu, cuc, go, ratio, coff))


@pytest.mark.parametrize("ratio, coff, d", CONFIGS)
def test_op_eager_grads_equal_api(ratio, coff, d):
    p = pack(ratio, coff, d)
    kv, score, ape, cu, cuc = (t.clone() for t in p.inputs())
    for t in (kv, score, ape):
        t.requires_grad_(True)
    out = ops.csa_compress(kv, score, ape, cu, cuc, ratio=ratio, coff=coff, n_rows=p.n_rows)
    go = grad_out(p)
    out.backward(go)
    ref_out = A.forward(*p.inputs(), ratio=ratio, coff=coff, n_rows=p.n_rows)
    dkv, dscore, dape = A.backward(*p.inputs(), go, ratio=ratio, coff=coff)
    assert torch.equal(out.detach(), ref_out)
    assert torch.equal(kv.grad, dkv) and torch.equal(score.grad, dscore)
    _dape_close(ape.grad, dape, "op vs api")


def test_ape_grad_across_calls():
    p = pack(128, 2, 128)
    kv, score, ape, cu, cuc = p.inputs()
    ape = ape.clone().requires_grad_(True)
    go = grad_out(p)
    for _ in range(2):
        ops.csa_compress(kv, score, ape, cu, cuc, ratio=128, coff=2, n_rows=p.n_rows) \
            .backward(go)
    one = A.backward(kv, score, ape.detach(), cu, cuc, go, ratio=128, coff=2)[2]
    assert (ape.grad - 2 * one).abs().max().item() <= 2e-5


def test_op_without_n_rows():
    p = pack(128, 1, 128, pad_rows=0)
    kv, score, ape, cu, cuc = p.inputs()
    out = ops.csa_compress(kv, score, ape, cu, cuc, ratio=128, coff=1)
    assert out.shape == (int(cuc[-1]), 128)


def test_compile_fullgraph_training_step():
    """A compiled training step (a Linear after the op): one graph, no recompile, the op's
    output bitwise and the gradients close to eager (inductor may round the Linear's and the
    loss's backward differently from eager, so grad_out itself can differ in the last bit)."""
    torch._dynamo.reset()
    p = pack(128, 2, 128)
    kv0, score0, ape0, cu, cuc = p.inputs()
    proj = torch.nn.Linear(128, 128, dtype=torch.bfloat16, device=DEV)

    def step(kv, score, ape):
        out = ops.csa_compress(kv, score, ape, cu, cuc, ratio=128, coff=2, n_rows=p.n_rows)
        return proj(out).float().square().mean(), out

    def run(fn):
        leaves = [t.clone().requires_grad_(True) for t in (kv0, score0, ape0)]
        proj.zero_grad(set_to_none=True)
        loss, out = fn(*leaves)
        loss.backward()
        return out.detach(), [t.grad for t in leaves]

    eager_out, eager_g = run(step)
    compiled = torch.compile(step, fullgraph=True)
    for _ in range(2):  # the second call reuses the graph
        out, g = run(compiled)
    assert torch.equal(out, eager_out)
    for name, a, b in zip(("dkv", "dscore", "dape"), g, eager_g, strict=True):
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=1e-4, msg=name)


def test_compile_fullgraph_gradients_equal_api_bitwise():
    """With a loss whose grad_out is exact in eager and compiled code alike (out . w with w
    bf16-representable), the compiled step's dKV and dScore equal api.backward's bitwise."""
    torch._dynamo.reset()
    p = pack(128, 1, 128)
    kv0, score0, ape0, cu, cuc = p.inputs()
    w = grad_out(p)

    @torch.compile(fullgraph=True)
    def step(kv, score, ape):
        out = ops.csa_compress(kv, score, ape, cu, cuc, ratio=128, coff=1, n_rows=p.n_rows)
        return (out.float() * w.float()).sum()

    leaves = [t.clone().requires_grad_(True) for t in (kv0, score0, ape0)]
    step(*leaves).backward()
    dkv, dscore, dape = A.backward(kv0, score0, ape0, cu, cuc, w, ratio=128, coff=1)
    assert torch.equal(leaves[0].grad, dkv) and torch.equal(leaves[1].grad, dscore)
    _dape_close(leaves[2].grad, dape, "compiled vs api")


def test_compile_fullgraph_unbacked_rows():
    torch._dynamo.reset()
    p = pack(128, 1, 128, pad_rows=0)
    kv, score, ape, cu, cuc = (t.clone() for t in p.inputs())
    ape.requires_grad_(True)

    @torch.compile(fullgraph=True)
    def step(kv, score, ape):
        return ops.csa_compress(kv, score, ape, cu, cuc, ratio=128, coff=1).float().sum()

    step(kv, score, ape).backward()
    assert ape.grad is not None


def test_cuda_graph_capture_after_warmup():
    p = pack(128, 2, 128)
    kv, score, ape, cu, cuc = (t.clone() for t in p.inputs())
    for t in (kv, score, ape):
        t.requires_grad_(True)
    go = grad_out(p)

    def fwd_bwd():
        for t in (kv, score, ape):
            t.grad = None
        out = ops.csa_compress(kv, score, ape, cu, cuc, ratio=128, coff=2, n_rows=p.n_rows)
        out.backward(go)
        return out

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fwd_bwd()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fwd_bwd()
    new = pack(128, 2, 128, seed=7)
    with torch.no_grad():
        kv.copy_(new.kv)
        score.copy_(new.score)
        ape.copy_(new.ape)
    g.replay()
    torch.cuda.synchronize()
    ref = A.forward(new.kv, new.score, new.ape, cu, cuc, ratio=128, coff=2, n_rows=p.n_rows)
    assert torch.equal(out, ref)
    dkv, dscore, _ = A.backward(new.kv, new.score, new.ape, cu, cuc, go, ratio=128, coff=2)
    assert torch.equal(kv.grad, dkv) and torch.equal(score.grad, dscore)


def test_env_stream_follows_current_and_explicit_stream():
    p = pack(128, 1, 512)
    kv, score, ape, cu, cuc = p.inputs()
    ref = A.forward(kv, score, ape, cu, cuc, ratio=128, coff=1, n_rows=p.n_rows)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    torch.cuda._sleep(50_000_000)  # keep the default stream busy: a wrong stream races
    with torch.cuda.stream(s):
        out1 = ops.csa_compress(kv, score, ape, cu, cuc, ratio=128, coff=1, n_rows=p.n_rows)
    out2 = A.forward(kv, score, ape, cu, cuc, ratio=128, coff=1, n_rows=p.n_rows, stream=s)
    s.synchronize()
    assert torch.equal(out1, ref) and torch.equal(out2, ref)


@pytest.mark.parametrize("bad, message", [
    ("misaligned", "base pointer"),
    ("dtype", "kv must be torch.bfloat16"),
    ("cpu", "must be a CUDA tensor"),
    ("short_out", "requires at least ratio=128 tokens"),
])
def test_bad_input_gives_api_errors(bad, message):
    p = pack(128, 1, 128, lens=(300,))
    kv, score, ape, cu, cuc = p.inputs()
    if bad == "misaligned":
        kv = torch.empty(kv.numel() + 8, dtype=kv.dtype, device=DEV)[1:kv.numel() + 1] \
            .view(kv.shape)
    elif bad == "dtype":
        kv = kv.float()
    elif bad == "cpu":
        cu = cu.cpu()
    elif bad == "short_out":
        kv, score = kv[:100], score[:100]
        cu = torch.tensor([0, 100], dtype=torch.int32, device=DEV)
        cuc = torch.tensor([0, 0], dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match=message):
        ops.csa_compress(kv, score, ape, cu, cuc, ratio=128, coff=1, n_rows=2)


# --- the eager path and the custom ops' path ----------------------------------------------


def _leaves(p):
    ts = [t.clone() for t in p.inputs()]
    for t in ts[:3]:
        t.requires_grad_(True)
    return ts


def _fwd_bwd(fn, p, go):
    kv, score, ape, cu, cuc = _leaves(p)
    out = fn(kv, score, ape, cu, cuc)
    out.backward(go)
    return out.detach(), kv.grad, score.grad, ape.grad, out.grad_fn


class _SeenOps(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("ratio, coff, d", [(128, 1, 128), (4, 2, 128)])
def test_eager_path_is_the_function_and_equals_the_custom_ops(ratio, coff, d):
    """Plain CUDA tensors take the autograd.Function over the api; under a dispatch mode the
    custom ops (which the mode sees) give the same bits; so does the forward op called
    directly (its register_autograd)."""
    p = pack(ratio, coff, d)
    go = grad_out(p)
    op = lambda *t: ops.csa_compress(*t, ratio=ratio, coff=coff, n_rows=p.n_rows)
    eager = _fwd_bwd(op, p, go)
    assert type(eager[4]).__name__ == "_CsaCompressBackward"
    mode = _SeenOps()
    with mode:
        routed = _fwd_bwd(op, p, go)
    assert "csagate.csa_compress_fwd.default" in mode.ops
    assert "csagate.csa_compress_bwd.default" in mode.ops
    direct = _fwd_bwd(lambda *t: torch.ops.csagate.csa_compress_fwd(*t, ratio, coff, p.n_rows),
                      p, go)
    for other, what in ((routed, "dispatch mode"), (direct, "register_autograd")):
        assert torch.equal(eager[0], other[0]), what
        assert torch.equal(eager[1], other[1]) and torch.equal(eager[2], other[2]), what
        _dape_close(eager[3], other[3], what)


def test_forward_without_grad_is_api_forward():
    p = pack(128, 2, 128)
    with torch.no_grad():
        out = ops.csa_compress(*_leaves(p), ratio=128, coff=2, n_rows=p.n_rows)
    assert out.grad_fn is None
    assert torch.equal(out, A.forward(*p.inputs(), ratio=128, coff=2, n_rows=p.n_rows))


@pytest.fixture
def deterministic_mode():
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(was)


@pytest.mark.parametrize("ratio, coff, d", [(128, 2, 128), (4, 2, 128)])
def test_deterministic_mode_dape_bitwise(deterministic_mode, ratio, coff, d):
    """torch.use_deterministic_algorithms(True): the op's dAPE is api.backward's
    deterministic one bitwise, run after run, on the eager path and the compiled one."""
    p = pack(ratio, coff, d)
    go = grad_out(p)
    want = A.backward(*p.inputs(), go, ratio=ratio, coff=coff, deterministic=True)
    op = lambda *t: ops.csa_compress(*t, ratio=ratio, coff=coff, n_rows=p.n_rows)
    torch._dynamo.reset()
    compiled = torch.compile(op, fullgraph=True)
    for fn in (op, op, compiled):
        _, dkv, dscore, dape, _ = _fwd_bwd(fn, p, go)
        assert torch.equal(dkv, want[0]) and torch.equal(dscore, want[1])
        assert torch.equal(dape, want[2])


def test_cpu_tensors_one_line_error():
    p = pack(128, 1, 128, lens=(300,))
    kv, score, ape, cu, cuc = (t.cpu() for t in p.inputs())
    with pytest.raises(ValueError) as err:
        ops.csa_compress(kv.requires_grad_(True), score, ape, cu, cuc, ratio=128, coff=1,
                         n_rows=p.n_rows)
    assert str(err.value) == "kv must be a CUDA tensor (or meta for checks), got device cpu"


# --- two GPUs: the launch is anchored to the tensors' device --------------------------------


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomics", "deterministic"])
@pytest.mark.parametrize("ratio, coff, d", [(4, 2, 128), (4, 1, 65), (128, 1, 128),
                                            (128, 2, 512)])
def test_op_anchored_to_the_tensors_device(request, ratio, coff, d, deterministic):
    """The op's eager path (forward and backward through autograd) with tensors on cuda:1
    and cuda:0 current, and on cuda:0 with cuda:1 current: outputs and grads on the tensors'
    device, the native run's bits; three calls each (the first signature on a device takes
    the api's full path, the next ones its fast path)."""
    if deterministic:
        request.getfixturevalue("deterministic_mode")
    native_pack = pack(ratio, coff, d, lens=(1023, 2048, 509))
    go0 = grad_out(native_pack)
    op = lambda *t: ops.csa_compress(*t, ratio=ratio, coff=coff, n_rows=native_pack.n_rows)
    with torch.cuda.device(0):
        native = _fwd_bwd(op, native_pack, go0)[:4]
    p1 = R.make_pack((1023, 2048, 509), ratio=ratio, coff=coff, d=d, pad_rows=2,
                     pad_tokens=5, seed=0, device="cuda:1")
    go1 = go0.to("cuda:1")
    for tensors_on, current, p, go in ((1, 0, p1, go1), (0, 1, native_pack, go0)):
        for _ in range(3):
            with torch.cuda.device(current):
                got = _fwd_bwd(op, p, go)[:4]
            torch.cuda.synchronize(tensors_on)
            assert all(t.device.index == tensors_on for t in got)
            got = [t.to("cuda:0") for t in got]
            where = f"tensors on cuda:{tensors_on}, cuda:{current} current"
            assert torch.equal(got[0], native[0]), where
            assert torch.equal(got[1], native[1]) and torch.equal(got[2], native[2]), where
            if deterministic:
                assert torch.equal(got[3], native[3]), where
            else:
                _dape_close(got[3], native[3], where)
