"""Small reference-backed stand-ins of the gate's own kernels for the CPU tests, and the faults
planted into them.

``RefImpl`` is an implementation (``csagate.gates.plugin``) with every hook the gate's own
kernels have (buffer hooks, dispatch tables, the op, the deterministic backward); it computes
"fused" results with the reference itself (fp32, on CPU), so the unfaulted gate must PASS;
``driven`` puts it behind the gate's driver, and ``use_stand_in`` makes it the built-in
``csagate`` of a CLI test. ``FaultyImpl`` plants exactly one fault into exactly one case
(matched by its inputs' shape, coff and segment lengths), so the gate must FAIL that case at
the right gate and still run the others. ``SMALL_CONTRACT`` mirrors the ratio=128 contract's
case kinds (union, scaled, padding, overflow, and the three hardening cases) at ratio 8 and
d 16/32 with a mini dispatch table and declared bucket edges; ``SMALL_R4_CONTRACT`` mirrors
the ratio=4 contract at d 16/32. A whole gate run takes about a second. None of this is
reachable from the ``csagate`` CLI.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from csagate.gates import contracts
from csagate.gates.cases import Case
from csagate.gates.driver import Driver
from csagate.gates.errors import BuildError
from csagate.gates.limits import BucketEdge
from csagate.gates.plugin import Supports
from csagate.gates.verdict import Selection
from csagate.reference import backward, forward, never_consumed_mask
from csagate.reference.compressor import _row_geometry, _torch_eager
from csagate.reference.seeds import PAD_GRAD_SEED

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
    _case("c1d16/overflow", 1, 16, (RATIO,), "overflow", inputs="overflow"),
)

SMALL_HARDENING: tuple[Case, ...] = (
    _case("c2d16/ragged/partial-overflow", 2, 16, RAGGED, "hardening",
          inputs="partial_overflow"),
    _case("c1d32/ragged/partial-overflow", 1, 32, RAGGED, "hardening",
          inputs="partial_overflow"),
    _case("c2d16/edge+pad3r5t/pad-nonfinite", 2, 16, EDGE, "hardening",
          grad_seed=PAD_GRAD_SEED, pad_rows=3, pad_tokens=5, inputs="pad_nonfinite"),
)

CONFIGS = ((1, 16), (2, 16), (1, 32), (2, 32))
FWD_SMALL_MAX, FWD_LARGE_MIN, BWD_SMALL_MAX = 8, 32, 12
FWD_LARGE = {(1, 16)}
BWD_SMALL = {(1, 16), (2, 16)}

SMALL_EDGES = (BucketEdge("fwd", "small", FWD_SMALL_MAX, upper=True),
               BucketEdge("fwd", "large", FWD_LARGE_MIN, upper=False),
               BucketEdge("bwd", "small", BWD_SMALL_MAX, upper=True))

SMALL_CONTRACT = replace(contracts.R128, ratio=RATIO, drift=SMALL_DRIFT, cases=SMALL_CASES,
                         hardening=SMALL_HARDENING, edges=SMALL_EDGES, deterministic_cases=())

# The deterministic-mode cases (CONTRACT.md 2.5): run with deterministic=True, G1 on dAPE too.
SMALL_DETERMINISTIC: tuple[Case, ...] = (
    _case("c1d16/edge/deterministic", 1, 16, EDGE, "deterministic", deterministic=True),
    _case("c2d32/ragged+pad2r3t/deterministic", 2, 32, RAGGED, "deterministic",
          grad_seed=PAD_GRAD_SEED, pad_rows=2, pad_tokens=3, deterministic=True),
)
SMALL_DET_CONTRACT = replace(SMALL_CONTRACT, deterministic_cases=SMALL_DETERMINISTIC)


def _r4(name, coff, d, lens, kind="union", **kw) -> Case:
    return Case(f"r4/{name}", coff, d, tuple(lens), kind, "small CPU stand-in", ratio=4, **kw)


R4_RAGGED = (23, 40, 9)                # ratio 4: 5, 10, 2 blocks
SMALL_R4_CASES: tuple[Case, ...] = (
    _r4("c1d16/ragged", 1, 16, R4_RAGGED),
    _r4("c2d16/edge", 2, 16, EDGE),
    _r4("c1d32/1x64", 1, 32, (64,)),
    _r4("c2d32/ragged", 2, 32, R4_RAGGED),
    _r4("c2d16/ragged+pad3r5t", 2, 16, R4_RAGGED, "padding", grad_seed=PAD_GRAD_SEED,
        pad_rows=3, pad_tokens=5),
    _r4("c1d16/overflow", 1, 16, (16,), "overflow", inputs="overflow"),
    _r4("c2d16/ragged/partial-overflow", 2, 16, R4_RAGGED, "partial-overflow",
        inputs="partial_overflow"),
)
SMALL_R4_CONTRACT = replace(contracts.R4, drift=SMALL_DRIFT, cases=SMALL_R4_CASES,
                            coverage_configs=CONFIGS, deterministic_cases=())


def fwd_schedule(coff: int, d: int, n: int) -> str:
    if n <= FWD_SMALL_MAX:
        return "small"
    if n >= FWD_LARGE_MIN and (coff, d) in FWD_LARGE:
        return "large"
    return "default"


def bwd_schedule(coff: int, d: int, n: int) -> str:
    return "small" if n <= BWD_SMALL_MAX and (coff, d) in BWD_SMALL else "default"


def matches(case: Case, kv: torch.Tensor, cu: torch.Tensor, ratio: int, coff: int) -> bool:
    """Whether these inputs are ``case``'s (shapes, coff and segment lengths identify every
    case except the scaled case and its unit-scale twin, which no fault targets)."""
    lens = tuple(int(x) for x in torch.diff(cu.long()).tolist())
    return (ratio == case.ratio and coff == case.coff and lens == case.lens
            and tuple(kv.shape) == (case.tokens, case.coff * case.d))


class RefImpl:
    """The reference as the "kernels": fp32 eager forward/backward on CPU, a mini table."""

    name = "csagate"
    label = ""                # judged as the gate's own kernels: no name in the headline
    supports = Supports()
    deterministic = True

    def __init__(self):
        self.device = torch.device("cpu")
        self.built: list = []
        self.grad_outs: list[torch.Tensor] = []
        self.deterministic_calls = 0
        self.deterministic_now = False

    def prepare(self, targets, progress=None) -> list:
        for i, target in enumerate(targets):
            if progress:
                progress(i, len(targets), f"r{target[0]} c{target[1]}d{target[2]}")
            self.built.append(tuple(target))
        if progress:
            progress(len(targets), len(targets), "built")
        return [f"ref-r{r}-c{c}d{d}" for r, c, d in targets]

    def forward(self, kv, score, ape, cu, cuc, n_rows, *, ratio, coff):
        out = torch.empty(n_rows, kv.shape[1] // coff, dtype=torch.bfloat16)
        self.forward_into(kv, score, ape, cu, cuc, out, ratio=ratio, coff=coff)
        return out

    def forward_into(self, kv, score, ape, cu, cuc, out, *, ratio, coff):
        d = out.shape[1]
        out.copy_(forward(kv, score, ape, cu, cuc, ratio=ratio, coff=coff, n_rows=out.shape[0]))
        self.after_forward(kv, score, ape, cu, cuc, out, ratio=ratio, coff=coff)
        return self.dispatch(ratio, "fwd", coff, d, out.shape[0])

    def backward_into(self, kv, score, ape, cu, cuc, grad_out, dkv, dscore, dape, *, ratio,
                      coff, deterministic=False):
        d = grad_out.shape[1]
        self.deterministic_calls += bool(deterministic)
        self.deterministic_now = bool(deterministic)
        self.grad_outs.append(grad_out.clone())
        prefill = (dkv.clone(), dscore.clone())
        res = backward(kv, score, ape, cu, cuc, grad_out, ratio=ratio, coff=coff)
        dkv.copy_(res.dkv)
        dscore.copy_(res.dscore)
        dape += res.dape
        self.after_backward(kv, score, ape, cu, cuc, grad_out, dkv, dscore, dape, prefill,
                            ratio=ratio, coff=coff)
        return self.dispatch(ratio, "bwd", coff, d, grad_out.shape[0])

    def through_op(self, kv, score, ape, cu, cuc, grad_out, *, n_rows, ratio, coff):
        """The op path: here the same reference calls into fresh buffers."""
        out = torch.zeros(n_rows, grad_out.shape[1], dtype=torch.bfloat16)
        self.forward_into(kv, score, ape, cu, cuc, out, ratio=ratio, coff=coff)
        grads = (torch.zeros_like(kv), torch.zeros_like(score), torch.zeros_like(ape))
        self.backward_into(kv, score, ape, cu, cuc, grad_out, *grads, ratio=ratio, coff=coff)
        return out, grads

    def after_forward(self, kv, score, ape, cu, cuc, out, *, ratio, coff) -> None:
        """Where a fault edits the forward's output."""

    def after_backward(self, kv, score, ape, cu, cuc, grad_out, dkv, dscore, dape, prefill, *,
                       ratio, coff) -> None:
        """Where a fault edits the backward's outputs (``prefill``: the buffers as given)."""

    def tables(self, direction: str) -> dict[str, dict[tuple[int, int], str]]:
        """The mini dispatch tables, bucket -> config -> schedule (the schedule is its name)."""
        if direction == "fwd":
            return {"small": {c: "small" for c in CONFIGS},
                    "default": {c: "default" for c in CONFIGS},
                    "large": {c: "large" for c in FWD_LARGE}}
        return {"small": {c: "small" for c in BWD_SMALL},
                "default": {c: "default" for c in CONFIGS}}

    def kernels(self, ratio, direction, configs=None):
        if ratio == 4:   # one schedule per config, no buckets
            return {("any", coff, d): Selection(direction, coff, d, "r4")
                    for coff, d in (configs or CONFIGS)}
        return {(bucket, coff, d): Selection(direction, coff, d, sched)
                for bucket, table in self.tables(direction).items()
                for (coff, d), sched in table.items() if configs is None or (coff, d) in configs}

    def dispatch(self, ratio, direction, coff, d, n_rows):
        if n_rows == 0:
            return None
        if ratio == 4:
            return Selection(direction, coff, d, "r4")
        pick = fwd_schedule if direction == "fwd" else bwd_schedule
        return Selection(direction, coff, d, pick(coff, d, n_rows))

    def describe(self) -> dict:
        return {"backend": "reference (CPU test stand-in)", "device": "cpu", "gpu": "none",
                "arch": "cpu", "torch": torch.__version__}


# --- faults -----------------------------------------------------------------------------------


def bump(t: torch.Tensor, index, steps: int = 1) -> None:
    """Move one element ``steps`` representable values away from zero (bf16: one bf16 step)."""
    ints = {torch.bfloat16: torch.int16, torch.float32: torch.int32}[t.dtype]
    t.view(ints)[index] += steps


def case_named(name: str) -> Case:
    return next(c for c in SMALL_CASES + SMALL_HARDENING + SMALL_R4_CASES + SMALL_DETERMINISTIC
                if c.name == name)


class FaultyImpl(RefImpl):
    """RefImpl with one fault planted into the runs of one case."""

    def __init__(self, fault: str, case: str | None = None, **opts):
        super().__init__()
        self.fault = fault
        self.case = case_named(case) if case else None
        self.opts = opts
        self.fwd_calls = 0
        self.bwd_calls = 0

    def through_op(self, kv, score, ape, cu, cuc, grad_out, *, n_rows, ratio, coff):
        out, grads = super().through_op(kv, score, ape, cu, cuc, grad_out, n_rows=n_rows,
                                        ratio=ratio, coff=coff)
        hit = self._hit(kv, cu, ratio, coff)
        if self.fault == "op" and hit:
            bump(grads[1], (0, 0))  # the op's dScore differs from the direct path's by a step
        elif self.fault == "op_swap" and hit:
            return out, (grads[1], grads[0], grads[2])   # dKV and dScore swapped
        elif self.fault == "op_alias" and hit:
            return self.direct[0], self.direct[1:]   # the direct path's own run-1 buffers
        return out, grads

    def _hit(self, kv, cu, ratio, coff) -> bool:
        return self.case is not None and matches(self.case, kv, cu, ratio, coff)

    def after_forward(self, kv, score, ape, cu, cuc, out, *, ratio, coff):
        if not self._hit(kv, cu, ratio, coff):
            return
        self.fwd_calls += 1
        if self.fwd_calls == 1:
            self.direct = [out]                     # run 1's buffer (op_alias returns it)
        if self.fault == "large_error":
            out[3, 5] += 0.5
        elif self.fault == "nondeterministic" and self.fwd_calls == 3:
            bump(out, (0, 0))
        elif self.fault == "nan_mask":
            out[0, 0] = 1.0
        elif self.fault == "count_out":
            for i in range(self.opts["n"]):
                bump(out, (i, 0), self.opts.get("steps", 1))
        elif self.fault == "drop_nan_chunk":
            # A merge that drops a chunk whose partial is NaN: the window's output is what it
            # would be without the non-finite slots (their weight gone, their values unread).
            bad_kv, bad_s = ~torch.isfinite(kv), ~torch.isfinite(score)
            dropped = forward(torch.where(bad_kv, torch.zeros_like(kv), kv),
                              torch.where(bad_s | bad_kv, torch.full_like(score, -1e4), score),
                              ape, cu, cuc, ratio=ratio, coff=coff, n_rows=out.shape[0])
            out.copy_(torch.where(torch.isnan(out), dropped, out))

    def after_backward(self, kv, score, ape, cu, cuc, grad_out, dkv, dscore, dape, prefill, *,
                       ratio, coff):
        if self.fault == "drift" and ratio == 4:
            bump(dscore, (5, 7))
            return
        if self.fault == "raises" and self._hit(kv, cu, ratio, coff):
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB\n(details)")
        if not self._hit(kv, cu, ratio, coff):
            return
        self.bwd_calls += 1
        if self.bwd_calls == 1:
            self.direct[1:] = [dkv, dscore, dape]
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
        elif self.fault == "tail_tiny":
            # the first never-consumed slot (a tail token) left at 2^-100 instead of zero
            mask = never_consumed_mask(cu, ratio=ratio, coff=coff, d=dkv.shape[1] // coff,
                                       n_tokens=dkv.shape[0])
            dkv[tuple(int(i) for i in mask.nonzero()[0])] = 2.0 ** -100
        elif self.fault == "token_pad_row":
            dkv[-1, 0] = 2.0 ** -100  # tiny: no tolerance notices, exact zeros must
        elif self.fault == "dape":
            dape[0, 0] += 2e-3
        elif self.fault == "nondeterministic_dape" and self.deterministic_now:
            # a "deterministic" backward whose dAPE moves by one fp32 ulp in its second run
            self.det_hits = getattr(self, "det_hits", 0) + 1
            if self.det_hits == 2:
                bump(dape, (1, 2))
        elif self.fault == "pad_leak":
            # Padding rows multiplied by zero instead of excluded: 0 * inf = NaN leaks.
            leaked = leaky_backward(kv, score, ape, cu, cuc, grad_out, ratio=ratio, coff=coff)
            dkv.copy_(leaked[0])
            dscore.copy_(leaked[1])
            dape.copy_(leaked[2])

    def tables(self, direction):
        found = super().tables(direction)
        if self.fault == "coverage" and direction == "fwd":
            found["large"] = {**found["large"], (2, 32): "large"}
        return found

    def dispatch(self, ratio, direction, coff, d, n_rows):
        if self.fault == "moved_edge" and ratio == RATIO and direction == "fwd" \
                and n_rows == FWD_LARGE_MIN and (coff, d) in FWD_LARGE:
            return Selection("fwd", coff, d, "default")   # ``>`` where ``>=`` was declared
        return super().dispatch(ratio, direction, coff, d, n_rows)


def leaky_backward(kv, score, ape, cu, cuc, grad_out, *, ratio, coff):
    """The backward before CONTRACT.md 2.3: padding rows in the graph, grad_out times zero."""
    leaves = [t.detach().clone().requires_grad_(True) for t in (kv, score, ape)]
    out = _torch_eager(*leaves, cu, cuc, ratio=ratio, coff=coff, n_rows=grad_out.shape[0],
                       precision="fp32")
    _, _, valid = _row_geometry(cu, cuc, grad_out.shape[0], ratio)
    out.backward(torch.where(valid[:, None], grad_out, torch.zeros((), dtype=grad_out.dtype)))
    return tuple(t.grad for t in leaves)


class FailingBuildImpl(RefImpl):
    def prepare(self, targets, progress=None):
        raise BuildError("building ratio=128 c1d128 for sm_90a failed: ptxas error")



def driven(impl) -> Driver:
    """``impl`` behind the gate's driver, on the CPU."""
    return Driver(impl, torch.device("cpu"))


STAND_IN: dict = {"backend": None}


def stand_in():
    """The built-in ``csagate`` of a CLI test (``use_stand_in``): ``STAND_IN["backend"]``."""
    return STAND_IN["backend"]


def use_stand_in(monkeypatch, impl=None) -> dict:
    """Make ``impl`` (default: a fresh ``RefImpl``) the gate's own kernels of the CLI, judged
    on the CPU in place of a GPU (the preflight says the CPU). Assigning
    ``STAND_IN["backend"]`` (the dict returned) swaps it."""
    from csagate.gates import implementation, judging

    STAND_IN["backend"] = impl if impl is not None else RefImpl()
    monkeypatch.setitem(implementation.BUILTINS, "csagate", "gate_backends:stand_in")
    monkeypatch.setattr(judging, "preflight", lambda device, kernels: torch.device("cpu"))
    return STAND_IN


SMALL_FAMILIES = {"128": (SMALL_CONTRACT,), "4": (SMALL_R4_CONTRACT,),
                  "all": (SMALL_CONTRACT, SMALL_R4_CONTRACT)}


def small_gate(monkeypatch) -> dict:
    """``csagate run`` on the small contracts (``--ratio 128|4|all``) with the reference stand-in
    of the gate's kernels on the CPU; the returned dict counts the preflights."""
    from csagate.gates import judging

    from csagate import options

    state = {"preflights": 0}

    def preflight(device, kernels):
        state["preflights"] += 1
        return torch.device("cpu")

    monkeypatch.setattr(options, "contracts", lambda ratio: SMALL_FAMILIES[ratio])
    use_stand_in(monkeypatch)
    monkeypatch.setattr(judging, "preflight", preflight)
    return state
