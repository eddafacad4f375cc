"""How a host API call reaches its kernel (docs/KERNELS.md section 5.1), one path per call:
:func:`call` launches a remembered signature's compiled function (the fast path), else
:func:`full` validates, allocates, dispatches, launches and remembers the launch."""

from __future__ import annotations

import functools

import torch
from csagate.kernels._dsl import sm_count
from csagate.kernels.cache import CACHE
from csagate.kernels.dispatch import select
from csagate.kernels.registry import KernelKey, ReduceKey
from csagate.kernels.validate import INT32_LIMIT, check_launch

# Test hook: a value (NaN) the deterministic path fills its partials with before the launch.
PARTIALS_FILL: float | None = None

# (direction, deterministic, ratio, coff, row width, device index, N) -> Entry
FAST: dict = {}
FAST_MAX = 4096  # signatures remembered (N varies little in training)
_NOT_FAST = (ValueError, TypeError, AttributeError)
_LAUNCH_NAMES = ("kv", "score", "ape", "cu", "cuc")


def fill_partials(partials: torch.Tensor) -> torch.Tensor:
    if PARTIALS_FILL is not None:
        partials.fill_(PARTIALS_FILL)
    return partials


class Entry:
    """A remembered launch: the tvm_ffi.Function, the arguments after the tensors, an empty_like
    template, and the deterministic dAPE reduction (its function, slice count, stage rows)."""

    __slots__ = ("key", "call", "tail", "seg_bits", "max_tokens", "template", "reduce")

    def __init__(self, key, call, tail, seg_bits, max_tokens, template, reduce):
        self.key, self.call, self.tail, self.seg_bits = key, call, tail, seg_bits
        self.max_tokens, self.template, self.reduce = max_tokens, template, reduce

    def launch_tail(self, cu) -> tuple:
        """The remembered arguments, behind device.segment_bits(B) where ``seg_bits``."""
        return ((cu.shape[0] - 1).bit_length(), *self.tail) if self.seg_bits else self.tail


# --- the fast path ---------------------------------------------------------------------------


def call(direction: str, inputs: tuple, outputs: tuple | None, *, ratio: int, coff: int,
         n_rows=None, stream=None, check: bool = False, rows_per_cta=None,
         deterministic: bool = False, zero_dape: bool = False
         ) -> tuple[KernelKey | None, tuple]:
    """One api call: ``(key, outputs)``. The fast path where it may apply (no explicit stream,
    ``rows_per_cta`` or ``check``, N known) and the signature is remembered, else :func:`full`."""
    if (stream is None and rows_per_cta is None and not check
            and (n_rows is not None or outputs is not None or direction == "bwd")):
        try:
            kv, cu = inputs[0], inputs[3]
            t, w = kv.shape
            rows = n_rows
            if rows is None:
                rows = (outputs[0] if direction == "fwd" else inputs[5]).shape[0]
            e = FAST.get((direction, deterministic, ratio, coff, w, kv.get_device(), rows))
            if e is not None and ratio <= t <= e.max_tokens and cu.shape[0] >= 2:
                return e.key, _fast_launch(e, direction, inputs, outputs, zero_dape)
        except _NOT_FAST:  # an unusual argument (the compiled checks refuse before launching)
            pass  # the full path raises the api's one-line error
    return full(direction, inputs, outputs, ratio=ratio, coff=coff, n_rows=n_rows,
                stream=stream, check=check, rows_per_cta=rows_per_cta,
                deterministic=deterministic, zero_dape=zero_dape)


def _fast_launch(e: Entry, direction: str, inputs: tuple, outputs, zero_dape: bool) -> tuple:
    """Launch a remembered signature (allocating ``outputs`` when None): the outputs."""
    if outputs is None:  # the backward's dape is zeroed by the launch (zero_dape)
        outputs = ((torch.empty_like(e.template),) if direction == "fwd" else
                   (torch.empty_like(inputs[0]), torch.empty_like(inputs[1]),
                    torch.empty_like(inputs[2])))
    tail = e.launch_tail(inputs[3])
    if direction == "fwd":
        e.call(*inputs, *outputs, *tail)
    elif e.reduce is None:
        e.call(*inputs, *outputs, *tail, int(zero_dape))
    else:  # partials, the kernel, the reduction (reduce.launch_reduce's call, inlined)
        reduce, n_parts, n_groups = e.reduce
        partials = fill_partials(torch.empty_like(e.template))
        e.call(*inputs, outputs[0], outputs[1], partials[0], *tail, 0)
        reduce(partials.view(-1), outputs[2].view(-1), n_parts, n_groups, int(zero_dape))
    return outputs


def raw_call(fn):
    """The ``tvm_ffi.Function`` behind a compiled function (no Python ``__call__`` layer)."""
    import tvm_ffi

    inner = getattr(fn, "__tvm_ffi_object__", None)
    if inner is not None:  # the DSL's kwargs wrapper around a tvm_ffi.Function
        inner = inner()
        if inner is not None:
            return inner
    if type(fn) is not tvm_ffi.Function and isinstance(fn, tvm_ffi.Function):
        return functools.partial(tvm_ffi.Function.__call__, fn)
    return fn


def remember(key: KernelKey, kv, n_rows: int, fn, rows_per_cta, partials=None,
             reduce_fn=None, n_parts: int = 0) -> None:
    """Remember a full-path launch; ``n_parts``: dAPE partial slices, one per CTA along rows."""
    if len(FAST) >= FAST_MAX:
        return
    width = kv.shape[1]
    tail = (int(rows_per_cta),) if rows_per_cta is not None else ()
    tmpl = red = None
    if key.direction == "fwd":
        tmpl = torch.empty((1, 1), dtype=torch.bfloat16, device=kv.device).expand(n_rows, key.d)
    elif partials is not None:
        tmpl = partials.new_empty((1, 1, 1)).expand(partials.shape)
        red = (raw_call(reduce_fn), n_parts, partials.shape[0] - n_parts)
    FAST[(key.direction, key.deterministic, key.ratio, key.coff, width, kv.get_device(),
          n_rows)] = Entry(key, raw_call(fn), tail, key.family.takes_segment_bits,
                           (INT32_LIMIT - 1) // width, tmpl, red)


# --- the full path ---------------------------------------------------------------------------


def launch_stream(device: torch.device, stream):
    return stream if stream is not None else torch.cuda.current_stream(device)


def bwd_ctas(key: KernelKey, n_rows: int, rows_per_cta: int | None, device_index: int
             ) -> tuple[int, int | None]:
    """(gx, rows_per_cta) of a backward launch: the CTAs along the rows and, for a family that
    takes it, the rows per CTA (``schedule.rows_per_cta`` unless given); else None."""
    family = key.family
    if not family.takes_rows_per_cta:
        return -(-n_rows // key.schedule.rows_per_cta), None
    if rows_per_cta is None:  # the kernel's resident CTAs: known once it is loaded (executor)
        rows_per_cta = family.rows_per_cta(n_rows, key.d, key.coff, key.schedule,
                                           sm_count(device_index),
                                           CACHE.resident_ctas(key, device_index))
    most = family.max_rows_per_cta
    cap = most(key.schedule) if most is not None else None
    if cap is not None and int(rows_per_cta) > cap:
        raise ValueError(f"rows_per_cta={int(rows_per_cta)} exceeds the {cap} rows per CTA "
                         f"the ratio={key.ratio} {key.config} backward takes")
    return -(-n_rows // int(rows_per_cta)), int(rows_per_cta)


def _allocate(direction: str, inputs: tuple, n_rows: int, d: int, device) -> tuple:
    """The outputs of an allocating call (on the current stream): dape is zeroed by the launch,
    or by :func:`full` when N == 0."""
    if direction == "fwd":
        return (torch.empty((n_rows, d), dtype=torch.bfloat16, device=device),)
    kv, score, ape = inputs[:3]
    alloc = torch.zeros_like if n_rows == 0 else torch.empty_like
    return alloc(kv), alloc(score), torch.empty_like(ape)


def full(direction: str, inputs: tuple, outputs: tuple | None, *, ratio: int, coff: int,
         n_rows=None, stream=None, check: bool = False, rows_per_cta=None,
         deterministic: bool = False, zero_dape: bool = False
         ) -> tuple[KernelKey | None, tuple]:
    """Validate, allocate (``outputs`` None), dispatch and launch: ``(key, outputs)``, key None
    when N == 0 (nothing launches)."""
    device, arch, n_rows = check_launch(direction, inputs, outputs, ratio=ratio, coff=coff,
                                        n_rows=n_rows, stream=stream, check=check,
                                        rows_per_cta=rows_per_cta)
    d = inputs[0].shape[1] // coff
    remember_it = stream is None and rows_per_cta is None
    with torch.cuda.device(device):
        launch_on = launch_stream(device, stream)
        # on another stream than the caller's current one, the allocator must be told
        other = launch_on if launch_on != torch.cuda.current_stream(device) else None
        with torch.cuda.stream(launch_on):  # allocation, capture check, launch
            if outputs is None:
                outputs = _allocate(direction, inputs, n_rows, d, device)
            if n_rows == 0:
                if zero_dape:  # nothing launches, dape is still the (zero) gradient
                    outputs[2].zero_()
                return None, outputs
            key = select(direction, ratio, coff, d, n_rows, arch, deterministic)
            _launch(key, device, inputs, outputs, n_rows, rows_per_cta, zero_dape,
                    remember_it, other)
    return key, outputs


def _launch(key: KernelKey, device, inputs, outputs, n_rows: int, rows_per_cta,
            zero_dape: bool, remember_it: bool, other_stream) -> None:
    """Load ``key`` onto ``device`` and launch it on the current stream, remembering a default
    launch for the fast path (``remember_it``)."""
    args = dict(zip(_LAUNCH_NAMES, inputs))
    if key.direction == "fwd":
        args["out"] = outputs[0]
    else:
        args.update(grad_out=inputs[5], dkv=outputs[0], dscore=outputs[1], dape=outputs[2])
    partials = red = None
    gx = 0
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
        partials = fill_partials(
            torch.empty((rows, *dape.shape), dtype=torch.float32, device=device))
        # partials[0]: dape's shape at the buffer's base (slice bx by pointer offset)
        args["dape"] = partials[0]
    if other_stream is not None:
        for t in (*inputs, *outputs):
            t.record_stream(other_stream)
    key.family.launch(fn, key, **args)
    if red is not None:
        launch_reduce(red, partials=partials, dape=dape, n_parts=gx, zero_dape=zero_dape)
    if remember_it:
        remember(key, args["kv"], n_rows, fn, rows_per_cta, partials, red, gx)
