"""The deterministic dAPE reduction (issue 12.3): ``dape += sum over b of partials[b]``, or
``dape = 0 + sum`` for a fresh dAPE (the ``zero_dape`` flag: the caller need not zero it).

A deterministic backward (``schedule.BwdSchedule.deterministic``,
``schedule.R4Schedule.deterministic``) stores each CTA's dAPE partial into its own slice
``partials[bx]`` of a ``(gx, ratio, W)`` fp32 buffer, every slot written once. This kernel
then sums the gx slices of each element in an order fixed by the code, in round-to-nearest
fp32, and adds the sum to ``dape`` (which keeps the backward's accumulate-into-dape contract)
or, with ``zero_dape``, to +0.0 (the bits a zeroed dape would get, without zeroing it first):

* a CTA owns 32 consecutive elements; its warp ``w`` (of ``WARPS``) sums the slices
  ``b = w, w + WARPS, w + 2*WARPS, ...`` in ascending order, one lane per element (each load
  instruction reads 128 contiguous bytes);
* the ``WARPS`` sums of an element are then added in ascending ``w`` through shared memory.

The order depends on gx alone, not on scheduling, so dAPE is bitwise identical run to run.
``WARPS`` independent chains per element (instead of one chain of gx dependent loads) keep the
pass short at the d=128 configs, where it is most of the deterministic mode's cost (measured
on the H200: docs/PERF_NOTES.md). Compiled once per arch (no GPU needed), cached per device.
"""

from __future__ import annotations

import threading

import cuda.bindings.driver as cuda
from csagate.kernels._dsl import compile_for, cute_modules, env_stream, fake_vec, sym
from csagate.kernels.device import F32, I32, add_rn

cutlass, cute = cute_modules()

WARPS = 8           # slice chains per element
LANES = 32          # elements per CTA (one per lane)
THREADS = WARPS * LANES


@cute.kernel
def _reduce_kernel(mPart: cute.Tensor, mDApe: cute.Tensor, n_parts: I32, n: I32,
                   zero_dape: I32):
    # Launched as a programmatic dependent of the deterministic backward (PDL): its CTAs may
    # be scheduled while the backward's last CTAs run; this waits until that grid has
    # finished and its partials are visible (a no-op without a prerequisite grid).
    cute.arch.griddepcontrol_wait()
    tx, _, _ = cute.arch.thread_idx()
    bx, _, _ = cute.arch.block_idx()
    lane = tx % LANES
    w = tx // LANES
    i = bx * LANES + lane
    smem = cutlass.memory.SmemAllocator()
    sums = smem.allocate_tensor(F32, cute.make_layout((WARPS, LANES), stride=(LANES, 1)),
                                byte_alignment=16)
    acc = F32(0.0)
    if i < n:
        for b in cutlass.range(w, n_parts, WARPS, unroll=4):
            acc = add_rn(acc, mPart[b, i])
    sums[w, lane] = acc
    cute.arch.sync_threads()
    if w == 0 and i < n:
        total = sums[0, lane]
        for k in cutlass.range_constexpr(1, WARPS):
            total = add_rn(total, sums[k, lane])
        prev = F32(0.0)
        if zero_dape == 0:
            prev = mDApe[i]
        mDApe[i] = add_rn(prev, total)


@cute.jit
def _reduce_host(mPart: cute.Tensor, mDApe: cute.Tensor, zero_dape: I32, stream: cuda.CUstream):
    # TVM-FFI: partials flattened to (gx * n,), dape flattened to (n,); both extents symbolic.
    n = mDApe.shape[0]
    n_parts = mPart.shape[0] // n
    mPart2 = cute.make_tensor(mPart.iterator, cute.make_layout((n_parts, n), stride=(n, 1)))
    _reduce_kernel(mPart2, mDApe, n_parts, n, zero_dape).launch(
        grid=(cute.ceil_div(n, LANES), 1, 1), block=(THREADS, 1, 1),
        smem=WARPS * LANES * 4, stream=stream, use_pdl=True)


def build_reduce(arch: str):
    """Compile the reduction for ``arch`` (no GPU needed)."""
    return compile_for(arch, _reduce_host, fake_vec(F32, sym(), align=16),
                       fake_vec(F32, sym(), align=16), I32(0), env_stream())


_lock = threading.Lock()
_compiled: dict[str, object] = {}
_loaded: set[int] = set()


def executor(arch: str, device_index: int):
    """The reduction for one device (compiled on first use per arch; the first use on a device
    loads its module and must not be under CUDA graph capture: an eager step does it)."""
    fn = _compiled.get(arch)
    if fn is not None and device_index in _loaded:
        return fn
    with _lock:
        import torch

        if device_index not in _loaded and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("first deterministic backward under CUDA graph capture: "
                               "the dAPE reduction is not loaded; run one eager step "
                               "before capturing")
        if arch not in _compiled:
            _compiled[arch] = build_reduce(arch)
        _loaded.add(device_index)
        return _compiled[arch]


def launch_reduce(fn, *, partials, dape, zero_dape: bool = False) -> None:
    """dape += partials.sum(0) in ascending slice order (``zero_dape``: dape = +0.0 + the sum,
    whatever it held), on torch's current stream; ``partials`` is (gx, *dape.shape), both
    contiguous."""
    if dape.numel() == 0 or partials.shape[0] == 0:
        if zero_dape:
            dape.zero_()
        return
    fn(partials.view(-1), dape.view(-1), int(zero_dape))
