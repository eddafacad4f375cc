"""Two implementations on the same inputs: how far apart they are, and each from the
references (``csagate compare``).

Per case and output (out, and dKV/dScore/dAPE when both provide a backward): max |A - B|,
the count of differing elements, and each one's max error against the fp64 oracle and the
fp32 eager reference; the distribution of |A - B| in bf16 steps (:func:`spread`: p50, p90,
p99, p99.9, max) and, for ``out``, where it concentrates (:func:`where`: by the length of the
row's segment and by the window's place in its segment, first to last quarter). Plain
records; nothing here prints.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from csagate.gates import comparators
from csagate.gates.cases import Case
from csagate.gates.errors import one_line
from csagate.gates.runner import case_inputs
from csagate.reference import backward

QUANTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p99.9", 0.999))
# Segment-length buckets (tokens): [lower, upper) and their labels.
LENGTH_BUCKETS = ((0, 1024, "<1K"), (1024, 8192, "1K-8K"), (8192, 65536, "8K-64K"),
                  (65536, float("inf"), ">=64K"))
QUARTERS = ("first quarter", "second quarter", "third quarter", "last quarter")


@dataclass(frozen=True)
class Spread:
    """Quantiles of |A - B| in bf16 steps (0: equal; NaN in one only: inf)."""

    numel: int
    p50: float
    p90: float
    p99: float
    p999: float
    max: float


@dataclass(frozen=True)
class Where:
    """|A - B| of the ``out`` rows in one group: ``by`` "length" (the row's segment length
    bucket) or "window" (the quarter of its segment the window is in), or "padding"."""

    by: str
    group: str
    numel: int
    n_diff: int
    max_steps: float
    p99: float


def bf16_steps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|A - B| per element in bf16 steps, fp32. bf16 tensors: the count of representable bf16
    values between them (exact, across binades). Other dtypes: ``|a - b|`` over one bf16 step
    at the larger magnitude (fractional; fp32 dAPE). Equal values (NaN == NaN): 0; NaN in one
    only, or an infinity against a finite value: inf."""
    from csagate.gates.comparators import bf16_ordinal

    af, bf = a.float(), b.float()
    nan_a, nan_b = torch.isnan(af), torch.isnan(bf)
    same = (af == bf) | (nan_a & nan_b)
    if a.dtype == torch.bfloat16 and b.dtype == torch.bfloat16:
        steps = (bf16_ordinal(a) - bf16_ordinal(b)).abs().float()
    else:
        big = torch.maximum(af.abs(), bf.abs())
        exp = torch.frexp(big.clamp(min=torch.finfo(torch.float32).tiny)).exponent
        step = torch.ldexp(torch.ones_like(big), (exp - 8).float())  # bf16: 8 bits of mantissa
        steps = (af - bf).abs() / step
    inf = torch.full((), float("inf"), device=af.device)
    steps = torch.where(nan_a ^ nan_b, inf, steps)
    steps = torch.where(torch.isinf(af) ^ torch.isinf(bf), inf, steps)
    return torch.where(same, torch.zeros((), device=af.device), steps)


def _quantile(sorted_steps: torch.Tensor, q: float) -> float:
    """The nearest-rank quantile of an ascending 1-D tensor (an element's value, never an
    interpolation: a step count stays a step count)."""
    n = sorted_steps.numel()
    if n == 0:
        return 0.0
    rank = min(n - 1, max(0, int(-(-q * n // 1)) - 1))
    return float(sorted_steps[rank])


def spread(steps: torch.Tensor) -> Spread:
    """p50, p90, p99, p99.9 (nearest rank) and the max of ``steps`` (any shape)."""
    flat = steps.flatten().double().sort().values
    qs = {name: _quantile(flat, q) for name, q in QUANTILES}
    return Spread(flat.numel(), qs["p50"], qs["p90"], qs["p99"], qs["p99.9"],
                  float(flat[-1]) if flat.numel() else 0.0)


def row_groups(cu: torch.Tensor, cuc: torch.Tensor, n_rows: int) -> tuple[list[str], list[str]]:
    """Per output row: its segment length bucket and its window's quarter of the segment
    (block i of nb is in quarter 4*i // nb); capacity padding rows are "padding" in both."""
    bounds = [int(x) for x in cu.tolist()]
    rows = [int(x) for x in cuc.tolist()]
    length, window = ["padding"] * n_rows, ["padding"] * n_rows
    for s in range(len(rows) - 1):
        nb, n = rows[s + 1] - rows[s], bounds[s + 1] - bounds[s]
        label = next(lab for lo, hi, lab in LENGTH_BUCKETS if lo <= n < hi)
        for i in range(nb):
            if rows[s] + i < n_rows:
                length[rows[s] + i] = label
                window[rows[s] + i] = QUARTERS[4 * i // nb]
    return length, window


def where(steps: torch.Tensor, cu: torch.Tensor, cuc: torch.Tensor) -> tuple[Where, ...]:
    """Per group of ``out`` rows (``steps`` (N, d)): how many elements, how many differ, the
    max and p99 in bf16 steps; by segment length bucket, then by window quarter, each in a
    fixed order (groups with no row left out), padding rows last."""
    length, window = row_groups(cu, cuc, steps.shape[0])
    found = []
    for by, labels, order in (("length", length, [lab for _, _, lab in LENGTH_BUCKETS]),
                              ("window", window, list(QUARTERS))):
        for group in order + (["padding"] if by == "window" else []):
            pick = torch.tensor([lab == group for lab in labels], dtype=torch.bool,
                                device=steps.device)
            if not bool(pick.any()):
                continue
            part = steps[pick]
            s = spread(part)
            found.append(Where("padding" if group == "padding" else by, group, part.numel(),
                               int((part != 0).sum()), s.max, s.p99))
    return tuple(found)


@dataclass(frozen=True)
class TensorDiff:
    tensor: str
    numel: int
    max_abs: float            # max |A - B| (NaN in one only: inf)
    n_diff: int               # elements differing by value (NaN == NaN)
    a_oracle: float           # max |A - fp64|
    b_oracle: float
    a_eager: float            # max |A - fp32 eager|
    b_eager: float
    steps: Spread | None = None                 # |A - B| in bf16 steps, over every element
    where: tuple[Where, ...] = field(default=())  # out only: where the difference is


@dataclass(frozen=True)
class CaseDiff:
    case: Case
    tensors: tuple[TensorDiff, ...] = ()
    error: str = ""           # one line when either side raised


def _diff(name: str, a: torch.Tensor, b: torch.Tensor, eager: torch.Tensor,
          oracle: torch.Tensor, pack=None) -> TensorDiff:
    same = comparators.tolerance(a, b, bound=0.0, allowed=0,
                            mask=~(torch.isnan(a.float()) & torch.isnan(b.float())))
    steps = bf16_steps(a, b)
    at = where(steps, pack.cu, pack.cuc) if name == "out" and pack is not None else ()
    return TensorDiff(name, a.numel(), same.max_abs, same.n_diff,
                      comparators.max_abs_error(a, oracle), comparators.max_abs_error(b, oracle),
                      comparators.max_abs_error(a, eager), comparators.max_abs_error(b, eager),
                      spread(steps), at)


def _run(driver, ins, go, n_rows: int, case: Case, grads: bool) -> dict[str, torch.Tensor]:
    """One implementation on one case through its driver, into buffers allocated here (as
    the gate allocates them; dAPE zeroed: it accumulates)."""
    kv = ins[0]
    d = kv.shape[1] // case.coff
    out = torch.zeros((n_rows, d), dtype=torch.bfloat16, device=kv.device)
    driver.forward(*ins, out, ratio=case.ratio, coff=case.coff)
    got = {"out": out}
    if grads:
        dkv, dscore = torch.zeros_like(kv), torch.zeros_like(ins[1])
        dape = torch.zeros_like(ins[2])
        driver.backward(*ins, go, dkv, dscore, dape, ratio=case.ratio, coff=case.coff)
        got.update(dkv=dkv, dscore=dscore, dape=dape)
    return got


def compare_case(a, b, case: Case) -> CaseDiff:
    """Both implementations (their drivers, on one device) on ``case``'s inputs (the gate's
    inputs, seeds and all)."""
    try:
        pack, go, _, _ = case_inputs(case, a.device)
        ins = pack.inputs()
        grads = a.applies.backward and b.applies.backward
        got_a = _run(a, ins, go, pack.n_rows, case, grads)
        got_b = _run(b, ins, go, pack.n_rows, case, grads)
        eager = backward(*ins, go, ratio=case.ratio, coff=case.coff, precision="fp32")
        oracle = backward(*ins, go, ratio=case.ratio, coff=case.coff, precision="fp64")
        refs = {"out": (eager.out, oracle.out), "dkv": (eager.dkv, oracle.dkv),
                "dscore": (eager.dscore, oracle.dscore), "dape": (eager.dape, oracle.dape)}
        return CaseDiff(case, tuple(_diff(n, got_a[n], got_b[n], *refs[n], pack=pack)
                                   for n in got_a))
    except Exception as exc:
        return CaseDiff(case, error=one_line(exc))


def compare(a, b, cases: Sequence[Case], progress=None) -> tuple[CaseDiff, ...]:
    """``a`` and ``b``: the two implementations' drivers (``csagate.gates.driver.Driver``)."""
    found = []
    for i, case in enumerate(cases):
        if progress is not None:
            progress(i, len(cases), case.name)
        found.append(compare_case(a, b, case))
    return tuple(found)
