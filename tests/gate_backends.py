"""Small reference-backed gate backends for the CPU tests, and the faults planted into them.

``RefBackend`` computes "fused" results with the reference itself (fp32, on CPU), so the
unfaulted gate must PASS; ``FaultyBackend`` plants exactly one fault into exactly one case
(matched by its inputs' shape and segment lengths), so the gate must FAIL that case at the
right gate and still run the others. ``SMALL_CASES`` mirrors the contract's case kinds
(union, scaled, padding, overflow) at ratio 8 and d 16/32 so a whole gate run takes well
under a second. None of this is reachable from the ``csagate`` CLI.
"""

from __future__ import annotations

import torch
from csagate.gates.backend import BuildError
from csagate.gates.cases import Case
from csagate.gates.verdict import Selection
from csagate.reference import backward, forward, never_consumed_mask
from csagate.reference.inputs import PAD_GRAD_SEED

RATIO = 8
RAGGED = (23, 40, 9)                 # tails in every segment
EDGE = (7, 64, 0, 9, 8, 3, 35)       # short, empty, exact-multiple and tail segments


def _case(name, coff, d, lens, kind="union", **kw) -> Case:
    return Case(name, coff, d, tuple(lens), kind, "small CPU stand-in", ratio=RATIO, **kw)


SMALL_DRIFT = Case("drift/r4-c2d16/1x64", 2, 16, (64,), "drift",
                   "small stand-in for the ratio=4 drift check", ratio=4)

SMALL_CASES: tuple[Case, ...] = (
    _case("c1d16/1x256", 1, 16, (256,)),                 # N=32: fwd large, bwd default
    _case("c1d16/ragged", 1, 16, RAGGED),                # N=8: fwd small, bwd small
    _case("c1d16/edge", 1, 16, EDGE),                    # N=14: fwd default, bwd default
    _case("c2d16/1x64", 2, 16, (64,)),                   # N=8
    _case("c2d16/edge", 2, 16, EDGE),                    # N=14
    _case("c1d32/1x64", 1, 32, (64,)),                   # N=8
    _case("c2d32/1x48", 2, 32, (48,)),                   # N=6
    _case("c2d16/1x64/x64", 2, 16, (64,), "scaled", scale=64.0),  # twin of c2d16/1x64
    _case("c1d32/ragged+pad3r5t", 1, 32, RAGGED, "padding", grad_seed=PAD_GRAD_SEED,
          pad_rows=3, pad_tokens=5),
    _case("c2d32/ragged+pad2r3t", 2, 32, RAGGED, "padding", grad_seed=PAD_GRAD_SEED,
          pad_rows=2, pad_tokens=3),
    _case("c1d16/overflow", 1, 16, (RATIO,), "overflow"),
)

CONFIGS = ((1, 16), (2, 16), (1, 32), (2, 32))
FWD_SMALL_MAX, FWD_LARGE_MIN, BWD_SMALL_MAX = 8, 32, 12
FWD_LARGE = {(1, 16)}
BWD_SMALL = {(1, 16), (2, 16)}


def fwd_schedule(coff: int, d: int, n: int) -> str:
    if n <= FWD_SMALL_MAX:
        return "small"
    if n >= FWD_LARGE_MIN and (coff, d) in FWD_LARGE:
        return "large"
    return "default"


def bwd_schedule(coff: int, d: int, n: int) -> str:
    return "small" if n <= BWD_SMALL_MAX and (coff, d) in BWD_SMALL else "default"


def matches(case: Case, kv: torch.Tensor, cu: torch.Tensor, ratio: int) -> bool:
    """Whether these inputs are ``case``'s (shapes and segment lengths identify every case
    except the scaled case and its unit-scale twin, which no fault targets)."""
    lens = tuple(int(x) for x in torch.diff(cu.long()).tolist())
    return (ratio == case.ratio and lens == case.lens
            and tuple(kv.shape) == (case.tokens, case.coff * case.d))


class RefBackend:
    """The reference as the "kernels": fp32 eager forward/backward on CPU, a mini table."""

    def __init__(self):
        self.device = torch.device("cpu")
        self.built: list = []
        self.grad_outs: list[torch.Tensor] = []

    def build(self, targets, progress=None) -> list:
        for i, target in enumerate(targets):
            if progress:
                progress(i, len(targets), f"r{target[0]} c{target[1]}d{target[2]}")
            self.built.append(tuple(target))
        if progress:
            progress(len(targets), len(targets), "built")
        return [f"ref-r{r}-c{c}d{d}" for r, c, d in targets]

    def forward(self, kv, score, ape, cu, cuc, out, *, ratio, coff):
        d = out.shape[1]
        out.copy_(forward(kv, score, ape, cu, cuc, ratio=ratio, coff=coff, n_rows=out.shape[0]))
        self.after_forward(kv, cu, out, ratio=ratio, coff=coff)
        if ratio != RATIO:
            return None
        return Selection("fwd", coff, d, fwd_schedule(coff, d, out.shape[0]))

    def backward(self, kv, score, ape, cu, cuc, grad_out, dkv, dscore, dape, *, ratio, coff):
        d = grad_out.shape[1]
        self.grad_outs.append(grad_out.clone())
        prefill = (dkv.clone(), dscore.clone())
        res = backward(kv, score, ape, cu, cuc, grad_out, ratio=ratio, coff=coff)
        dkv.copy_(res.dkv)
        dscore.copy_(res.dscore)
        dape += res.dape
        self.after_backward(kv, score, ape, cu, cuc, grad_out, dkv, dscore, dape, prefill,
                            ratio=ratio, coff=coff)
        if ratio != RATIO:
            return None
        return Selection("bwd", coff, d, bwd_schedule(coff, d, grad_out.shape[0]))

    def after_forward(self, kv, cu, out, *, ratio, coff) -> None:
        """Where a fault edits the forward's output."""

    def after_backward(self, kv, score, ape, cu, cuc, grad_out, dkv, dscore, dape, prefill, *,
                       ratio, coff) -> None:
        """Where a fault edits the backward's outputs (``prefill``: the buffers as given)."""

    def selectable(self, direction: str) -> set[Selection]:
        pick = fwd_schedule if direction == "fwd" else bwd_schedule
        probes = (1, FWD_SMALL_MAX + 1, FWD_LARGE_MIN) if direction == "fwd" else \
            (1, BWD_SMALL_MAX + 1)
        return {Selection(direction, coff, d, pick(coff, d, n))
                for coff, d in CONFIGS for n in probes}

    def describe(self) -> dict:
        return {"backend": "reference (CPU test stand-in)", "device": "cpu", "gpu": "none",
                "arch": "cpu", "torch": torch.__version__}


# --- faults -----------------------------------------------------------------------------------


def bump(t: torch.Tensor, index, steps: int = 1) -> None:
    """Move one element ``steps`` representable values away from zero (bf16: one bf16 step)."""
    ints = {torch.bfloat16: torch.int16, torch.float32: torch.int32}[t.dtype]
    t.view(ints)[index] += steps


def case_named(name: str) -> Case:
    return next(c for c in SMALL_CASES if c.name == name)


class FaultyBackend(RefBackend):
    """RefBackend with one fault planted into the runs of one case."""

    def __init__(self, fault: str, case: str | None = None, **opts):
        super().__init__()
        self.fault = fault
        self.case = case_named(case) if case else None
        self.opts = opts
        self.fwd_calls = 0
        self.bwd_calls = 0

    def _hit(self, kv, cu, ratio) -> bool:
        return self.case is not None and matches(self.case, kv, cu, ratio)

    def after_forward(self, kv, cu, out, *, ratio, coff):
        if not self._hit(kv, cu, ratio):
            return
        self.fwd_calls += 1
        if self.fault == "large_error":
            out[3, 5] += 0.5
        elif self.fault == "nondeterministic" and self.fwd_calls == 3:
            bump(out, (0, 0))
        elif self.fault == "nan_mask":
            out[0, 0] = 1.0

    def after_backward(self, kv, score, ape, cu, cuc, grad_out, dkv, dscore, dape, prefill, *,
                       ratio, coff):
        if self.fault == "drift" and ratio == 4:
            bump(dscore, (5, 7))
            return
        if self.fault == "raises" and self._hit(kv, cu, ratio):
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB\n(details)")
        if not self._hit(kv, cu, ratio):
            return
        self.bwd_calls += 1
        if self.fault == "count":
            # ``steps`` consumed slots of dkv moved by one bf16 step (well inside max_abs).
            for i in range(self.opts["n"]):
                bump(dkv, (i, 0))
        elif self.fault == "unwritten":
            # One never-consumed slot the "kernel" forgot: it keeps the buffer's prefill.
            mask = never_consumed_mask(cu, ratio=ratio, coff=coff, d=dkv.shape[1] // coff,
                                       n_tokens=dkv.shape[0])
            slot = tuple(int(i) for i in mask.nonzero()[0])
            dkv[slot] = prefill[0][slot]
        elif self.fault == "pad_grad_out":
            # Padding rows' grad_out NOT ignored: each adds the backward of a first block
            # at tokens [0, ratio), which is what the forward computes for them.
            n_valid = int(cuc[-1])
            pad_go = grad_out.clone()
            pad_go[:n_valid] = 0
            one = torch.tensor([0, ratio], dtype=cu.dtype)
            for row in range(n_valid, grad_out.shape[0]):
                extra = backward(kv, score, ape, one, torch.tensor([0, 1], dtype=cu.dtype),
                                 pad_go[row:row + 1], ratio=ratio, coff=coff)
                dkv.copy_((dkv.float() + extra.dkv.float()).to(dkv.dtype))
                dscore.copy_((dscore.float() + extra.dscore.float()).to(dscore.dtype))
                dape += extra.dape
        elif self.fault == "token_pad_row":
            dkv[-1, 0] = 2.0 ** -100  # tiny: no tolerance notices, exact zeros must
        elif self.fault == "dape":
            dape[0, 0] += 2e-3

    def selectable(self, direction):
        found = super().selectable(direction)
        if self.fault == "coverage" and direction == "fwd":
            found.add(Selection("fwd", 2, 32, "large"))
        return found


class FailingBuildBackend(RefBackend):
    def build(self, targets, progress=None):
        raise BuildError("building ratio=128 c1d128 for sm_90a failed: ptxas error")

