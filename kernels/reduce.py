"""The deterministic dAPE reduction: ``dape += sum over b of partials[b]`` (``zero_dape``:
``dape = 0 + sum``), each element summed in an order fixed by the code (a warp's slices in
ascending order, then the warps' sums in ascending order), so dAPE is bitwise identical run to
run. Design and cost: docs/KERNELS.md section 2.1.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
from csagate.kernels._dsl import compile_for, cute_modules, env_stream, fake_vec, sym
from csagate.kernels.device import F32, I32, add_rn
from csagate.kernels.schedule import REDUCE_DEPTHS

cutlass, cute = cute_modules()

WARPS = 8           # slice chains per element
LANES = 32          # lanes of a warp, each owning VEC consecutive elements
VEC = 4             # elements per lane (one 16-byte load per slice)
THREADS = WARPS * LANES
SPAN = LANES * VEC  # elements per CTA
DEPTHS = REDUCE_DEPTHS  # slice loads a lane issues together (PERF_NOTES section 10.3)


@cute.kernel
def _reduce_kernel(mPart: cute.Tensor, mDApe: cute.Tensor, n_parts: I32, n: I32,
                   zero_dape: I32, depths: cutlass.Constexpr):
    # PDL: wait until the deterministic backward's grid has finished and its partials are visible.
    cute.arch.griddepcontrol_wait()
    tx, _, _ = cute.arch.thread_idx()
    bx, _, _ = cute.arch.block_idx()
    lane = tx % LANES
    w = tx // LANES
    q = bx * LANES + lane  # this lane's group of VEC elements: [q*VEC, q*VEC + VEC)
    smem = cutlass.memory.SmemAllocator()
    sums = smem.allocate_tensor(F32, cute.make_layout((WARPS, SPAN), stride=(SPAN, 1)),
                                byte_alignment=16)
    acc = cute.make_rmem_tensor((1, VEC), F32)
    acc.fill(0.0)
    if q * VEC < n:  # n is a multiple of VEC: a group is wholly in range or wholly out
        # slices b = w + j*WARPS in ascending j, loads issued in groups of depths[i] and
        # added in order after the group is issued (a load never waits on an add)
        m = (n_parts - w + WARPS - 1) // WARPS
        start = I32(0)
        for depth in depths:
            groups = (m - start) // depth
            for g in cutlass.range(groups, unroll=1):
                j0 = start + g * depth
                vs = [cute.local_tile(mPart, (1, VEC), (w + (j0 + t) * WARPS, q)).load()
                      for t in range(depth)]
                for v in vs:
                    for k in cutlass.range_constexpr(VEC):
                        acc[0, k] = add_rn(acc[0, k], v[k])
            start = start + groups * depth
        for j in cutlass.range(start, m, unroll=1):
            v = cute.local_tile(mPart, (1, VEC), (w + j * WARPS, q)).load()
            for k in cutlass.range_constexpr(VEC):
                acc[0, k] = add_rn(acc[0, k], v[k])
    cute.local_tile(sums, (1, VEC), (w, lane)).store(acc.load())
    cute.arch.sync_threads()
    if w == 0 and q * VEC < n:
        total = cute.make_rmem_tensor((1, VEC), F32)
        total.store(cute.local_tile(sums, (1, VEC), (0, lane)).load())
        for j in cutlass.range_constexpr(1, WARPS):
            part = cute.local_tile(sums, (1, VEC), (j, lane)).load()
            for k in cutlass.range_constexpr(VEC):
                total[0, k] = add_rn(total[0, k], part[k])
        prev = cute.make_rmem_tensor((1, VEC), F32)
        prev.fill(0.0)
        dst = cute.local_tile(mDApe, (1, VEC), (0, q))
        if zero_dape == 0:
            prev.store(dst.load())
        for k in cutlass.range_constexpr(VEC):
            total[0, k] = add_rn(prev[0, k], total[0, k])
        dst.store(total.load())


@cute.jit
def _reduce_host(mPart: cute.Tensor, mDApe: cute.Tensor, zero_dape: I32, stream: cuda.CUstream,
                 depths: cutlass.Constexpr = DEPTHS):
    # TVM-FFI: partials (gx * n,), dape (n,), both symbolic, divisible by VEC, 16-byte aligned.
    n = mDApe.shape[0]
    n_parts = mPart.shape[0] // n
    mPart2 = cute.make_tensor(mPart.iterator, cute.make_layout((n_parts, n), stride=(n, 1)))
    mDApe2 = cute.make_tensor(mDApe.iterator, cute.make_layout((1, n), stride=(n, 1)))
    _reduce_kernel(mPart2, mDApe2, n_parts, n, zero_dape, depths).launch(
        grid=(cute.ceil_div(n, SPAN), 1, 1), block=(THREADS, 1, 1),
        smem=WARPS * SPAN * 4, stream=stream, use_pdl=True)


def build_reduce(arch: str, depths: tuple[int, ...] = DEPTHS):
    """Compile the reduction for ``arch`` (no GPU needed); ``depths``: the load groups."""
    return compile_for(arch, _reduce_host, fake_vec(F32, sym(VEC), align=16),
                       fake_vec(F32, sym(VEC), align=16), I32(0), env_stream(), tuple(depths))


def launch_reduce(fn, *, partials, dape, zero_dape: bool = False) -> None:
    """dape += partials.sum(0) in ascending slice order (``zero_dape``: dape = +0.0 + the sum),
    on torch's current stream; ``partials`` is (gx, *dape.shape), both contiguous."""
    if dape.numel() == 0 or partials.shape[0] == 0:
        if zero_dape:
            dape.zero_()
        return
    fn(partials.view(-1), dape.view(-1), int(zero_dape))
