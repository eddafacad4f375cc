"""Two implementations on the same inputs: how far apart they are, and each from the
references (``csagate compare``).

Per case and output (out, and dKV/dScore/dAPE when both provide a backward): max |A - B|,
the count of differing elements, and each one's max error against the fp64 oracle and the
fp32 eager reference. Plain records; nothing here prints.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from csagate.gates import comparators
from csagate.gates.cases import Case
from csagate.gates.errors import one_line
from csagate.gates.implementation import has_backward
from csagate.gates.runner import case_inputs
from csagate.reference import backward


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


@dataclass(frozen=True)
class CaseDiff:
    case: Case
    tensors: tuple[TensorDiff, ...] = ()
    error: str = ""           # one line when either side raised


def _diff(name: str, a: torch.Tensor, b: torch.Tensor, eager: torch.Tensor,
          oracle: torch.Tensor) -> TensorDiff:
    same = comparators.tolerance(a, b, bound=0.0, allowed=0,
                            mask=~(torch.isnan(a.float()) & torch.isnan(b.float())))
    return TensorDiff(name, a.numel(), same.max_abs, same.n_diff,
                      comparators.max_abs_error(a, oracle), comparators.max_abs_error(b, oracle),
                      comparators.max_abs_error(a, eager), comparators.max_abs_error(b, eager))


def _run(impl, ins, go, n_rows: int, case: Case, grads: bool) -> dict[str, torch.Tensor]:
    got = {"out": impl.forward(*ins, n_rows, ratio=case.ratio, coff=case.coff)}
    if grads:
        dkv, dscore, dape = impl.backward(*ins, go, ratio=case.ratio, coff=case.coff)
        got.update(dkv=dkv, dscore=dscore, dape=dape)
    return got


def compare_case(a, b, case: Case, device) -> CaseDiff:
    """Both implementations on ``case``'s inputs (the gate's inputs, seeds and all)."""
    try:
        pack, go, _, _ = case_inputs(case, device)
        ins = pack.inputs()
        grads = has_backward(a) and has_backward(b)
        got_a = _run(a, ins, go, pack.n_rows, case, grads)
        got_b = _run(b, ins, go, pack.n_rows, case, grads)
        eager = backward(*ins, go, ratio=case.ratio, coff=case.coff, precision="fp32")
        oracle = backward(*ins, go, ratio=case.ratio, coff=case.coff, precision="fp64")
        refs = {"out": (eager.out, oracle.out), "dkv": (eager.dkv, oracle.dkv),
                "dscore": (eager.dscore, oracle.dscore), "dape": (eager.dape, oracle.dape)}
        return CaseDiff(case, tuple(_diff(n, got_a[n], got_b[n], *refs[n]) for n in got_a))
    except Exception as exc:
        return CaseDiff(case, error=one_line(exc))


def compare(a, b, cases: Sequence[Case], device, progress=None) -> tuple[CaseDiff, ...]:
    found = []
    for i, case in enumerate(cases):
        if progress is not None:
            progress(i, len(cases), case.name)
        found.append(compare_case(a, b, case, device))
    return tuple(found)
