"""GPU: one host path per call. Through the op, a cold call (its signature not yet remembered,
the kernel loaded) walks the launch path's modules (perf/host_walk.HOST_PATH: op, api, launch,
validate, dispatch) once each, in that order, and never enters one again after leaving it, and
checks the ratio once (the envelope check; the rest trusts it); a warm call stops at the launch
module's fast path and checks nothing. The backward is the op's autograd Function
``backward`` called on this thread with the graph's own context (autograd would run it on its
device thread, which the tracer does not see)."""

from __future__ import annotations

import csagate.reference as R
import pytest
import torch
from csagate.kernels import launch, registry
from csagate.perf.host_walk import HOST_PATH, walk

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("needs_dsl")]

FAST_PATH = HOST_PATH[:3]


@pytest.fixture
def deterministic(request):
    was = (torch.are_deterministic_algorithms_enabled(),
           torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(request.param, warn_only=True)
    yield request.param
    torch.use_deterministic_algorithms(was[0], warn_only=was[1])


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"],
                         indirect=True)
@pytest.mark.parametrize("ratio,coff,d,lens", [(128, 1, 128, (3000, 129)),
                                               (4, 2, 128, (512, 3, 257))])
def test_a_cold_op_call_walks_the_host_path_once(ratio, coff, d, lens, deterministic,
                                                  monkeypatch):
    from csagate.kernels.ops import _CsaCompress, csa_compress

    pack = R.make_pack(lens, ratio=ratio, coff=coff, d=d, device="cuda")
    kv, score, ape, cu, cuc = (t.requires_grad_(t.is_floating_point()) for t in pack.inputs())
    go = R.make_grad_out(pack.n_rows, d, device="cuda")
    outs = []

    def forward():
        outs.append(csa_compress(kv, score, ape, cu, cuc, ratio=ratio, coff=coff,
                                 n_rows=pack.n_rows))

    def backward():
        _CsaCompress.backward(outs[-1].grad_fn, go)

    forward()
    backward()  # loads the kernels
    torch.cuda.synchronize()
    launch.FAST.clear()
    seen, checked = {}, []
    real = registry.check_ratio
    monkeypatch.setattr(registry, "check_ratio", lambda r: checked.append(r) or real(r))
    for name, call in (("forward", forward), ("backward", backward),
                       ("warm forward", forward), ("warm backward", backward)):
        checked.clear()
        seen[name] = (walk(call).on(HOST_PATH), len(checked))
    torch.cuda.synchronize()
    for name, (w, ratio_checks) in seen.items():
        warm = name.startswith("warm")
        want = list(FAST_PATH if warm else HOST_PATH)
        assert (w.entered, w.reentered) == (want, []), f"{name}: {w}"
        assert ratio_checks == (0 if warm else 1), f"{name}: the ratio checked {ratio_checks}x"
