"""CPU tests of the csa_compress custom op (no GPU, no kernels).

* fake tensors: FakeTensorMode with fake ``device="cuda"`` tensors (CPU torch), register_fake
  with and without n_rows (unbacked size), the api's messages for bad input;
* make_fx symbolic traces: one opaque node per direction;
* meta tensors: autograd wiring (the backward op is called once, grads have the right
  shapes/dtypes), torch.compile(fullgraph=True) with backend eager / aot_eager, and the
  AOT forward/backward graphs each hold one opaque op;
* a CPU kernel registered for the tests (``register_kernel("cpu")``) with the eager
  reference (csagate.reference) standing in for csagate.kernels.api: torch.library.opcheck
  on CPU, eager gradients equal the reference's autograd bitwise, ape.grad accumulates across
  calls, a fullgraph compile of a training step runs;
* the eager path (the autograd.Function over the api), routed onto CPU tensors with the
  reference as the api: values, grads only where required, no second derivative, no-grad
  forward;
* CPU tensors without a test kernel: the api's one-line device error, not the dispatcher's.
"""

from __future__ import annotations

import csagate.reference as REF
import pytest
import torch
from csagate.kernels import api as real_api
from csagate.kernels import ops
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import ShapeEnv, free_unbacked_symbols

FWD = torch.ops.csagate.csa_compress_fwd.default
BWD = torch.ops.csagate.csa_compress_bwd.default


class RefBackend:
    """csagate.kernels.api's interface over the eager fp32 reference (CPU)."""

    check_support = staticmethod(real_api.check_support)

    def __init__(self):
        self.calls = []

    def forward(self, kv, score, ape, cu, cuc, *, ratio, coff, n_rows=None):
        self.calls.append("fwd")
        return REF.forward(kv, score, ape, cu, cuc, ratio=ratio, coff=coff, n_rows=n_rows)

    def backward(self, kv, score, ape, cu, cuc, grad_out, *, ratio, coff):
        self.calls.append("bwd")
        # The reference differentiates with autograd; a custom op's kernel runs with the
        # autograd keys excluded (below autograd), so re-include them around the call.
        with _autograd_keys_included():
            g = REF.backward(kv, score, ape, cu, cuc, grad_out, ratio=ratio, coff=coff)
        return g.dkv, g.dscore, g.dape


class _autograd_keys_included:
    KEYS = (torch._C.DispatchKey.AutogradFunctionality, torch._C.DispatchKey.ADInplaceOrView)

    def __enter__(self):
        self.old = [torch._C._dispatch_tls_is_dispatch_key_excluded(k) for k in self.KEYS]
        for k in self.KEYS:
            torch._C._dispatch_tls_set_dispatch_key_excluded(k, False)

    def __exit__(self, *exc):
        for k, old in zip(self.KEYS, self.old):
            torch._C._dispatch_tls_set_dispatch_key_excluded(k, old)


class Forbidden:
    """A backend that must not be reached (fake/meta paths never run the real impl)."""

    check_support = staticmethod(real_api.check_support)

    def forward(self, *a, **k):
        raise AssertionError("real forward called")

    def backward(self, *a, **k):
        raise AssertionError("real backward called")


@pytest.fixture
def forbidden(monkeypatch):
    monkeypatch.setattr(ops, "api", Forbidden())


def _fwd_cpu(kv, score, ape, cu_seqlens, cu_seqlens_comp, ratio, coff, n_rows=None):
    return ops.api.forward(kv, score, ape, cu_seqlens, cu_seqlens_comp, ratio=ratio, coff=coff,
                           n_rows=n_rows)


def _bwd_cpu(kv, score, ape, cu_seqlens, cu_seqlens_comp, grad_out, ratio, coff):
    return tuple(ops.api.backward(kv, score, ape, cu_seqlens, cu_seqlens_comp, grad_out,
                                  ratio=ratio, coff=coff))


@pytest.fixture
def ref_backend(monkeypatch):
    """A CPU kernel for the ops (test-only) whose api is the eager reference; afterwards the
    ops' own CPU behaviour (the one-line device error) is back."""
    ops.csa_compress_fwd.register_kernel("cpu")(_fwd_cpu)
    ops.csa_compress_bwd.register_kernel("cpu")(_bwd_cpu)
    be = RefBackend()
    monkeypatch.setattr(ops, "api", be)
    yield be
    for op in (ops.csa_compress_fwd, ops.csa_compress_bwd):
        op.register_kernel("cpu")(op._init_fn)


def inputs(device, *, lens=(300, 260), ratio=128, coff=2, d=128, grad=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    T, W = sum(lens), coff * d
    kv = torch.randn(T, W, generator=g).to(torch.bfloat16)
    score = (torch.randn(T, W, generator=g) * 1.5).to(torch.bfloat16)
    ape = torch.randn(ratio, W, generator=g) * 0.25
    cu = torch.tensor([0, *lens]).cumsum(0).to(torch.int32)
    cuc = torch.tensor([0, *(n // ratio for n in lens)]).cumsum(0).to(torch.int32)
    ts = [t.to(device) for t in (kv, score, ape, cu, cuc)]
    if grad:
        for t in ts[:3]:
            t.requires_grad_(True)
    return ts


def fake_inputs(mode, **kw):
    with mode:
        return [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cuda",
                                    requires_grad=t.requires_grad)
                for t in inputs("cpu", **kw)]


# --- schema ------------------------------------------------------------------------------


def test_schemas():
    assert str(FWD._schema) == (
        "csagate::csa_compress_fwd(Tensor kv, Tensor score, Tensor ape, Tensor cu_seqlens, "
        "Tensor cu_seqlens_comp, SymInt ratio, SymInt coff, SymInt? n_rows=None) -> Tensor")
    assert str(BWD._schema) == (
        "csagate::csa_compress_bwd(Tensor kv, Tensor score, Tensor ape, Tensor cu_seqlens, "
        "Tensor cu_seqlens_comp, Tensor grad_out, SymInt ratio, SymInt coff) "
        "-> (Tensor, Tensor, Tensor)")


# --- fake tensors (FakeTensorMode, fake cuda) -------------------------------------------


def test_fake_forward_with_n_rows(forbidden):
    mode = FakeTensorMode(shape_env=ShapeEnv())
    kv, score, ape, cu, cuc = fake_inputs(mode, grad=False)
    with mode:
        out = ops.csa_compress(kv, score, ape, cu, cuc, ratio=128, coff=2, n_rows=7)
    assert out.shape == (7, 128) and out.dtype == torch.bfloat16 and out.device.type == "cuda"


def test_fake_forward_without_n_rows_is_unbacked(forbidden):
    mode = FakeTensorMode(shape_env=ShapeEnv())
    kv, score, ape, cu, cuc = fake_inputs(mode, grad=False)
    with mode:
        out = ops.csa_compress(kv, score, ape, cu, cuc, ratio=128, coff=2)
    assert out.shape[1] == 128
    assert free_unbacked_symbols(out.shape[0]), out.shape


def test_fake_backward_shapes(forbidden):
    mode = FakeTensorMode(shape_env=ShapeEnv())
    kv, score, ape, cu, cuc = fake_inputs(mode, grad=False)
    with mode:
        go = torch.empty(5, 128, dtype=torch.bfloat16, device="cuda")
        dkv, dscore, dape = BWD(kv, score, ape, cu, cuc, go, 128, 2)
    assert dkv.shape == kv.shape and dkv.dtype == torch.bfloat16
    assert dscore.shape == score.shape and dscore.dtype == torch.bfloat16
    assert dape.shape == ape.shape and dape.dtype == torch.float32
    assert dape.device.type == "cuda"


@pytest.mark.parametrize("index, shape, stride, dtype, message", [
    (0, (560, 256), (256, 1), torch.float32, "kv must be torch.bfloat16, got torch.float32"),
    (2, (64, 256), (256, 1), torch.float32,
     "ape shape (64, 256) must be (ratio, coff*head_dim) = (128, 256)"),
    (4, (2,), (1,), torch.int32,
     "cu_seqlens_comp must be 1-D with B + 1 = 3 entries (as cu_seqlens), got shape (2,)"),
    (0, (560, 256), (1, 560), torch.bfloat16, "kv must be contiguous (row-major)"),
])
def test_fake_bad_input_gives_api_message(forbidden, index, shape, stride, dtype, message):
    import re

    mode = FakeTensorMode(shape_env=ShapeEnv())
    args = fake_inputs(mode, grad=False)
    with mode:
        args[index] = torch.empty_strided(shape, stride, dtype=dtype, device="cuda")
        with pytest.raises(ValueError, match=re.escape(message)):
            ops.csa_compress(*args, ratio=128, coff=2, n_rows=4)


def test_fake_bad_config(forbidden):
    mode = FakeTensorMode(shape_env=ShapeEnv())
    args = fake_inputs(mode, grad=False)
    with mode, pytest.raises(ValueError, match="ratio=128 supports coff in"):
        ops.csa_compress(*args, ratio=128, coff=3, n_rows=4)


# --- make_fx: one opaque node per direction ----------------------------------------------


def _call_targets(gm):
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


def test_make_fx_forward_one_node(forbidden):
    kv, score, ape, cu, cuc = inputs("meta", grad=False)
    gm = make_fx(lambda *a: ops.csa_compress(*a, ratio=128, coff=2, n_rows=4),
                 tracing_mode="symbolic")(kv, score, ape, cu, cuc)
    assert _call_targets(gm) == ["csagate.csa_compress_fwd.default"]


def test_make_fx_backward_one_node(forbidden):
    kv, score, ape, cu, cuc = inputs("meta", grad=False)
    go = torch.empty(4, 128, dtype=torch.bfloat16, device="meta")
    gm = make_fx(lambda *a: BWD(*a, 128, 2), tracing_mode="symbolic")(kv, score, ape, cu, cuc,
                                                                      go)
    assert _call_targets(gm) == ["csagate.csa_compress_bwd.default",
                                 "<built-in function getitem>"] * 1 + [
        "<built-in function getitem>"] * 2


def test_make_fx_joint_graph(forbidden):
    """Forward + autograd backward traced together: one fwd op, one bwd op, no decomposition."""
    kv, score, ape, cu, cuc = inputs("meta")

    def joint(kv, score, ape, cu, cuc):
        out = ops.csa_compress(kv, score, ape, cu, cuc, ratio=128, coff=2, n_rows=4)
        return torch.autograd.grad(out.float().sum(), (kv, score, ape))

    gm = make_fx(joint, tracing_mode="symbolic")(kv, score, ape, cu, cuc)
    targets = _call_targets(gm)
    assert targets.count("csagate.csa_compress_fwd.default") == 1
    assert targets.count("csagate.csa_compress_bwd.default") == 1


# --- meta tensors: autograd, torch.compile -----------------------------------------------


def test_meta_autograd_calls_backward_op_once(forbidden):
    kv, score, ape, cu, cuc = inputs("meta")
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Log(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    out = ops.csa_compress(kv, score, ape, cu, cuc, ratio=128, coff=2, n_rows=4)
    with Log():
        out.float().sum().backward()
    assert seen.count("csagate.csa_compress_bwd.default") == 1
    assert kv.grad.dtype == torch.bfloat16 and score.grad.dtype == torch.bfloat16
    assert ape.grad.dtype == torch.float32 and ape.grad.shape == ape.shape


def test_meta_grad_only_where_required(forbidden):
    kv, score, ape, cu, cuc = inputs("meta")
    kv.requires_grad_(False)
    out = ops.csa_compress(kv, score, ape, cu, cuc, ratio=128, coff=2, n_rows=4)
    out.float().sum().backward()
    assert kv.grad is None and score.grad is not None and ape.grad is not None


def _aot_capture():
    from functorch.compile import make_boxed_func
    from torch._functorch.aot_autograd import aot_module_simplified

    graphs = {}

    def backend(gm, example_inputs):
        def fw(g, _):
            graphs["fw"] = g
            return make_boxed_func(g.forward)

        def bw(g, _):
            graphs["bw"] = g
            return make_boxed_func(g.forward)

        return aot_module_simplified(gm, example_inputs, fw_compiler=fw, bw_compiler=bw)

    return backend, graphs


@pytest.mark.parametrize("n_rows", [4, None])
def test_compile_fullgraph_aot_graphs(ref_backend, n_rows):
    """torch.compile(fullgraph=True): no graph break; the AOT forward and backward graphs
    hold one opaque op each; n_rows=None traces an unbacked row count. Runs on CPU through
    the reference kernel (meta tensors cannot run a data-dependent output size)."""
    torch._dynamo.reset()
    backend, graphs = _aot_capture()

    @torch.compile(fullgraph=True, backend=backend)
    def step(kv, score, ape, cu, cuc):
        out = ops.csa_compress(kv, score, ape, cu, cuc, ratio=128, coff=2, n_rows=n_rows)
        return (out.float() ** 2).sum()

    kv, score, ape, cu, cuc = inputs("cpu", lens=(256, 130))
    step(kv, score, ape, cu, cuc).backward()
    assert _call_targets(graphs["fw"]).count("csagate.csa_compress_fwd.default") == 1
    assert _call_targets(graphs["bw"]).count("csagate.csa_compress_bwd.default") == 1
    assert ape.grad is not None and ape.grad.shape == ape.shape
    if n_rows is None:
        fw_out = [n for n in graphs["fw"].graph.nodes
                  if str(n.target) == "csagate.csa_compress_fwd.default"][0]
        assert free_unbacked_symbols(fw_out.meta["val"].shape[0])


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compile_fullgraph_named_backends(forbidden, backend):
    torch._dynamo.reset()

    @torch.compile(fullgraph=True, backend=backend)
    def step(kv, score, ape, cu, cuc):
        return ops.csa_compress(kv, score, ape, cu, cuc, ratio=128, coff=2, n_rows=4).sum()

    kv, score, ape, cu, cuc = inputs("meta")
    step(kv, score, ape, cu, cuc).backward()
    assert kv.grad.shape == kv.shape


# --- CPU kernel over the reference: opcheck, eager values --------------------------------


def test_opcheck_cpu(ref_backend):
    """torch.library.opcheck on CPU (schema, autograd registration, fake, aot dispatch)."""
    kv, score, ape, cu, cuc = inputs("cpu", lens=(256, 130))
    torch.library.opcheck(FWD, (kv, score, ape, cu, cuc, 128, 2, 3))
    go = torch.randn(3, 128).to(torch.bfloat16)
    torch.library.opcheck(BWD, (kv.detach(), score.detach(), ape.detach(), cu, cuc, go, 128, 2))


def test_opcheck_cpu_unbacked(ref_backend):
    kv, score, ape, cu, cuc = inputs("cpu", lens=(256, 130))
    torch.library.opcheck(FWD, (kv, score, ape, cu, cuc, 128, 2, None))


def _grads_equal_reference(backend, grad_fn: str | None = None) -> None:
    """One forward + backward through the op on a ragged pack with two capacity padding
    rows: values and gradients bitwise the reference's, through ``backend`` (and the
    autograd node ``grad_fn`` when given)."""
    kv, score, ape, cu, cuc = inputs("cpu", lens=(300, 260, 5))
    n_rows = int(cuc[-1]) + 2
    out = ops.csa_compress(kv, score, ape, cu, cuc, ratio=128, coff=2, n_rows=n_rows)
    if grad_fn is not None:
        assert type(out.grad_fn).__name__ == grad_fn
    go = torch.randn(n_rows, 128).to(torch.bfloat16)
    out.backward(go)
    ref = REF.backward(kv.detach(), score.detach(), ape.detach(), cu, cuc, go, ratio=128,
                       coff=2)
    assert torch.equal(out.detach(), ref.out)
    assert torch.equal(kv.grad, ref.dkv) and torch.equal(score.grad, ref.dscore)
    assert torch.equal(ape.grad, ref.dape)
    assert backend.calls == ["fwd", "bwd"]


def test_eager_grads_equal_reference_bitwise(ref_backend):
    _grads_equal_reference(ref_backend)


def test_ape_grad_accumulates_across_calls(ref_backend):
    kv, score, ape, cu, cuc = inputs("cpu", lens=(256,), coff=1)
    for _ in range(2):
        ops.csa_compress(kv, score, ape, cu, cuc, ratio=128, coff=1, n_rows=2).float().sum() \
            .backward()
    two = ape.grad.clone()
    ape.grad = None
    ops.csa_compress(kv, score, ape, cu, cuc, ratio=128, coff=1, n_rows=2).float().sum() \
        .backward()
    assert torch.equal(two, ape.grad + ape.grad)


def test_compiled_training_step_cpu(ref_backend):
    torch._dynamo.reset()
    kv, score, ape, cu, cuc = inputs("cpu", lens=(256, 130))
    lin = torch.nn.Linear(128, 1, dtype=torch.bfloat16)

    def step(kv, score, ape):
        out = ops.csa_compress(kv, score, ape, cu, cuc, ratio=128, coff=2, n_rows=3)
        return lin(out).float().square().mean()

    eager = step(kv, score, ape)
    eager.backward()
    g_eager = [t.grad.clone() for t in (kv, score, ape)]
    for t in (kv, score, ape):
        t.grad = None
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    loss = compiled(kv, score, ape)
    loss.backward()
    assert torch.equal(loss, eager)
    for a, b in zip(g_eager, (kv.grad, score.grad, ape.grad)):
        assert torch.equal(a, b)


# --- the eager path: the autograd.Function over the api ---------------------------------


@pytest.fixture
def eager_on_cpu(monkeypatch):
    """The eager route taken for plain CPU tensors, the reference as the api. No CPU kernel
    is registered: a call that reached the custom ops would raise their device error."""
    be = RefBackend()
    monkeypatch.setattr(ops, "api", be)
    monkeypatch.setattr(ops, "_eager", lambda kv, other: (
        type(kv) is torch.Tensor and type(other) is torch.Tensor
        and not torch._C._len_torch_dispatch_stack()))
    return be


def test_eager_function_values_and_grads_bitwise(eager_on_cpu):
    _grads_equal_reference(eager_on_cpu, grad_fn="_CsaCompressBackward")


def test_eager_function_strided_grad_out(eager_on_cpu):
    """autograd may hand an expanded grad_out (d sum): the backward makes it contiguous."""
    kv, score, ape, cu, cuc = inputs("cpu", lens=(256,), coff=1)
    out = ops.csa_compress(kv, score, ape, cu, cuc, ratio=128, coff=1, n_rows=2)
    out.sum().backward()
    ones = torch.ones(2, 128, dtype=torch.bfloat16)
    ref = REF.backward(kv.detach(), score.detach(), ape.detach(), cu, cuc, ones, ratio=128,
                       coff=1)
    assert torch.equal(kv.grad, ref.dkv) and torch.equal(ape.grad, ref.dape)


def test_eager_function_grads_only_where_required(eager_on_cpu):
    kv, score, ape, cu, cuc = inputs("cpu", lens=(256,), coff=1)
    kv.requires_grad_(False)
    ops.csa_compress(kv, score, ape, cu, cuc, ratio=128, coff=1, n_rows=2).float().sum() \
        .backward()
    assert kv.grad is None and score.grad is not None and ape.grad is not None


def test_eager_function_is_not_twice_differentiable(eager_on_cpu):
    kv, score, ape, cu, cuc = inputs("cpu", lens=(256,), coff=1)
    out = ops.csa_compress(kv, score, ape, cu, cuc, ratio=128, coff=1, n_rows=2)
    (g,) = torch.autograd.grad(out.float().square().sum(), (ape,), create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        g.sum().backward()


@pytest.mark.parametrize("no_grad", [True, False])
def test_eager_forward_without_grad_is_the_api(eager_on_cpu, no_grad):
    kv, score, ape, cu, cuc = inputs("cpu", lens=(256,), coff=1, grad=not no_grad)
    with torch.set_grad_enabled(not no_grad):
        out = ops.csa_compress(kv.detach(), score.detach(), ape.detach(), cu, cuc, ratio=128,
                               coff=1, n_rows=2)
    assert out.grad_fn is None and eager_on_cpu.calls == ["fwd"]


# --- CPU tensors: the api's one-line error ----------------------------------------------


@pytest.mark.parametrize("call", ["forward", "forward-grad", "fwd-op", "bwd-op"])
def test_cpu_tensors_give_one_line_device_error(call):
    kv, score, ape, cu, cuc = inputs("cpu", lens=(256,), coff=1, grad=call == "forward-grad")
    go = torch.zeros(2, 128, dtype=torch.bfloat16)
    run = {
        "forward": lambda: ops.csa_compress(kv, score, ape, cu, cuc, ratio=128, coff=1,
                                            n_rows=2),
        "forward-grad": lambda: ops.csa_compress(kv, score, ape, cu, cuc, ratio=128, coff=1),
        "fwd-op": lambda: FWD(kv, score, ape, cu, cuc, 128, 1, 2),
        "bwd-op": lambda: BWD(kv, score, ape, cu, cuc, go, 128, 1),
    }[call]
    with pytest.raises(ValueError) as err:
        run()
    assert str(err.value) == "kv must be a CUDA tensor (or meta for checks), got device cpu"


def test_cpu_bad_shape_reported_before_device():
    kv, score, ape, cu, cuc = inputs("cpu", lens=(256,), coff=1, grad=False)
    with pytest.raises(ValueError, match=r"^ape shape \(128, 64\) must be"):
        ops.csa_compress(kv, score, ape[:, :64].contiguous(), cu, cuc, ratio=128, coff=1)
