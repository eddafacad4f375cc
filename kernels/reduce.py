"""The deterministic dAPE reduction (issue 12.3): ``dape += sum over b of partials[b]``.

A deterministic backward (``schedule.BwdSchedule.deterministic``,
``schedule.R4Schedule.deterministic``) stores each CTA's dAPE partial into its own slice
``partials[bx]`` of a ``(gx, ratio, W)`` fp32 buffer, every slot written once. This kernel
then sums the gx slices of each element in ascending ``bx`` order, one thread per element, in
round-to-nearest fp32, and adds the sum to ``dape`` (which keeps the backward's
accumulate-into-dape contract). The order is fixed by the code, not by scheduling, so dAPE is
bitwise identical run to run. Compiled once per arch (no GPU needed), cached per device.
"""

from __future__ import annotations

import threading

import cuda.bindings.driver as cuda
from csagate.kernels._dsl import compile_for, cute_modules, gmem_ptr, stream_arg
from csagate.kernels.device import F32, I32, add_rn, stream_of

cutlass, cute = cute_modules()

THREADS = 256


@cute.kernel
def _reduce_kernel(mPart: cute.Tensor, mDApe: cute.Tensor, n_parts: I32, n: I32):
    tx, _, _ = cute.arch.thread_idx()
    bx, _, _ = cute.arch.block_idx()
    i = bx * THREADS + tx
    if i < n:
        acc = F32(0.0)
        for b in cutlass.range(n_parts, unroll=4):
            acc = add_rn(acc, mPart[b, i])
        mDApe[i] = add_rn(mDApe[i], acc)


@cute.jit
def _reduce_host(partials: cute.Pointer, dape: cute.Pointer, n_parts: I32, n: I32,
                 stream: cuda.CUstream):
    mPart = cute.make_tensor(partials, cute.make_layout((n_parts, n), stride=(n, 1)))
    mDApe = cute.make_tensor(dape, cute.make_layout((n,), stride=(1,)))
    _reduce_kernel(mPart, mDApe, n_parts, n).launch(
        grid=(cute.ceil_div(n, THREADS), 1, 1), block=(THREADS, 1, 1), stream=stream)


def build_reduce(arch: str):
    """Compile the reduction for ``arch`` (no GPU needed)."""
    return compile_for(arch, _reduce_host, gmem_ptr(F32), gmem_ptr(F32), I32(1), I32(1),
                       stream_arg())


_lock = threading.Lock()
_compiled: dict[str, object] = {}
_loaded: dict[int, object] = {}


def executor(arch: str, device_index: int):
    """The reduction bound to one device (compiled and loaded on first use; the first use must
    not be under CUDA graph capture: ``api.build`` and an eager step both do it)."""
    ex = _loaded.get(device_index)
    if ex is not None:
        return ex
    with _lock:
        if device_index not in _loaded:
            import torch

            if torch.cuda.is_current_stream_capturing():
                raise RuntimeError("first deterministic backward under CUDA graph capture: "
                                   "the dAPE reduction is not loaded; run one eager step "
                                   "before capturing")
            if arch not in _compiled:
                _compiled[arch] = build_reduce(arch)
            _loaded[device_index] = _compiled[arch].to(device_index)
        return _loaded[device_index]


def launch_reduce(fn, *, partials, dape, stream=None) -> None:
    """dape += partials.sum(0) in ascending slice order; ``partials`` is (gx, *dape.shape)."""
    n = dape.numel()
    n_parts = partials.shape[0]
    if n == 0 or n_parts == 0:
        return
    fn(gmem_ptr(F32, partials.data_ptr()), gmem_ptr(F32, dape.data_ptr()), I32(n_parts),
       I32(n), stream_of(stream, dape.device))
