"""A/B of the backward's PDL launches (docs/KERNELS.md section 5; GPU only).

``python -m csagate.perf.pdl_ab`` builds each shape's table backward twice, as shipped (the
dAPE zeroing and the kernel launched as programmatic dependents) and as its twin without PDL
(``build_bwd(pdl_zero=False)``), and times one launcher call of each, the call
``api.backward`` makes (``--accumulate``: the call ``run_backward`` makes into a zeroed dape,
torch's ``zero_`` included), interleaved in both orders, cold (``bench.interleaved``) and in
graph replay. Before the timing it checks, with NaN-filled outputs, that the twins write the
same dKV/dScore bits and dAPE within atomic-order noise.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from csagate.perf.profile import LARGE, SHORT_TOKENS, parse_shape

DAPE_NOISE = 1e-5  # |dAPE(PDL) - dAPE(twin)|: fp32 atomics in another order, nothing more


@dataclass(frozen=True)
class PdlRow:
    shape: str
    kernel: str
    bits_equal: bool           # dKV and dScore of the twins, bit for bit
    dape_diff: float           # max |dAPE(PDL) - dAPE(twin)|
    cold_pdl: tuple[float, float]   # order 1 (PDL first), order 2
    cold_twin: tuple[float, float]
    graph_pdl: tuple[float, float]  # graph replays, PDL first then the twin, then reversed
    graph_twin: tuple[float, float]

    @property
    def ok(self) -> bool:
        return self.bits_equal and self.dape_diff <= DAPE_NOISE


def default_shapes() -> list[tuple[int, int, int]]:
    """The four large shapes of issue 12, then every config at 8192 tokens."""
    return list(LARGE) + [(c, d, SHORT_TOKENS) for c, d, _ in LARGE]


def format_row(r: PdlRow) -> str:
    def pair(a, b):
        return f"{a[0]:7.2f} -> {b[0]:7.2f} / {a[1]:7.2f} -> {b[1]:7.2f}"

    return (f"{r.shape:15s} {r.kernel:28s} cold {pair(r.cold_twin, r.cold_pdl)}   graph "
            f"{pair(r.graph_twin, r.graph_pdl)}   {'same bits' if r.ok else 'DIFFERENT'}")


def measure(coff: int, d: int, tokens: int, *, accumulate: bool = False, iters: int = 60,
            warmup: int = 10, flush=None) -> PdlRow:
    import torch
    from csagate.kernels import schedule as S
    from csagate.kernels._dsl import device_arch, sm_count
    from csagate.kernels.r128_bwd import build_bwd
    from csagate.perf import bench as B
    from csagate.reference import make_grad_out, make_pack

    flush = flush or B.L2Flush()
    arch = device_arch()
    n = tokens // 128
    sched = S.select_bwd(coff, d, n, arch)
    fns = {p: build_bwd(d=d, coff=coff, sched=sched, arch=arch, pdl_zero=p)
           for p in (True, False)}
    pack = make_pack((tokens,), ratio=128, coff=coff, d=d, device="cuda")
    go = make_grad_out(n, d, device="cuda")
    kv, score, ape, cu, cuc = pack.inputs()
    rpc = S.rows_per_cta(n, d, coff, sched, sm_count(kv.get_device()))
    bufs = {p: (torch.empty_like(kv), torch.empty_like(score), torch.empty_like(ape))
            for p in fns}

    def launcher(p):
        f, (dkv, ds, da) = fns[p], bufs[p]
        if accumulate:
            return lambda: (da.zero_(), f(kv, score, ape, cu, cuc, go, dkv, ds, da, rpc, 0))
        return lambda: f(kv, score, ape, cu, cuc, go, dkv, ds, da, rpc, 1)

    calls = [launcher(True), launcher(False)]
    bits, diff = True, 0.0
    for _ in range(3):
        for p in fns:
            for t in bufs[p]:
                t.fill_(float("nan"))
        for call in calls:
            call()
        torch.cuda.synchronize()
        for i in (0, 1):
            bits &= torch.equal(bufs[True][i].view(torch.int16), bufs[False][i].view(torch.int16))
        diff = max(diff, (bufs[True][2] - bufs[False][2]).abs().max().item())
    cold_pdl, cold_twin = B.interleaved(calls, iters=iters, warmup=warmup, flush=flush)
    graph = {True: [], False: []}
    for order in ((True, False), (False, True)):
        for p in order:
            graph[p].append(B.graph_median(calls[0 if p else 1], iters=iters,
                                           warmup=warmup).median_us)
    return PdlRow(f"c{coff}d{d}:{tokens}", sched.tag, bool(bits), diff, cold_pdl, cold_twin,
                  tuple(graph[True]), tuple(graph[False]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m csagate.perf.pdl_ab", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", action="append", default=None, metavar="cCdD:TOKENS")
    ap.add_argument("--accumulate", action="store_true",
                    help="time run_backward into a zeroed dape instead of api.backward's call")
    ap.add_argument("--iters", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=10)
    ns = ap.parse_args(argv)
    shapes = [parse_shape(s) for s in ns.shape] if ns.shape else default_shapes()
    print("shape           kernel                       us: twin -> PDL, order 1 / order 2")
    ok = True
    for coff, d, tokens in shapes:
        row = measure(coff, d, tokens, accumulate=ns.accumulate, iters=ns.iters,
                      warmup=ns.warmup)
        ok &= row.ok
        print(format_row(row), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
