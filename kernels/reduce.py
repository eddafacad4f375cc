"""Deterministic dAPE reduction, ``dape += sum_b partials[b]`` (``zero_dape``: ``dape = 0 + sum``),
in an order fixed by the code and the slice count, so bitwise identical run to run. One pass:
warp ``w`` sums slices ``w, w + 8, ...`` ascending, warp 0 adds the 8 warp sums in ascending
``w``, then adds the total to dape. Split (many slices, :func:`groups`): CTA ``(c, g)`` sums
group ``g``'s contiguous slices likewise into a stage row (``0 + sum``) of the same buffer, then
the one pass sums the stage rows into dape. Design and cost: docs/KERNELS.md section 2.1."""

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
SPLIT_MIN_SLICES = 128  # more slices than this: the split form (each warp would sum > 16)
GROUP_MIN_SLICES = 16   # slices per group at least (2 per warp)
SPLIT_CTAS = 256        # the first pass's CTAs to aim for (about 2 per SM of an H200)


def groups(n_parts: int, n: int) -> int:
    """The first pass's groups for ``n_parts`` slices of ``n`` elements; 0: the one-pass form.
    A function of the shapes alone, so the order (and the bits) never depend on the GPU."""
    if n_parts <= SPLIT_MIN_SLICES:
        return 0
    blocks = -(-n // SPAN)
    aim = max(2, min(-(-SPLIT_CTAS // blocks), -(-n_parts // GROUP_MIN_SLICES)))
    per = -(-n_parts // aim)
    return -(-n_parts // per)  # no empty group


@cute.kernel
def _reduce_kernel(mIn: cute.Tensor, mOut: cute.Tensor, first: I32, count: I32, per: I32,
                   out_row: I32, n: I32, zero_out: I32, depths: cutlass.Constexpr,
                   trigger: cutlass.Constexpr):
    """mOut[out_row + g] (+)= the sum of mIn's rows first + [g*per, min(count, (g+1)*per))."""
    # PDL: the kernel before has finished past the wait; a first pass lets the second launch
    cute.arch.griddepcontrol_wait()
    if cutlass.const_expr(trigger):
        cute.arch.griddepcontrol_launch_dependents()
    tx, _, _ = cute.arch.thread_idx()
    bx, g, _ = cute.arch.block_idx()
    lane = tx % LANES
    w = tx // LANES
    q = bx * LANES + lane  # this lane's group of VEC elements: [q*VEC, q*VEC + VEC)
    lo = first + g * per  # the group's first slice and its slice count (0 for an empty group)
    cnt = cutlass.max(cutlass.min(count - g * per, per), 0)
    smem = cutlass.memory.SmemAllocator()
    sums = smem.allocate_tensor(F32, cute.make_layout((WARPS, SPAN), stride=(SPAN, 1)),
                                byte_alignment=16)
    acc = cute.make_rmem_tensor((1, VEC), F32)
    acc.fill(0.0)
    if q * VEC < n:  # n is a multiple of VEC: a group is wholly in range or wholly out
        # slices lo + w + j*WARPS, j ascending: loads issued a group at a time, added in order
        m = (cnt - w + WARPS - 1) // WARPS
        start = I32(0)
        for depth in depths:
            n_groups = (m - start) // depth
            for k0 in cutlass.range(n_groups, unroll=1):
                j0 = start + k0 * depth
                vs = [cute.local_tile(mIn, (1, VEC), (lo + w + (j0 + t) * WARPS, q)).load()
                      for t in range(depth)]
                for v in vs:
                    for k in cutlass.range_constexpr(VEC):
                        acc[0, k] = add_rn(acc[0, k], v[k])
            start = start + n_groups * depth
        for j in cutlass.range(start, m, unroll=1):
            v = cute.local_tile(mIn, (1, VEC), (lo + w + j * WARPS, q)).load()
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
        dst = cute.local_tile(mOut, (1, VEC), (out_row + g, q))
        if zero_out == 0:
            prev.store(dst.load())
        for k in cutlass.range_constexpr(VEC):
            total[0, k] = add_rn(prev[0, k], total[0, k])
        dst.store(total.load())


@cute.jit
def _reduce_host(mPart: cute.Tensor, mDApe: cute.Tensor, n_parts: I32, n_groups: I32,
                 zero_dape: I32, stream: cuda.CUstream, depths: cutlass.Constexpr = DEPTHS,
                 split: cutlass.Constexpr = False):
    # partials (rows * n,): the n_parts slices, then (split) the n_groups stage rows; dape (n,)
    n = mDApe.shape[0]
    rows = mPart.shape[0] // n
    mPart2 = cute.make_tensor(mPart.iterator, cute.make_layout((rows, n), stride=(n, 1)))
    mDApe2 = cute.make_tensor(mDApe.iterator, cute.make_layout((1, n), stride=(n, 1)))
    blocks = cute.ceil_div(n, SPAN)

    def launch(mOut, first, count, per, out_row, zero_out, trigger, gy=1):
        _reduce_kernel(mPart2, mOut, first, count, per, out_row, n, zero_out, depths,
                       trigger).launch(grid=(blocks, gy, 1), block=(THREADS, 1, 1),
                                       smem=WARPS * SPAN * 4, stream=stream, use_pdl=True)

    if cutlass.const_expr(split):  # groups into the stage rows after the slices, then those
        launch(mPart2, I32(0), n_parts, (n_parts + n_groups - 1) // n_groups, n_parts, I32(1),
               True, n_groups)
        launch(mDApe2, n_parts, n_groups, n_groups, I32(0), zero_dape, False)
    else:
        launch(mDApe2, I32(0), n_parts, n_parts, I32(0), zero_dape, False)


def build_reduce(arch: str, depths: tuple[int, ...] = DEPTHS, split: bool = False):
    """Compile the reduction for ``arch`` (no GPU needed); ``split``: the two-pass form."""
    return compile_for(arch, _reduce_host, fake_vec(F32, sym(VEC), align=16),
                       fake_vec(F32, sym(VEC), align=16), I32(0), I32(0), I32(0),
                       env_stream(), tuple(depths), bool(split))


def partial_rows(n_parts: int, n: int) -> int:
    """Rows of the partials buffer: the backward's ``n_parts`` slices and the stage rows."""
    return n_parts + groups(n_parts, n)


def launch_reduce(fn, *, partials, dape, n_parts: int, zero_dape: bool = False) -> None:
    """dape += partials[:n_parts].sum(0) in the fixed order (``zero_dape``: dape = +0.0 + sum) on
    torch's current stream; ``partials``: (partial_rows(n_parts, n), *dape.shape), contiguous;
    ``fn``: the form :func:`groups` picks."""
    if dape.numel() == 0 or n_parts == 0:
        if zero_dape:
            dape.zero_()
        return
    fn(partials.view(-1), dape.view(-1), n_parts, partials.shape[0] - n_parts, int(zero_dape))
