"""GPU: the built-in implementations behind ``--impl`` on real tensors.

* ``csagate`` through the implementation interface gives the direct kernel path's bits (the
  adapter adds no numerics), and ``csagate-op`` the op's;
* ``compiled`` (torch.compile of the gather formulation) meets G2's bounds against fp32 eager;
* ``cudnn`` (when nvidia-cudnn-frontend is importable): below compute capability 10 it refuses
  with the package's own one line; with ``CSAGATE_MEASURE_CUDNN_MIN_CC`` lowered (a
  measurement, outside the package's envelope) its ratio=4 dKV/dScore are compared with ours.
"""

from __future__ import annotations

import pytest
import torch
from csagate.gates import builtin_impls, comparators, limits
from csagate.gates.plugin import unavailable
from csagate.reference import backward, make_grad_out, make_pack

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("needs_dsl")]

DEV = torch.device("cuda", 0)


def _pack(ratio, coff, d, lens=(1023, 2048, 509)):
    pack = make_pack(lens, ratio=ratio, coff=coff, d=d, pad_rows=3, device=DEV)
    return pack, make_grad_out(pack.n_rows, d, device=DEV)


@pytest.mark.parametrize("ratio, coff", [(128, 1), (4, 2)])
def test_csagate_impl_adds_no_numerics(ratio, coff):
    """The built-in over the kernels' api gives the api's own bits, and so does the op."""
    from csagate.kernels import api

    impl = builtin_impls.Csagate()
    impl.prepare([(ratio, coff, 128)])
    pack, go = _pack(ratio, coff, 128)
    out = torch.empty(pack.n_rows, 128, dtype=torch.bfloat16, device=DEV)
    api.run_forward(*pack.inputs(), out, ratio=ratio, coff=coff)
    assert torch.equal(impl.forward(*pack.inputs(), pack.n_rows, ratio=ratio, coff=coff), out)
    dkv, dscore, _ = impl.backward(*pack.inputs(), go, ratio=ratio, coff=coff)
    op_dkv, op_dscore, _ = builtin_impls.CsagateOp().backward(*pack.inputs(), go, ratio=ratio,
                                                               coff=coff)
    assert torch.equal(dkv, op_dkv) and torch.equal(dscore, op_dscore)


@pytest.mark.parametrize("coff", [1, 2])
def test_compiled_meets_g2_bounds(coff):
    pack, go = _pack(128, coff, 128)
    ref = backward(*pack.inputs(), go, ratio=128, coff=coff)
    impl = builtin_impls.Compiled()
    out = impl.forward(*pack.inputs(), pack.n_rows, ratio=128, coff=coff)
    dkv, dscore, dape = impl.backward(*pack.inputs(), go, ratio=128, coff=coff)
    for got, want in ((out, ref.out), (dkv, ref.dkv), (dscore, ref.dscore)):
        t = comparators.tolerance(got, want, bound=limits.MAX_ABS,
                             allowed=limits.count_allowance(want.numel()))
        assert t.ok, t.summary()
    assert comparators.max_abs_error(dape, ref.dape) <= limits.DAPE_MAX_ABS


def _cudnn_api():
    try:
        import cudnn.csa.compressor.api as api
    except Exception as exc:  # not installed, or its import failed: say which
        pytest.skip(f"nvidia-cudnn-frontend not importable: {exc}")
    return api


def test_cudnn_refuses_below_cc10_in_one_line(monkeypatch):
    api = _cudnn_api()
    monkeypatch.delenv(builtin_impls.CUDNN_MEASURE_ENV, raising=False)
    monkeypatch.setattr(api, "MINIMUM_COMPUTE_CAPABILITY_MAJOR", 10)
    why = unavailable(builtin_impls.Cudnn(), DEV)
    if torch.cuda.get_device_capability(DEV)[0] >= 10:
        assert why is None
        return
    assert why is not None and "\n" not in why
    assert why.startswith("nvidia-cudnn-frontend refuses: RuntimeError")
    assert "compute capability" in why


def test_cudnn_measurement_with_the_constant_lowered(monkeypatch):
    """Measurement only: the package's cc constant lowered to this GPU's major."""
    api = _cudnn_api()
    major = torch.cuda.get_device_capability(DEV)[0]
    monkeypatch.setenv(builtin_impls.CUDNN_MEASURE_ENV, str(major))
    # restored after the test: the lowered constant must not outlive the measurement
    monkeypatch.setattr(api, "MINIMUM_COMPUTE_CAPABILITY_MAJOR",
                        api.MINIMUM_COMPUTE_CAPABILITY_MAJOR)
    impl = builtin_impls.Cudnn()
    assert unavailable(impl, DEV) is None
    assert "MEASUREMENT ONLY" in impl.label
    pack, go = _pack(4, 2, 128)
    ours = builtin_impls.Csagate()
    ours.prepare([(4, 2, 128)])
    theirs_grads = impl.backward(*pack.inputs(), go, ratio=4, coff=2)
    our_grads = ours.backward(*pack.inputs(), go, ratio=4, coff=2)
    ref = backward(*pack.inputs(), go, ratio=4, coff=2)
    out = impl.forward(*pack.inputs(), pack.n_rows, ratio=4, coff=2)
    assert out.shape == ref.out.shape and out.dtype == torch.bfloat16
    # dKV/dScore at ratio 4: bitwise the fp32 eager reference (both packages' contract)
    assert torch.equal(theirs_grads[0], ref.dkv) and torch.equal(theirs_grads[1], ref.dscore)
    assert torch.equal(theirs_grads[0], our_grads[0])
    assert torch.equal(theirs_grads[1], our_grads[1])
