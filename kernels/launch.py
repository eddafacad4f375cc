"""The full launch path of the host API (kernels/api.py): validate a launch into caller
buffers, dispatch it, load and launch the kernel (and the deterministic backward's dAPE
reduction), and remember a default launch for the fast path (kernels/fastpath.py).
Design: docs/KERNELS.md section 5.
"""

from __future__ import annotations

import torch
from csagate.kernels import fastpath
from csagate.kernels._dsl import sm_count
from csagate.kernels.cache import CACHE
from csagate.kernels.dispatch import kernel_for
from csagate.kernels.registry import KernelKey, ReduceKey
from csagate.kernels.validate import (
    check_grad_buffers,
    check_launchable,
    check_rows_per_cta,
    check_support,
    check_values,
    device_arch,
    require_cuda,
)

_LAUNCH_NAMES = {"cu_seqlens": "cu", "cu_seqlens_comp": "cuc"}  # message name -> launch arg


def launch_stream(device: torch.device, stream):
    return stream if stream is not None else torch.cuda.current_stream(device)


def _keep_alive(stream, device: torch.device, tensors) -> None:
    """On a stream other than the current one, tell the allocator the tensors are in use there."""
    if stream != torch.cuda.current_stream(device):
        for t in tensors:
            t.record_stream(stream)


def bwd_ctas(key: KernelKey, n_rows: int, rows_per_cta: int | None, device_index: int
             ) -> tuple[int, int | None]:
    """(gx, rows_per_cta) of a backward launch: the CTAs along the rows and, for a family that
    takes it, the rows per CTA (``schedule.rows_per_cta`` unless given); else None."""
    if not key.family.takes_rows_per_cta:
        return -(-n_rows // key.schedule.rows_per_cta), None
    if rows_per_cta is None:  # the kernel's resident CTAs: known once it is loaded (executor)
        rows_per_cta = key.family.rows_per_cta(n_rows, key.d, key.coff, key.schedule,
                                               sm_count(device_index),
                                               CACHE.resident_ctas(key, device_index))
    most = key.family.max_rows_per_cta
    cap = most(key.schedule) if most is not None else None
    if cap is not None and int(rows_per_cta) > cap:
        raise ValueError(f"rows_per_cta={int(rows_per_cta)} exceeds the {cap} rows per CTA "
                         f"the ratio={key.ratio} {key.config} backward takes")
    return -(-n_rows // int(rows_per_cta)), int(rows_per_cta)


def _prepare(direction: str, tensors: dict, stream, *, ratio: int, coff: int, check: bool,
             rows_per_cta=None) -> torch.device:
    """The full path's validation of a launch into caller buffers: the device to launch on."""
    rows_name = "out" if direction == "fwd" else "grad_out"
    t = tensors
    check_support(t["kv"], t["score"], t["ape"], t["cu_seqlens"], t["cu_seqlens_comp"],
                  t[rows_name], ratio=ratio, coff=coff, out_name=rows_name)
    if direction == "bwd":
        check_grad_buffers(t["kv"], t["ape"], t["dkv"], t["dscore"], t["dape"])
        check_rows_per_cta(ratio, rows_per_cta)
    require_cuda()
    device = check_launchable(tensors, stream)
    if check:
        check_values(t["cu_seqlens"], t["cu_seqlens_comp"], ratio=ratio,
                     n_tokens=t["kv"].shape[0], n_rows=t[rows_name].shape[0],
                     out_name=rows_name)
    return device


def _launch(key: KernelKey, device, stream, tensors: dict, rows_per_cta=None,
            zero_dape: bool = False) -> None:
    """Load ``key`` onto ``device`` and launch it on ``stream`` (or the current one),
    remembering a default launch for the fast path."""
    remember = stream is None and rows_per_cta is None
    args = {_LAUNCH_NAMES.get(name, name): t for name, t in tensors.items()}
    n_rows = args["out" if key.direction == "fwd" else "grad_out"].shape[0]
    partials = red = None
    gx = 0
    with torch.cuda.device(device):
        stream = launch_stream(device, stream)
        with torch.cuda.stream(stream):  # the capture check looks at the launch stream
            fn = CACHE.executor(key, device.index)
            if key.direction == "bwd":  # after the load: the rows take the kernel's occupancy
                gx, rows_per_cta = bwd_ctas(key, n_rows, rows_per_cta, device.index)
                if rows_per_cta is not None:
                    args["rows_per_cta"] = rows_per_cta
                if not key.deterministic:
                    args["zero_dape"] = zero_dape
            if key.deterministic:
                from csagate.kernels.reduce import launch_reduce, partial_rows

                dape = args["dape"]
                rows = partial_rows(gx, dape.numel())  # beyond gx: the split form's stage rows
                red = CACHE.executor(ReduceKey(key.arch, split=rows > gx), device.index)
                partials = fastpath.fill_partials(
                    torch.empty((rows, *dape.shape), dtype=torch.float32, device=device))
                # partials[0]: dape's shape at the buffer's base (slice bx by pointer offset)
                args["dape"] = partials[0]
        _keep_alive(stream, device, tensors.values())
        with torch.cuda.stream(stream):  # the compiled functions launch on the current one
            key.family.launch(fn, key, **args)
            if red is not None:
                launch_reduce(red, partials=partials, dape=dape, n_parts=gx,
                              zero_dape=zero_dape)
    if remember:
        fastpath.remember(key, args["kv"], n_rows, fn, rows_per_cta, partials, red, gx)


def run(direction: str, tensors: dict, *, ratio: int, coff: int, stream, check: bool,
        rows_per_cta=None, deterministic: bool = False, zero_dape: bool = False
        ) -> KernelKey | None:
    """The full path of a launch into caller buffers: validate, dispatch, launch."""
    device = _prepare(direction, tensors, stream, ratio=ratio, coff=coff, check=check,
                      rows_per_cta=rows_per_cta)
    n_rows, d = tensors["out" if direction == "fwd" else "grad_out"].shape
    if n_rows == 0:
        if zero_dape:  # nothing launches, dape is still the (zero) gradient
            with torch.cuda.device(device), torch.cuda.stream(launch_stream(device, stream)):
                tensors["dape"].zero_()
        return None
    key = kernel_for(direction, ratio, coff, d, n_rows, device_arch(device.index),
                     deterministic)
    _launch(key, device, stream, tensors, rows_per_cta, zero_dape)
    return key
