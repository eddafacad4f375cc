"""Seeded random packs over an implementation's whole envelope, and a greedy shrinker.

``csagate fuzz`` (``csagate.commands.fuzz``) drives this module; nothing here prints.

* :func:`envelope`: the (ratio, coff, head dim) triples to draw from, derived in one place:
  the implementation's :class:`~csagate.gates.implementation.Supports` intersected with what
  the kernels' host API accepts (``csagate.kernels.validate.check_support``, asked with meta
  tensors), over head dims ``DIM_RANGE`` where the implementation names none.
* :func:`draw`: trial ``index`` of ``seed`` as a :class:`~csagate.gates.cases.Case` of kind
  ``fuzz``: 1-7 segments mixing empty, shorter-than-ratio, exact-multiple and tail segments,
  capacity rows, token padding, input scale x1/x8/x64, fresh input seeds, peaked scores
  (``reference.inputs.peaked``) where the contract is bitwise; small packs mostly
  (``Sizes``), now and then a long one. Each trial's parameters come from a
  ``random.Random`` seeded with the string ``"csagate.fuzz/{seed}/{index}"`` (hashed with
  SHA-512 by Python), so trial ``i`` of seed ``S`` is the same pack on every machine for the
  same envelope and sizes, whatever ran before it.
* :class:`Judge`: one trial judged by :func:`csagate.gates.runner.run_case` with the ratio's
  contract, every contract check; results are memoized by the case's parameters.
* :func:`shrink`: a failing case made minimal by a deterministic greedy search: candidates in
  a fixed order (smaller head dims, coff 1; drop the deterministic mode, the scale, the
  peaked scores, the padding; the default seeds; drop whole segments; shorten segments to
  their smallest representatives; fewer padding rows and tokens), the first that
  still fails with one of the original failing gates is kept, until none does or the call
  budget is spent. Every accepted step makes one field strictly smaller, so it terminates.
* :func:`fuzz`: the loop: trials until ``trials`` or ``budget`` seconds, every failure shrunk
  and deduplicated by its shrunk case; a failing trial never stops the others.

Why not Hypothesis: its shrinker is excellent, but its example database and generation change
between versions (a seed does not name the same example across Hypothesis releases), its
budget is per example count, not seconds, and the packs here need one structured draw that
must stay within the kernels' envelope and cost budget. An own generator keyed on
``(seed, index)`` replays anywhere from two integers, and a greedy shrinker over a handful of
pack-shaped moves is bounded, deterministic and explains each step.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from time import perf_counter

from csagate.gates.cases import Case
from csagate.gates.contracts import CONTRACTS
from csagate.gates.driver import ProgressFn
from csagate.gates.verdict import ERROR, FAIL, INCONCLUSIVE, NOTHING_JUDGED, PASS, CaseResult
from csagate.reference.seeds import GRAD_SEED, INPUT_SEED, PAD_TOKEN_SEED

DIM_RANGE = (1, 1024)           # head dims drawn when the implementation names none
MAX_SEGMENTS = 7
SHRINK_CALLS = 200              # judge calls one shrink may spend
SHRINK_SECONDS = 120.0          # and wall seconds
SCALES = ((1.0, 14), (8.0, 3), (64.0, 3))               # (input scale, weight)
PEAKED_RATE = 0.15              # share of trials with peaked scores (where allowed)
SEGMENT_KINDS = (("empty", 1), ("short", 2), ("exact", 2), ("tail", 3))
PAD_ROWS_MAX, PAD_TOKENS_MAX = 8, 37
# A shrunk case takes the gate's default seeds where it still fails with them: failures that
# differ only in their draws then shrink to one case.
DEFAULT_SEEDS = {"input_seed": INPUT_SEED, "grad_seed": GRAD_SEED, "pad_seed": PAD_TOKEN_SEED}


@dataclass(frozen=True)
class Sizes:
    """How big packs get: ``work`` bounds tokens * coff * d of a typical trial, ``long_work``
    that of the one in ``1 / long_every`` that is long; ``max_tokens`` bounds the tokens."""

    work: int
    long_work: int
    max_tokens: int
    long_every: int = 20


CPU_SIZES = Sizes(work=1 << 15, long_work=1 << 18, max_tokens=4096)
CUDA_SIZES = Sizes(work=1 << 20, long_work=1 << 25, max_tokens=32768)


# --- the envelope ------------------------------------------------------------------------------


@functools.cache
@functools.cache
def kernel_refuses(ratio: int, coff: int, d: int) -> str | None:
    """Why the kernels' host API refuses (ratio, coff, d) (one line), or None: its own checks
    (``check_support``) on meta tensors of one block, asked once per config (the envelope, then
    every drawn and shrunk pack, asks again)."""
    import torch
    from csagate.kernels import validate

    def meta(*shape, dtype=torch.bfloat16):
        return torch.empty(*shape, dtype=dtype, device="meta")

    try:
        validate.check_support(meta(ratio, coff * d), meta(ratio, coff * d),
                               meta(ratio, coff * d, dtype=torch.float32),
                               meta(2, dtype=torch.int32), meta(2, dtype=torch.int32),
                               meta(1, d), ratio=ratio, coff=coff, devices=False)
    except ValueError as exc:
        return str(exc)
    return None


def pack_refuses(case: Case) -> str | None:
    """Why the host API refuses this pack (shapes and the cu/cuc values), or None."""
    import torch
    from csagate.kernels import validate
    from csagate.reference.inputs import offsets

    why = kernel_refuses(case.ratio, case.coff, case.d)
    if why:
        return why
    width = case.coff * case.d
    kv = torch.empty(case.tokens, width, dtype=torch.bfloat16, device="meta")
    ape = torch.empty(case.ratio, width, dtype=torch.float32, device="meta")
    out = torch.empty(case.rows, case.d, dtype=torch.bfloat16, device="meta")
    cu, cuc = offsets(case.lens, case.ratio)
    try:
        validate.check_support(kv, kv, ape, cu.to("meta"), cuc.to("meta"), out,
                               ratio=case.ratio, coff=case.coff, devices=False)
        validate.check_values(cu, cuc, ratio=case.ratio, n_tokens=case.tokens,
                              n_rows=case.rows)
    except ValueError as exc:
        return str(exc)
    return None


@dataclass(frozen=True)
class Envelope:
    """What to draw from: per (ratio, coff), the head dims both sides accept (ascending)."""

    dims: dict[tuple[int, int], tuple[int, ...]]
    deterministic: bool = False     # the implementation has a deterministic backward

    @property
    def ratios(self) -> tuple[int, ...]:
        return tuple(dict.fromkeys(r for r, _ in self.dims))

    def coffs(self, ratio: int) -> tuple[int, ...]:
        return tuple(c for r, c in self.dims if r == ratio)

    def covers(self, case: Case) -> bool:
        return case.d in self.dims.get((case.ratio, case.coff), ())

    def valid(self, case: Case) -> bool:
        """In the envelope, at least one output row (N == 0 launches nothing), and accepted
        by the host API."""
        return self.covers(case) and case.rows >= 1 and pack_refuses(case) is None

    def text(self) -> str:
        """``r4 c1 d 1..1024, r128 c1 d 128/512, ...``: per (ratio, coff), its head dims."""
        parts = []
        for (ratio, coff), dims in self.dims.items():
            if len(dims) <= 3:
                span = "/".join(map(str, dims))
            else:
                span = f"{dims[0]}..{dims[-1]}"
                if len(dims) != dims[-1] - dims[0] + 1:
                    span += f" ({len(dims)} dims)"
            parts.append(f"r{ratio} c{coff} d {span}")
        return ", ".join(parts)


def envelope(supports, *, ratios: tuple[int, ...] | None = None, deterministic: bool = False,
             dim_range: tuple[int, int] = DIM_RANGE) -> Envelope:
    """The implementation's ``supports`` intersected with the host API's envelope, over the
    contract families (``ratios``: only those). Head dims: the implementation's, or every d
    in ``dim_range`` the API accepts."""
    from csagate.kernels.registry import COFFS

    dims: dict[tuple[int, int], tuple[int, ...]] = {}
    for ratio in CONTRACTS:
        if ratios is not None and ratio not in ratios:
            continue
        if supports.ratios is not None and ratio not in supports.ratios:
            continue
        for coff in COFFS:
            if coff not in supports.coffs:
                continue
            candidates = supports.head_dims or range(dim_range[0], dim_range[1] + 1)
            ok = tuple(sorted(d for d in candidates if kernel_refuses(ratio, coff, d) is None))
            if ok:
                dims[(ratio, coff)] = ok
    return Envelope(dims, deterministic)


# --- the generator -----------------------------------------------------------------------------


def trial_rng(seed: int, index: int) -> random.Random:
    """The generator of trial ``index`` of ``seed``: the same stream on every machine."""
    return random.Random(f"csagate.fuzz/{seed}/{index}")


def _weighted(rng: random.Random, pairs):
    values, weights = zip(*pairs, strict=True)
    return rng.choices(values, weights=weights)[0]


def _pick_dim(rng: random.Random, dims: tuple[int, ...]) -> int:
    """Small dims most often, odd ones, the production 128/512/1024, then anything."""
    pools = ([d for d in dims if d <= 64], [d for d in dims if d % 2],
             [d for d in dims if d in (128, 512, 1024)], [d for d in dims if 64 < d <= 256],
             list(dims))
    pool = _weighted(rng, zip(pools, (35, 15, 15, 15, 20), strict=True))
    return rng.choice(pool or list(dims))


def _segment(rng: random.Random, ratio: int, room: int) -> int:
    """One segment of a drawn kind, within ``room`` tokens (a full block only if one fits)."""
    kind = _weighted(rng, SEGMENT_KINDS)
    blocks = rng.randint(1, max(1, room // ratio))
    if kind == "empty":
        return 0
    if kind == "short" or room < ratio:
        return rng.randint(1, ratio - 1)
    if kind == "exact":
        return blocks * ratio
    return blocks * ratio + rng.randint(1, ratio - 1)


def peaked_allowed(ratio: int) -> bool:
    """Peaked scores are drawn where dKV/dScore are bitwise: ratio 128's tolerances are
    calibrated on the unit distribution (CONTRACT.md section 4.4)."""
    return CONTRACTS[ratio].rule("dkv").check == "bitwise"


def _pack_text(case: Case) -> str:
    text = "+".join(map(str, case.lens))
    if case.pad_rows or case.pad_tokens:
        text += f"+pad{case.pad_rows}r{case.pad_tokens}t"
    if case.scale != 1.0:
        text += f"/x{case.scale:g}"
    if case.inputs != "random":
        text += f"/{case.inputs}"
    if case.deterministic:
        text += "/det"
    return text


def case_name(case: Case, prefix: str) -> str:
    """``PREFIX/r4/c1d33/37+0+9+pad2r5t/x8``: what a trial is, readable in a table."""
    return f"{prefix}/r{case.ratio}/c{case.coff}d{case.d}/{_pack_text(case)}"


def named(case: Case, prefix: str) -> Case:
    return replace(case, name=case_name(case, prefix))


def draw(env: Envelope, seed: int, index: int, sizes: Sizes = CPU_SIZES) -> Case:
    """Trial ``index`` of ``seed``: a pack in ``env``, sized by ``sizes``."""
    rng = trial_rng(seed, index)
    ratio = rng.choice(env.ratios)
    coff = rng.choice(env.coffs(ratio))
    d = _pick_dim(rng, env.dims[(ratio, coff)])
    work = sizes.long_work if rng.randrange(sizes.long_every) == 0 else sizes.work
    cap = min(sizes.max_tokens, max(2 * ratio, work // (coff * d)))
    n_seg = rng.randint(1, MAX_SEGMENTS)
    lens: list[int] = []
    for i in range(n_seg):   # each segment within an even share of what is left
        lens.append(_segment(rng, ratio, (cap - sum(lens)) // (n_seg - i)))
    if not any(n >= ratio for n in lens):   # at least one output row
        lens[rng.randrange(n_seg)] = ratio
    pad_rows = rng.randint(1, PAD_ROWS_MAX) if rng.random() < 0.25 else 0
    pad_tokens = rng.randint(1, PAD_TOKENS_MAX) if rng.random() < 0.25 else 0
    scale = _weighted(rng, SCALES)
    seeds = [rng.randrange(2**31) for _ in range(3)]
    deterministic = rng.random() < 0.15 and env.deterministic
    # drawn last, so the fields above are the same draws as without it
    peak = peaked_allowed(ratio) and rng.random() < PEAKED_RATE
    case = Case("", coff, d, tuple(lens), "fuzz", f"seeded random pack: seed {seed}, trial "
                f"{index}", ratio=ratio, input_seed=seeds[0], grad_seed=seeds[1],
                pad_seed=seeds[2], scale=scale, pad_rows=pad_rows, pad_tokens=pad_tokens,
                inputs="peaked" if peak else "random", deterministic=deterministic)
    case = named(case, f"fuzz/s{seed}/t{index}")
    if not env.valid(case):   # the draw stays inside the envelope by construction
        raise AssertionError(f"{case.name} is outside the envelope: {pack_refuses(case)}")
    return case


# --- judging -----------------------------------------------------------------------------------


def params(case: Case) -> Case:
    """A case's parameters without its name and reason: what makes two cases the same."""
    return replace(case, name="", why="")


def signature(result: CaseResult) -> frozenset[str]:
    """The gates a result fails (``error`` when the case raised)."""
    if result.status == ERROR:
        return frozenset({"error"})
    return frozenset(g.gate for g in result.failures)


def failing(result: CaseResult) -> tuple[str, ...]:
    """``G2 out``, ... : each failing gate and tensor (``error: ...`` when it raised)."""
    if result.status == ERROR:
        return (f"error: {result.error}",)
    return tuple(f"{g.gate} {g.tensor}" for g in result.failures)


class Judge:
    """Judge a case with every check of its ratio's contract (``runner.run_case``); prepare
    each (ratio, coff, d) before its first case; memoize by the case's parameters."""

    def __init__(self, driver, contracts=None):
        self.driver = driver
        self.contracts = CONTRACTS if contracts is None else contracts
        self.prepared: set[tuple[int, int, int]] = set()
        self.memo: dict[Case, CaseResult] = {}
        self.runs = 0

    def __call__(self, case: Case) -> CaseResult:
        from csagate.gates.runner import run_case

        key = params(case)
        if key in self.memo:
            return replace(self.memo[key], case=case)
        target = (case.ratio, case.coff, case.d)
        if target not in self.prepared:
            self.driver.build((target,))   # BuildError: nothing can be judged
            self.prepared.add(target)
        result = run_case(self.driver, case, self.contracts[case.ratio])
        self.runs += 1
        self.memo[key] = result
        return result


# --- shrinking ---------------------------------------------------------------------------------


def _shorter(n: int, ratio: int) -> list[int]:
    """Smaller lengths for an ``n``-token segment, smallest first: empty, one token, the
    ratio's edges (short, exact, tail), half, one block or one token less."""
    picks = {0, 1, ratio - 1, ratio, ratio + 1, 2 * ratio - 1, 2 * ratio, 2 * ratio + 1,
             n // 2, n - ratio, n - 1, n - n % ratio}
    return sorted(m for m in picks if 0 <= m < n)


def _smaller_dims(d: int, dims: tuple[int, ...]) -> list[int]:
    """Smaller accepted head dims, smallest first: the four smallest, about half, the
    largest below with the same parity, the largest below."""
    below = [x for x in dims if x < d]
    if not below:
        return []
    picks = set(below[:4])
    picks.add(min(below, key=lambda x: abs(x - d // 2)))
    same = [x for x in below if x % 2 == d % 2]
    if same:
        picks.add(same[-1])
    picks.add(below[-1])
    return sorted(picks)


def candidates(case: Case, env: Envelope) -> Iterator[Case]:
    """Simpler variants of ``case``, in the order the shrinker tries them (the cheap, narrow
    ones first: a small head dim makes every later judge call cheap); each makes one field
    strictly smaller or puts a seed back to the gate's default. Variants outside the envelope
    are left out."""
    lens = case.lens
    moves: list[dict] = [{"d": d} for d in _smaller_dims(case.d, env.dims.get((case.ratio,
                                                                              case.coff), ()))]
    if case.coff == 2:
        moves.append({"coff": 1})
    if case.deterministic:
        moves.append({"deterministic": False})
    if case.scale != 1.0:
        moves.append({"scale": 1.0})
    if case.inputs == "peaked":
        moves.append({"inputs": "random"})
    moves += [{"pad_rows": 0}] * bool(case.pad_rows) + [{"pad_tokens": 0}] * bool(case.pad_tokens)
    moves += [{name: value} for name, value in DEFAULT_SEEDS.items()
              if getattr(case, name) != value]
    if len(lens) > 1:
        moves += [{"lens": lens[:i] + lens[i + 1:]} for i in range(len(lens))]
    moves += [{"lens": lens[:i] + (m,) + lens[i + 1:]} for i, n in enumerate(lens)
              for m in _shorter(n, case.ratio)]
    moves += [{"pad_rows": n} for n in sorted({1, case.pad_rows // 2}) if 0 < n < case.pad_rows]
    moves += [{"pad_tokens": n} for n in sorted({1, case.pad_tokens // 2})
              if 0 < n < case.pad_tokens]
    for move in moves:
        cand = replace(case, **move)
        if env.valid(cand):
            yield cand


@dataclass(frozen=True)
class Shrunk:
    """A shrink's outcome: the smallest failing case found, its result, the steps accepted,
    the judge calls spent, whether Ctrl-C cut it short."""

    case: Case
    result: CaseResult
    steps: int
    calls: int
    interrupted: bool = False


def fails(result: CaseResult) -> bool:
    """A contract failure: a failed gate or a raise (not a case that judged nothing)."""
    return result.status in (FAIL, ERROR)


def shrink(case: Case, result: CaseResult, judge: Callable[[Case], CaseResult],
           env: Envelope, *, max_calls: int = SHRINK_CALLS, seconds: float = SHRINK_SECONDS,
           clock: Callable[[], float] = perf_counter) -> Shrunk:
    """Greedy, deterministic: take the first candidate (:func:`candidates`) that still fails
    with one of ``result``'s failing gates, start over from it; stop when none does, after
    ``max_calls`` judge calls or ``seconds``."""
    target = signature(result)
    deadline = clock() + seconds
    current, current_result = case, result
    tried: set[Case] = {params(case)}
    steps = calls = 0
    improved = True
    try:
        while improved:
            improved = False
            for cand in candidates(current, env):
                key = params(cand)
                if key in tried:
                    continue
                if calls >= max_calls or clock() > deadline:
                    return Shrunk(current, current_result, steps, calls)
                tried.add(key)
                got = judge(cand)
                calls += 1
                if fails(got) and signature(got) & target:
                    current, current_result = cand, got
                    steps += 1
                    improved = True
                    break
    except KeyboardInterrupt:   # Ctrl-C: the smallest failing case so far is the outcome
        return Shrunk(current, current_result, steps, calls, interrupted=True)
    return Shrunk(current, current_result, steps, calls)


# --- the loop ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Trial:
    index: int
    case: Case
    status: str
    failing: tuple[str, ...]
    seconds: float


@dataclass
class Failure:
    """One distinct shrunk failure, and every trial that shrank to it."""

    trial: Trial
    original: CaseResult
    shrunk: Shrunk
    trials: list[int] = field(default_factory=list)


@dataclass
class FuzzRun:
    seed: int
    trials: list[Trial] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    seconds: float = 0.0
    stopped: str = "trials"          # "trials" | "budget" | "interrupted"
    selftest: object = None          # the self-tests run first (selftest.SelfTests)

    @property
    def passed(self) -> int:
        return sum(1 for t in self.trials if t.status == PASS)

    @property
    def failed(self) -> int:
        """Trials that failed a gate or raised."""
        return sum(1 for t in self.trials if t.status in (FAIL, ERROR))

    @property
    def inconclusive(self) -> int:
        """Trials that judged no element (never a pass)."""
        return sum(1 for t in self.trials if t.status == INCONCLUSIVE)

    @property
    def state(self) -> str:
        """``fail`` (some trial failed), ``nothing judged`` (no trial ran or judged anything),
        ``inconclusive`` (some trial judged nothing) or ``pass``."""
        if self.failed:
            return FAIL
        if not self.passed:
            return NOTHING_JUDGED
        return INCONCLUSIVE if self.inconclusive else PASS

    @property
    def ok(self) -> bool:
        return self.state == PASS


def fuzz(judge: Judge, env: Envelope, *, seed: int, trials: int | None = None,
         budget: float | None = None, sizes: Sizes = CPU_SIZES,
         shrink_calls: int = SHRINK_CALLS, progress: ProgressFn | None = None,
         clock: Callable[[], float] = perf_counter) -> FuzzRun:
    """Trial 0, 1, ... of ``seed`` until ``trials`` ran or ``budget`` seconds passed (a shrink
    that started finishes, within its own bounds). Every failure is shrunk; failures that
    shrink to the same case are one :class:`Failure`."""
    from csagate.gates import selftest

    if (trials is None) == (budget is None):
        raise ValueError("give exactly one of trials and budget")
    start = clock()
    driver = getattr(judge, "driver", None)
    run = FuzzRun(seed, selftest=selftest.ensure(getattr(driver, "device", "cpu")))
    by_case: dict[Case, Failure] = {}
    index = 0
    try:
        while True:
            elapsed = clock() - start
            if trials is not None and index >= trials:
                break
            if budget is not None and elapsed >= budget:
                run.stopped = "budget"
                break
            case = draw(env, seed, index, sizes)
            if progress is not None:
                done, total = (index, trials) if trials is not None else \
                    (int(elapsed), int(budget))
                progress(done, total, f"trial {index} ({run.failed} failing): {case.name}")
            t0 = clock()
            result = judge(case)
            trial = Trial(index, case, result.status, failing(result), clock() - t0)
            run.trials.append(trial)
            if fails(result):
                found = shrink(case, result, judge, env, max_calls=shrink_calls, clock=clock)
                key = params(found.case)
                if key not in by_case:
                    minimal = named(found.case, f"fuzz/s{seed}/t{index}/min")
                    found = replace(found, case=minimal,
                                    result=replace(found.result, case=minimal))
                    by_case[key] = Failure(trial, result, found)
                    run.failures.append(by_case[key])
                by_case[key].trials.append(index)
                if found.interrupted:
                    run.stopped = "interrupted"
                    break
            index += 1
    except KeyboardInterrupt:   # Ctrl-C between shrinks: keep what was found
        run.stopped = "interrupted"
    run.seconds = clock() - start
    return run


def coverage(run: FuzzRun) -> dict:
    """What the trials reached: ratios, configs, head dims, segment counts, largest pack."""
    cases = [t.case for t in run.trials]
    dims = sorted({c.d for c in cases})
    return {
        "ratios": sorted({c.ratio for c in cases}),
        "configs": sorted({f"r{c.ratio}/c{c.coff}d{c.d}" for c in cases}),
        "head_dims": dims,
        "odd_head_dims": [d for d in dims if d % 2],
        "segments": sorted({len(c.lens) for c in cases}),
        "max_tokens": max((c.tokens for c in cases), default=0),
        "with_padding": sum(1 for c in cases if c.pad_rows or c.pad_tokens),
        "scaled": sum(1 for c in cases if c.scale != 1.0),
        "peaked": sum(1 for c in cases if c.inputs == "peaked"),
        "deterministic": sum(1 for c in cases if c.deterministic),
    }
