"""Timing the small-ratio kernels (ratio 2, 4, ..., 32; GPU only), by perf/bench.py's method.

The headline is COLD (``bench.cold_median``: L2 flushed before each launch, events around one
launch); the same-size reference is a cold copy of the op's bytes (``bench.cold_copy_us``);
the warm figure is a CUDA-graph replay of back-to-back launches as the api makes them (the
backward's launch zeroes dAPE first). The rows are ``bench.ShapeRow`` records without the eager
columns (the fp32 eager path of a ratio-2 pack is not a peer worth timing). Nothing here
prints.
"""

from __future__ import annotations

from csagate.kernels import schedule as S
from csagate.perf import bench

CONFIGS = S.CONFIGS  # c1d128, c2d128, c1d512, c2d512
TOKENS = (8192, 131072)
# (ratio, coff, d, tokens in one segment): every config at a short and a long pack.
SHAPES: dict[int, tuple[tuple[int, int, int, int], ...]] = {
    ratio: tuple((ratio, coff, d, t) for coff, d in CONFIGS for t in TOKENS)
    for ratio in (2, 4, 8, 16, 32)}


def bench_shape(ratio: int, coff: int, d: int, tokens: int, *, copy_bw: float,
                iters: int = 100, warmup: int = 30, seed: int = 1234,
                flush: bench.L2Flush | None = None) -> bench.ShapeRow:
    """One small-ratio shape: forward and backward cold and in graph replay, the deterministic
    backward cold, and cold copies of the same bytes."""
    from csagate.kernels import api

    flush = flush or bench.L2Flush()
    pack, go, out, dkv, dscore, dape = bench.shape_buffers(ratio, coff, d, tokens, seed)
    n = pack.n_rows
    args = pack.inputs()
    kw = {"ratio": ratio, "coff": coff}

    def fwd():
        api.run_forward(*args, out, **kw)

    def bwd_only():  # dAPE zeroed outside the timed region (``before``)
        api.run_backward(*args, go, dkv, dscore, dape, **kw)

    def bwd():  # what api.backward and the op launch: dAPE zeroed inside the launch
        api.run_backward(*args, go, dkv, dscore, dape, accumulate=False, **kw)

    def bwd_det():
        api.run_backward(*args, go, dkv, dscore, dape, deterministic=True, **kw)

    fkey = api.run_forward(*args, out, **kw)
    bkey = api.run_backward(*args, go, dkv, dscore, dape.zero_(), **kw)
    bwd_det()
    row = bench.ShapeRow(f"r{ratio} {S.config_name(coff, d)}", tokens, n, fkey.tag, bkey.tag,
                         fwd_bytes=bench.op_bytes("fwd", coff=coff, d=d, n_tokens=tokens,
                                                  n_rows=n, ratio=ratio),
                         bwd_bytes=bench.op_bytes("bwd", coff=coff, d=d, n_tokens=tokens,
                                                  n_rows=n, ratio=ratio),
                         copy_bw=copy_bw)
    cold = {"iters": iters, "warmup": warmup}
    row.fused_fwd_cold_us = bench.cold_median(fwd, flush, **cold).median_us
    row.fused_fwd_graph_us = bench.graph_median(fwd, **cold).median_us
    row.fused_bwd_cold_us = bench.cold_median(bwd_only, flush, before=dape.zero_,
                                              **cold).median_us
    row.fused_bwd_det_cold_us = bench.cold_median(bwd_det, flush, before=dape.zero_,
                                                  **cold).median_us
    row.fused_bwd_graph_us = bench.graph_median(bwd, **cold).median_us
    row.copy_fwd_cold_us = bench.cold_copy_us(row.fwd_bytes, flush, **cold)
    row.copy_bwd_cold_us = bench.cold_copy_us(row.bwd_bytes, flush, **cold)
    row.extra["ratio"] = ratio
    return row
