"""The gate's comparators: one small pure function per check, each returning its numbers.

Every function takes tensors and returns a frozen record (never just a bool): the counts, the
worst error, and where a check fails the first offending index with the values there, so a
failed gate explains itself. Nothing here knows about cases, kernels or printing.

The contract's numbers (docs/CONTRACT.md section 4.2, ``csagate.gates.limits``) are the
defaults:

* G1 ``bitwise_replay``: runs compared as bit patterns (integer views, since NaN != NaN);
  no NaN unless the case is the overflow case.
* ``bitwise``: equal bit patterns (integer views: -0.0 is not +0.0), every NaN equal to
  every NaN (docs/CONTRACT.md section 4.1).
* G2 ``tolerance``: every element within ``bound`` and ``n_diff`` within the count allowance
  (``limits.count_allowance``: a Chernoff bound at the calibrated rate, sound at every size);
  ``nan_mask`` replaces it on the overflow case.
* G3 ``oracle_parity``: ``max|fused - fp64| <= max|eager - fp64| * (1 + 1e-6) + 1e-4``.
* ``exact_zeros``: the never-consumed slots hold exact zeros.
* ``bf16_steps`` (small-ratio forward): every element within one bf16 step (or the fp32 noise
  floor) and the count within the allowance at the calibrated rate (docs/CONTRACT.md section 8).

``tolerance``, ``bf16_steps`` and ``oracle_parity`` take an optional ``mask``: the positions
judged (the finite positions of a partial-overflow case); counts and allowances are then over
the masked elements only, indices stay those of the full tensor. The coverage of the dispatch
tables is checked in :mod:`csagate.gates.coverage`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from csagate.gates.limits import (
    PARITY_ATOL,
    PARITY_RTOL,
    R4_FWD_FRACTION,
    count_allowance,
    count_informative,
)

__all__ = ["Bitwise", "NanMask", "Parity", "Replay", "ReplayTracker", "Steps", "Tolerance", "Zeros",
           "bf16_ordinal", "bf16_steps", "bit_view", "bitwise", "bitwise_equal", "count",
           "bitwise_replay", "exact_zeros",
           "max_abs_error", "nan_mask", "nan_mask_of", "oracle_parity", "parity_of",
           "replay_delta", "tolerance", "tolerance_ok"]

_INT_VIEW = {
    torch.bfloat16: torch.int16,
    torch.float16: torch.int16,
    torch.float32: torch.int32,
    torch.float64: torch.int64,
}

Index = tuple[int, ...]


def count(mask: torch.Tensor) -> int:
    """The True elements of a bool tensor: on the CPU ``count_nonzero`` (a bool ``sum`` widens
    every element to int64 first, several times slower), elsewhere ``sum`` (one kernel, where
    ``count_nonzero`` compares with zero first)."""
    return int(torch.count_nonzero(mask) if mask.device.type == "cpu" else mask.sum())


def _flat_index(mask: torch.Tensor) -> int | None:
    """Flat position of the first True in ``mask``, or None (no nonzero() materialization)."""
    flat = mask.reshape(-1)
    if flat.numel() == 0 or not bool(flat.any()):
        return None
    return int(torch.argmax(flat.to(torch.uint8)))


def _unravel(flat: int | None, shape) -> Index | None:
    if flat is None:
        return None
    return tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), tuple(shape)))


def _value(t: torch.Tensor, flat: int | None) -> float | None:
    return None if flat is None else float(t.reshape(-1)[flat])


def _max(t: torch.Tensor) -> float:
    """Max of a non-negative error tensor; NaN counts as +inf (a NaN error never passes)."""
    if t.numel() == 0:
        return 0.0
    worst = float(t.max())   # torch's max propagates NaN
    return float("inf") if math.isnan(worst) else worst


def _abs_diff(a: torch.Tensor, b: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    return (a.to(dtype) - b.to(dtype)).abs()


# Elements a comparison upcasts at a time (the fp64 differences of the largest packs would
# otherwise be gigabytes of temporaries).
CHUNK = 1 << 22


def _flat_chunks(*tensors: torch.Tensor):
    """(start, the tensors' flat slices) for each ``CHUNK`` elements, in order."""
    flat = [t.reshape(-1) for t in tensors]
    for i in range(0, flat[0].numel(), CHUNK):
        yield i, [f[i:i + CHUNK] for f in flat]


def max_abs_error(x: torch.Tensor, oracle: torch.Tensor) -> float:
    """``max|x - oracle|`` in fp64 (NaN anywhere gives +inf), ``CHUNK`` elements at a time."""
    if x.shape != oracle.shape:
        raise ValueError(f"shape mismatch: {tuple(x.shape)} vs {tuple(oracle.shape)}")
    return max((_max(_abs_diff(a, b, torch.float64)) for _, (a, b) in _flat_chunks(x, oracle)),
               default=0.0)


# --- G2: tolerance vs the fp32 eager reference ------------------------------------------


@dataclass(frozen=True)
class Tolerance:
    """Differing-element count and worst absolute error of ``fused`` against ``ref``."""

    numel: int
    n_diff: int
    allowed: int | None        # None: the count is not gated (dAPE)
    max_abs: float
    bound: float
    first_index: Index | None  # first element beyond ``bound``, else the first differing one
    fused_value: float | None
    ref_value: float | None
    ok: bool

    def summary(self) -> str:
        """Both numbers against their limits, the failing one first, then where."""
        abs_ok = self.max_abs <= self.bound
        size = f"max_abs {self.max_abs:.3e} {'<=' if abs_ok else '>'} {self.bound:.3e}"
        if self.allowed is None:
            count, count_ok = f"{self.n_diff} differing (count not gated)", True
        elif not count_informative(self.numel, self.allowed):
            count, count_ok = (f"{self.n_diff} differing (count uninformative at "
                               f"{self.numel} elements)"), True
        else:
            count_ok = self.n_diff <= self.allowed
            count = f"{self.n_diff} differing {'<=' if count_ok else '>'} {self.allowed} allowed"
        # the failing number first; the count first when both fail (or both pass)
        parts = [size, count] if (count_ok and not abs_ok) or self.allowed is None else \
            [count, size]
        where = ""
        if self.first_index is not None:
            where = (f"; first at {list(self.first_index)}: fused {self.fused_value!r} "
                     f"vs ref {self.ref_value!r}")
        return ", ".join(parts) + where


def _judged(fused: torch.Tensor, ref: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The positions a check judges: all, or ``mask`` (same shape)."""
    if fused.shape != ref.shape:
        raise ValueError(f"shape mismatch: fused {tuple(fused.shape)} vs ref {tuple(ref.shape)}")
    if mask is None:
        return torch.ones(fused.shape, dtype=torch.bool, device=fused.device)
    if mask.shape != fused.shape:
        raise ValueError(f"shape mismatch: mask {tuple(mask.shape)} vs {tuple(fused.shape)}")
    return mask


def tolerance_ok(max_abs: float, bound: float, n_diff: int, allowed: int | None) -> bool:
    """G2's rule: every element within ``bound`` and, unless None, at most ``allowed`` differ."""
    return max_abs <= bound and (allowed is None or n_diff <= allowed)


def tolerance(fused: torch.Tensor, ref: torch.Tensor, *, bound: float,
              allowed: int | None, mask: torch.Tensor | None = None) -> Tolerance:
    """G2: ``n_diff <= allowed`` (skipped when None) and every element within ``bound``.

    Elements are compared by value in fp32 (NaN differs from everything, and makes max_abs
    +inf); for bit-for-bit equality use :func:`bitwise`. With ``mask`` only the masked
    elements are compared (``numel`` counts them).
    """
    judged = _judged(fused, ref, mask)
    f, r = fused.float(), ref.float()
    differs = (f != r) & judged
    n_diff = count(differs)
    diff = torch.where(differs, (f - r).abs(), torch.zeros((), device=f.device))  # inf == inf
    max_abs = _max(diff)
    beyond = ~(diff <= bound)  # NaN counts as beyond
    flat = _flat_index(beyond)
    if flat is None:
        flat = _flat_index(differs)
    ok = tolerance_ok(max_abs, bound, n_diff, allowed)
    return Tolerance(
        numel=count(judged), n_diff=n_diff, allowed=allowed, max_abs=max_abs, bound=bound,
        first_index=_unravel(flat, fused.shape), fused_value=_value(fused, flat),
        ref_value=_value(ref, flat), ok=ok)


# --- bitwise: bit patterns -----------------------------------------------------------------


@dataclass(frozen=True)
class Bitwise:
    """Elements whose bit patterns differ (NaN == NaN; -0.0 != +0.0) and the first of them."""

    numel: int
    n_diff: int
    n_zero_sign: int           # of those, +0.0 against -0.0 (equal by value)
    first_index: Index | None
    fused_bits: str | None     # hex bit patterns at first_index
    ref_bits: str | None
    fused_value: float | None
    ref_value: float | None
    ok: bool
    max_abs: float = 0.0       # the largest |fused - ref| over the differing elements

    def summary(self) -> str:
        if self.ok:
            return f"bitwise equal ({self.numel} elements)"
        zeros = f" ({self.n_zero_sign} of them +0.0 vs -0.0)" if self.n_zero_sign else ""
        return (f"{self.n_diff} of {self.numel} elements differ in their bits{zeros}, first at "
                f"{list(self.first_index or ())}: fused {self.fused_value!r} "
                f"[{self.fused_bits}] vs ref {self.ref_value!r} [{self.ref_bits}]")


def bitwise(fused: torch.Tensor, ref: torch.Tensor, *,
            mask: torch.Tensor | None = None) -> Bitwise:
    """Bit-for-bit equality of two tensors of one dtype (docs/CONTRACT.md section 4.1): the
    integer views must be equal, except that every NaN equals every NaN (payload and sign of
    a NaN are not part of the contract). -0.0 and +0.0 differ. With ``mask`` only the masked
    elements are compared."""
    if fused.dtype != ref.dtype:
        raise ValueError(f"dtype mismatch: fused {fused.dtype} vs ref {ref.dtype}")
    judged = _judged(fused, ref, mask)
    both_nan = torch.isnan(fused) & torch.isnan(ref)
    differs = (bit_view(fused) != bit_view(ref)) & ~both_nan & judged
    zero_sign = differs & (fused == 0) & (ref == 0)
    flat = _flat_index(differs)
    width = 2 * fused.element_size()
    unsigned = (1 << 8 * fused.element_size()) - 1

    def bits(t):
        return None if flat is None else \
            f"0x{int(bit_view(t).reshape(-1)[flat]) & unsigned:0{width}x}"

    n_diff = count(differs)
    # the largest gap over the differing elements only: nothing to compute on an equal tensor
    gap = _max(_abs_diff(fused[differs], ref[differs])) if n_diff else 0.0
    return Bitwise(numel=count(judged), n_diff=n_diff, n_zero_sign=count(zero_sign),
                   first_index=_unravel(flat, fused.shape), fused_bits=bits(fused),
                   ref_bits=bits(ref), fused_value=_value(fused, flat),
                   ref_value=_value(ref, flat), ok=n_diff == 0, max_abs=gap)


# --- small-ratio forward: one bf16 step at the calibrated rate ---------------------------


def bf16_ordinal(t: torch.Tensor) -> torch.Tensor:
    """A monotone integer image of bf16 values: adjacent representable values differ by 1."""
    bits = t.to(torch.bfloat16).contiguous().view(torch.int16).to(torch.int32)
    mag = bits & 0x7FFF
    return torch.where(bits < 0, -mag, mag)


@dataclass(frozen=True)
class Steps:
    """How many elements differ from ``ref`` and by how many bf16 steps."""

    numel: int
    n_diff: int                # elements not equal to ref
    allowed: int               # count_allowance(numel, fraction)
    max_steps: int             # the most bf16 steps any element is off
    max_abs: float
    noise_atol: float          # an element > 1 step off still passes within this (see Rule)
    n_within_noise: int        # elements > 1 step off that passed only through noise_atol
    n_beyond: int              # elements > 1 step off and beyond noise_atol
    first_index: Index | None  # first element beyond, else the first differing one
    fused_value: float | None
    ref_value: float | None
    ok: bool

    def summary(self) -> str:
        count_ok = self.n_diff <= self.allowed
        count = f"{self.n_diff} differing {'<=' if count_ok else '>'} {self.allowed} allowed"
        if not count_informative(self.numel, self.allowed):
            count = f"{self.n_diff} differing (count uninformative at {self.numel} elements)"
        parts = [count,
                 f"max {self.max_steps} bf16 step(s), max_abs {self.max_abs:.3e}"]
        if self.n_beyond:
            parts.insert(0, f"{self.n_beyond} element(s) more than one bf16 step off"
                         + (f" and beyond {self.noise_atol:g}" if self.noise_atol else ""))
        if self.n_within_noise:
            parts.append(f"{self.n_within_noise} more than one step off within "
                         f"{self.noise_atol:g} (summation-order noise)")
        where = ""
        if self.first_index is not None:
            where = (f"; first at {list(self.first_index)}: fused {self.fused_value!r} "
                     f"vs ref {self.ref_value!r}")
        return ", ".join(parts) + where


def bf16_steps(fused: torch.Tensor, ref: torch.Tensor, *, fraction: float = R4_FWD_FRACTION,
               noise_atol: float = 0.0, mask: torch.Tensor | None = None) -> Steps:
    """Every element within one bf16 step (or, with ``noise_atol``, any number of steps within
    ``noise_atol`` absolute), and at most ``count_allowance(numel, fraction)`` of them differ.
    NaN on either side counts as beyond."""
    judged = _judged(fused, ref, mask)
    f, r = fused.float(), ref.float()
    differs = (f != r) & judged
    steps = (bf16_ordinal(fused) - bf16_ordinal(ref)).abs()
    nan = torch.isnan(f) | torch.isnan(r)
    diff = torch.where(differs, (f - r).abs(), torch.zeros((), device=f.device))
    far = differs & ((steps > 1) | nan)
    noise = far & ~nan & (diff <= noise_atol)
    beyond = far & ~noise
    numel = count(judged)
    allowed = count_allowance(numel, fraction)
    n_diff, n_beyond = count(differs), count(beyond)
    flat = _flat_index(beyond)
    if flat is None:
        flat = _flat_index(differs)
    judged_steps = torch.where(judged & ~nan, steps, torch.zeros_like(steps))
    return Steps(
        numel=numel, n_diff=n_diff, allowed=allowed,
        max_steps=int(judged_steps.max()) if numel else 0, max_abs=_max(diff),
        noise_atol=noise_atol, n_within_noise=count(noise), n_beyond=n_beyond,
        first_index=_unravel(flat, fused.shape), fused_value=_value(fused, flat),
        ref_value=_value(ref, flat), ok=n_diff <= allowed and n_beyond == 0)


# --- G3: fp64-oracle parity --------------------------------------------------------------


@dataclass(frozen=True)
class Parity:
    """``err_fused <= err_eager * (1 + rtol) + atol``, errors measured against the fp64 oracle."""

    err_fused: float
    err_eager: float
    bound: float
    ok: bool
    numel: int = 0             # elements compared (0: the check concluded nothing)

    def summary(self) -> str:
        rel = "<=" if self.ok else ">"
        return (f"err_fused {self.err_fused:.3e} {rel} bound {self.bound:.3e} "
                f"(err_eager {self.err_eager:.3e})")


def oracle_parity(fused: torch.Tensor, eager: torch.Tensor, oracle: torch.Tensor, *,
                  rtol: float = PARITY_RTOL, atol: float = PARITY_ATOL,
                  mask: torch.Tensor | None = None) -> Parity:
    """G3 for one tensor (on the ``mask`` positions only, if given). A non-finite eager error
    makes the bound meaningless: that fails."""
    if mask is not None:
        judged = _judged(fused, eager, mask)
        fused, eager, oracle = fused[judged], eager[judged], oracle[judged]
    return parity_of(max_abs_error(fused, oracle), max_abs_error(eager, oracle),
                     fused.numel(), rtol=rtol, atol=atol)


def parity_of(err_fused: float, err_eager: float, numel: int, *, rtol: float = PARITY_RTOL,
              atol: float = PARITY_ATOL) -> Parity:
    """G3's rule on the two largest errors against the fp64 oracle."""
    bound = err_eager * (1.0 + rtol) + atol
    ok = err_fused <= bound and err_eager != float("inf")
    return Parity(err_fused=err_fused, err_eager=err_eager, bound=bound, ok=ok, numel=numel)


# --- overflow case: NaN-mask equality -----------------------------------------------------


@dataclass(frozen=True)
class NanMask:
    """Where ``fused`` and ``eager`` are NaN, and whether those masks agree."""

    numel: int
    fused_nan: int
    eager_nan: int
    n_mismatch: int
    eager_full: bool
    require_full: bool
    first_index: Index | None  # first position where the masks differ
    fused_value: float | None
    eager_value: float | None
    ok: bool

    def summary(self) -> str:
        parts = []
        if self.n_mismatch:
            parts.append(f"NaN masks differ at {self.n_mismatch} of {self.numel} elements, "
                         f"first at {list(self.first_index or ())}: fused {self.fused_value!r} "
                         f"vs eager {self.eager_value!r}")
        if self.require_full and not self.eager_full:
            parts.append(f"eager mask not full ({self.eager_nan}/{self.numel} NaN)")
        return "; ".join(parts) or f"NaN masks equal ({self.fused_nan}/{self.numel} NaN)"


def nan_mask(fused: torch.Tensor, eager: torch.Tensor, *, require_full: bool = True) -> NanMask:
    """Overflow-case G2: equal NaN masks; with ``require_full`` eager must be NaN everywhere."""
    if fused.shape != eager.shape:
        raise ValueError(f"shape mismatch: fused {tuple(fused.shape)} vs eager "
                         f"{tuple(eager.shape)}")
    fn, en = torch.isnan(fused), torch.isnan(eager)
    mismatch = fn != en
    flat = _flat_index(mismatch)
    return nan_mask_of(fused.numel(), count(fn), count(en), count(mismatch),
                       require_full=require_full, first_index=_unravel(flat, fused.shape),
                       fused_value=_value(fused, flat), eager_value=_value(eager, flat))


def nan_mask_of(numel: int, fused_nan: int, eager_nan: int, n_mismatch: int, *,
                require_full: bool, first_index: Index | None, fused_value: float | None,
                eager_value: float | None) -> NanMask:
    """The NaN-mask rule on the counts: no position differs and, if required, eager is NaN
    everywhere."""
    eager_full = eager_nan == numel
    return NanMask(
        numel=numel, fused_nan=fused_nan, eager_nan=eager_nan, n_mismatch=n_mismatch,
        eager_full=eager_full, require_full=require_full, first_index=first_index,
        fused_value=fused_value, eager_value=eager_value,
        ok=n_mismatch == 0 and (eager_full or not require_full))


# --- G1: bitwise replay ---------------------------------------------------------------------


def bit_view(t: torch.Tensor) -> torch.Tensor:
    """The same bits as an integer tensor (bf16/fp16 -> int16, fp32 -> int32, fp64 -> int64)."""
    if t.dtype not in _INT_VIEW:
        return t
    return t.contiguous().view(_INT_VIEW[t.dtype])


@dataclass(frozen=True)
class Replay:
    """Bit-pattern comparison of every run against run 1, and the NaN count of all runs."""

    runs: int
    numel: int
    n_diff: tuple[int, ...]    # per run 2..n: elements whose bits differ from run 1
    first_run: int | None      # 1-based run of the first difference
    first_index: Index | None
    bits: tuple[int, ...] | None  # the (unsigned) bit patterns of every run at first_index
    nan_count: int             # NaN elements over all runs
    allow_nan: bool
    ok: bool

    def summary(self) -> str:
        parts = []
        if self.first_run is not None:
            pats = ", ".join(f"0x{b:x}" for b in self.bits or ())
            parts.append(f"run {self.first_run} differs from run 1 at "
                         f"{max(self.n_diff)} elements, first at {list(self.first_index or ())}"
                         f" (bits per run: {pats})")
        if self.nan_count and not self.allow_nan:
            parts.append(f"{self.nan_count} NaN over {self.runs} runs")
        return "; ".join(parts) or f"{self.runs} runs bitwise identical"


class ReplayTracker:
    """G1 for one tensor, one run at a time: run 1 is kept, each later run is compared with it
    as it comes and can be dropped (the gate holds two runs of a tensor, not all of them)."""

    def __init__(self, first: torch.Tensor, *, allow_nan: bool = False):
        self.first, self.base = first, bit_view(first)
        self.allow_nan = allow_nan
        self.runs, self.n_diff = 1, []
        self.first_run = self.flat = None
        self.bits: list[int] = []
        self.nan_count = _nan_count(first)

    def _bit(self, run: torch.Tensor) -> int:
        unsigned = (1 << 8 * self.base.element_size()) - 1
        return int(bit_view(run).reshape(-1)[self.flat]) & unsigned

    def add(self, run: torch.Tensor) -> None:
        self.runs += 1
        n_diff, flat = 0, None
        for i, (bits, base) in _flat_chunks(bit_view(run), self.base):
            differs = bits != base
            n = count(differs)
            if n and flat is None:
                flat = i + _flat_index(differs)
            n_diff += n
        self.n_diff.append(n_diff)
        if self.first_run is None and n_diff:
            self.first_run, self.flat = self.runs, flat
            # every earlier run has run 1's bits everywhere, so at this index too
            self.bits = [self._bit(self.first)] * (self.runs - 1)
        if self.flat is not None:
            self.bits.append(self._bit(run))
        self.nan_count += _nan_count(run)

    def result(self) -> Replay:
        ok = self.first_run is None and (self.allow_nan or self.nan_count == 0)
        return Replay(runs=self.runs, numel=self.first.numel(), n_diff=tuple(self.n_diff),
                      first_run=self.first_run,
                      first_index=_unravel(self.flat, self.first.shape),
                      bits=tuple(self.bits) if self.flat is not None else None,
                      nan_count=self.nan_count, allow_nan=self.allow_nan, ok=ok)


def _nan_count(t: torch.Tensor) -> int:
    if not t.is_floating_point():
        return 0
    return sum(count(torch.isnan(part)) for _, (part,) in _flat_chunks(t))


def bitwise_replay(runs: Sequence[torch.Tensor], *, allow_nan: bool = False) -> Replay:
    """G1 for one tensor: all runs bit-identical (integer views) and, unless allowed, NaN-free."""
    if not runs:
        raise ValueError("bitwise_replay needs at least one run")
    tracker = ReplayTracker(runs[0], allow_nan=allow_nan)
    for run in runs[1:]:
        tracker.add(run)
    return tracker.result()


def replay_delta(runs: Sequence[torch.Tensor]) -> float:
    """Largest ``|run_i - run_1|`` (recorded for dAPE, which is atomics-ordered).

    Positions NaN in both runs count as equal; NaN in one run only counts as +inf.
    """
    delta = 0.0
    for run in runs[1:]:
        a, b = run.double(), runs[0].double()
        diff = (a - b).abs()
        diff = torch.where(torch.isnan(a) & torch.isnan(b), torch.zeros_like(diff), diff)
        diff = torch.where(a == b, torch.zeros_like(diff), diff)  # inf == inf
        delta = max(delta, _max(diff))
    return delta


# --- never-consumed slots: exact zeros -----------------------------------------------------


@dataclass(frozen=True)
class Zeros:
    """How many masked slots are not exactly zero (NaN and -0.0 handling: NaN fails, -0.0 == 0)."""

    n_masked: int
    n_nonzero: int
    first_index: Index | None
    value: float | None
    ok: bool

    def summary(self) -> str:
        if self.ok:
            return f"{self.n_masked} masked slots exactly zero"
        return (f"{self.n_nonzero} of {self.n_masked} masked slots not exactly zero, first at "
                f"{list(self.first_index or ())}: {self.value!r}")


def exact_zeros(t: torch.Tensor, mask: torch.Tensor) -> Zeros:
    """Every slot where ``mask`` is True holds an exact zero."""
    if t.shape != mask.shape:
        raise ValueError(f"shape mismatch: tensor {tuple(t.shape)} vs mask {tuple(mask.shape)}")
    bad = mask & ~(t == 0)  # NaN != 0, so a NaN-prefilled slot left unwritten is caught
    flat = _flat_index(bad)
    n_nonzero = count(bad)
    return Zeros(n_masked=count(mask), n_nonzero=n_nonzero,
                 first_index=_unravel(flat, t.shape), value=_value(t, flat), ok=n_nonzero == 0)


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, shape and bits (recorded, not gated: whether fused happens to match eager
    exactly; bit patterns, so NaN == NaN of the same payload and -0.0 != +0.0)."""
    return (a.dtype == b.dtype and a.shape == b.shape
            and bool(torch.equal(bit_view(a), bit_view(b))))
