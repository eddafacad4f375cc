"""GPU: the deterministic backward (docs/CONTRACT.md section 2.5).

dAPE from per-CTA partials (every slot of the partials buffer written: it is NaN-prefilled
here) summed in a fixed order: bitwise identical over runs; dKV and dScore bitwise equal to
the default (atomic) mode, dAPE within 1e-3 of it; under torch's deterministic flag; under
CUDA graph capture.
"""

from __future__ import annotations

import csagate.reference as R
import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("needs_dsl")]

DAPE_ABS = 1e-3

# (ratio, coff, d, segment lengths, pad rows): ragged packs, both kernels and both window
# kinds (the c1d128/c2d512 large shapes take regwin schedules, 8192 tokens staged ones).
CASES = [
    (128, 1, 128, (8192,), 0), (128, 1, 128, (131072,), 0),
    (128, 2, 128, (5000, 300, 2944), 3), (128, 2, 128, (65536,), 0),
    (128, 1, 512, (1000, 127, 7065), 2), (128, 2, 512, (8192,), 0),
    (4, 1, 128, (512, 3, 257), 2), (4, 2, 65, (512, 256), 0),
    # long small-ratio packs: hundreds of CTAs, the split reduction (reduce.groups)
    (4, 1, 128, (131072,), 0), (2, 2, 512, (8192, 3000), 1),
]


@pytest.fixture
def nan_partials():
    from csagate.kernels import launch

    launch.PARTIALS_FILL = float("nan")
    yield
    launch.PARTIALS_FILL = None


def _inputs(ratio, coff, d, lens, pad_rows):
    pack = R.make_pack(lens, ratio=ratio, coff=coff, d=d, pad_rows=pad_rows, device="cuda")
    go = R.make_grad_out(pack.n_rows, d, device="cuda")
    return pack, go


def _run(pack, go, deterministic):
    from csagate.kernels import api

    args = pack.inputs()
    out = api.forward(*args, ratio=pack.ratio, coff=pack.coff, n_rows=go.shape[0])
    dkv, dscore, dape = api.backward(*args, go, ratio=pack.ratio, coff=pack.coff,
                                     deterministic=deterministic)
    torch.cuda.synchronize()
    return out, dkv, dscore, dape


def _bitwise(name, a, b):
    assert torch.equal(a, b), f"{name}: {int((a != b).sum())}/{a.numel()} differ"


@pytest.mark.parametrize("ratio,coff,d,lens,pad_rows", CASES)
def test_deterministic_dape_bitwise_and_rest_unchanged(ratio, coff, d, lens, pad_rows,
                                                      nan_partials):
    pack, go = _inputs(ratio, coff, d, lens, pad_rows)
    default = _run(pack, go, False)
    runs = [_run(pack, go, True) for _ in range(3)]
    tag = f"r{ratio} c{coff}d{d} {lens}"
    for run in runs:
        assert not run[3].isnan().any(), f"{tag}: NaN in dAPE (a partial slot never written)"
        for name, a, b in zip(("out", "dkv", "dscore"), run[:3], default[:3], strict=True):
            _bitwise(f"{tag} {name} vs default mode", a, b)
        _bitwise(f"{tag} dape run to run", run[3], runs[0][3])
        worst = (run[3].double() - default[3].double()).abs().max().item()
        assert worst <= DAPE_ABS, f"{tag}: dAPE vs default mode {worst:.3g}"


def test_deterministic_dape_accumulates():
    """dape += partial sums: the accumulate-into-dape contract holds."""
    from csagate.kernels import api

    pack, go = _inputs(128, 1, 128, (4096, 300), 0)
    args = pack.inputs()
    dkv, dscore = torch.empty_like(pack.kv), torch.empty_like(pack.score)
    once = torch.zeros_like(pack.ape)
    api.run_backward(*args, go, dkv, dscore, once, ratio=128, coff=1, deterministic=True)
    twice = torch.ones_like(pack.ape)
    api.run_backward(*args, go, dkv, dscore, twice, ratio=128, coff=1, deterministic=True)
    torch.cuda.synchronize()
    _bitwise("dape += sum", twice, torch.ones_like(once) + once)


def test_under_torch_deterministic_algorithms():
    pack, go = _inputs(128, 2, 128, (3000, 129), 1)
    explicit = _run(pack, go, True)
    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        auto = _run(pack, go, None)
    finally:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
    for name, a, b in zip(("out", "dkv", "dscore", "dape"), auto, explicit, strict=True):
        _bitwise(f"torch-deterministic {name}", a, b)


@pytest.mark.parametrize("ratio,coff,d", [(128, 1, 512), (4, 2, 128)])
def test_cuda_graph_capture(ratio, coff, d):
    from csagate.kernels import api

    pack, go = _inputs(ratio, coff, d, (2048, 300), 0)
    args = pack.inputs()

    def step():
        return api.backward(*args, go, ratio=ratio, coff=coff, deterministic=True)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        eager = step()  # compiles and loads the _det kernel and the reduction
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = step()
    for _ in range(2):
        graph.replay()
        torch.cuda.synchronize()
        for name, a, b in zip(("dkv", "dscore", "dape"), static, eager, strict=True):
            _bitwise(f"graph replay {name}", a, b)


def _chain_sum(rows: torch.Tensor) -> torch.Tensor:
    """The reduction's order over ``rows``: WARPS chains (rows w, w + WARPS, ... ascending),
    then the chains' sums in ascending w, each add an fp32 round to nearest."""
    from csagate.kernels.reduce import WARPS

    total = None
    for w in range(WARPS):
        acc = torch.zeros_like(rows[0])
        for b in range(w, rows.shape[0], WARPS):
            acc = acc + rows[b]
        total = acc if total is None else total + acc
    return total


@pytest.mark.parametrize("n_parts,n", [(1, 512), (37, 1024), (128, 2048), (129, 512),
                                       (600, 4), (2048, 1024), (700, 4096)])
@pytest.mark.parametrize("zero_dape", [False, True], ids=["accumulate", "zero"])
def test_reduction_order_is_the_documented_one(n_parts, n, zero_dape):
    """The reduction's bits are those of its documented order (kernels/reduce.py): one pass
    up to SPLIT_MIN_SLICES slices, else group sums into stage rows, then the stage rows."""
    from csagate.kernels import reduce as RD
    from csagate.kernels._dsl import device_arch
    from csagate.kernels.cache import CACHE
    from csagate.kernels.registry import ReduceKey

    g = RD.groups(n_parts, n)
    fn = CACHE.executor(ReduceKey(device_arch(), split=g > 0), torch.cuda.current_device())
    gen = torch.Generator(device="cuda").manual_seed(n_parts * 7 + n)
    parts = torch.full((RD.partial_rows(n_parts, n), n), float("nan"), device="cuda")
    parts[:n_parts] = torch.randn(n_parts, n, device="cuda", generator=gen) * 1e3
    parts[:n_parts, ::5] *= 1e-42  # subnormal terms: the adds must not flush them
    dape0 = torch.randn(n, device="cuda", generator=gen)
    dape = dape0.clone()
    RD.launch_reduce(fn, partials=parts, dape=dape, n_parts=n_parts, zero_dape=zero_dape)
    src = parts[:n_parts].clone()
    if g == 0:
        total = _chain_sum(src)
    else:
        per = -(-n_parts // g)
        stage = torch.stack([0.0 + _chain_sum(src[i * per:(i + 1) * per]) for i in range(g)])
        total = _chain_sum(stage)
    expect = (torch.zeros_like(dape0) if zero_dape else dape0) + total
    torch.cuda.synchronize()
    assert not dape.isnan().any(), "a stage row read before it was written"
    _bitwise(f"reduction of {n_parts} slices x {n} (groups {g})", dape, expect)
