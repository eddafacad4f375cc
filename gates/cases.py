"""The named cases of both gates, in the contract's order: data, not code.

* ``DRIFT``: the reference drift check (docs/CONTRACT.md section 5, step 0).
* ``CASES``: the 21 upstream cases of the ratio=128 gate (section 5).
* ``HARDENING``: the three hardening cases run after them (section 5.3).
* ``R4_CASES``: the production ratio=4 kernels' own cases (section 7).
* ``DETERMINISTIC``, ``R4_DETERMINISTIC``: the deterministic backward (section 2.5): cases
  run with ``deterministic=True``, in which G1 covers dAPE bitwise too.
* ``SMALL_CASES[r]``, ``SMALL_DETERMINISTIC[r]`` for the other small ratios r in
  ``SMALL_RATIOS`` (the registry's but 4): the same kinds at that ratio (``small_cases``), plus a
  CSA2-style coff=1 zero-APE case (Megatron-LM's ratio-2 variant trains without APE).

Beyond the four table configs (c1d128 ... c2d512) the small ratios have cases at head dims
that are not a multiple of 32 (65 and 40 at ratio 4, 72 at every other small ratio, 40 at
ratio 32's 64-position window): where a CTA's last column group is partial, a forward or
backward that skipped it (or read past it) passes every case of the table configs. Coverage
counts their kernels apart (``beyond``), neither expected nor a failure.

The odd packs are the point: ``ragged3`` has tails in every segment, ``edgepack`` has a short
first segment, an empty segment, a 3-token segment, exact multiples and one-token tails; the
padding cases add capacity rows and token rows. ``Case.inputs`` names how a case's inputs are
made (``csagate.reference.inputs``): random draws, the all-overflow pack, the partial-overflow
placements, non-finite values only the capacity padding rows read, or peaked scores (x16:
windows whose e_k reach below 2^-64, subnormals and 0, where the kernels divide one by one).
"""

from __future__ import annotations

from dataclasses import dataclass

from csagate.kernels import registry
from csagate.kernels.schedule import config_name
from csagate.kernels.small_schedule import FWD_VEC2_MAX_WINDOW, MAX_WINDOW, config_problems
from csagate.reference.seeds import GRAD_SEED, INPUT_SEED, PAD_GRAD_SEED, PAD_TOKEN_SEED

RAGGED3 = (1023, 2048, 509)
EDGEPACK = (127, 8192, 0, 129, 128, 3, 515, 1024)
SHORT4 = (3, 515, 1024, 129)   # ratio=4: a first segment shorter than ratio
SHORT2 = (1, 515, 1024, 129, 1, 0, 3)  # ratio=2: one-token segments, the first of them too
# the small ratios with cases of their own (4: R4_CASES), as kernels/registry.py lists them
SMALL_RATIOS = tuple(r for r in registry.SMALL_RATIOS if r != 4)

# fuzz: a seeded random pack (gates/fuzz.py)
KINDS = ("drift", "union", "scaled", "padding", "overflow", "partial-overflow", "hardening",
         "deterministic", "zero-ape", "peaked", "fuzz")
INPUTS = ("random", "overflow", "partial_overflow", "pad_nonfinite", "zero_ape", "peaked")


@dataclass(frozen=True)
class Case:
    name: str
    coff: int
    d: int
    lens: tuple[int, ...]
    kind: str
    why: str
    ratio: int = 128
    input_seed: int = INPUT_SEED
    grad_seed: int = GRAD_SEED
    pad_seed: int = PAD_TOKEN_SEED
    scale: float = 1.0
    pad_rows: int = 0
    pad_tokens: int = 0
    inputs: str = "random"
    deterministic: bool = False  # the backward runs with deterministic=True (section 2.5)

    @property
    def config(self) -> str:
        return config_name(self.coff, self.d)

    @property
    def tokens(self) -> int:
        return sum(self.lens) + self.pad_tokens

    @property
    def rows(self) -> int:
        return sum(n // self.ratio for n in self.lens) + self.pad_rows


def _pack_name(lens: tuple[int, ...]) -> str:
    if lens == RAGGED3:
        return "ragged3"
    if lens == EDGEPACK:
        return "edgepack"
    if lens == SHORT4:
        return "short4"
    if lens == SHORT2:
        return "short2"
    if len(set(lens)) == 1:
        return f"{len(lens)}x{lens[0]}"
    return "+".join(map(str, lens))


def _union(coff: int, d: int, lens: tuple[int, ...], why: str) -> Case:
    return Case(f"{config_name(coff, d)}/{_pack_name(lens)}", coff, d, lens, "union", why)


def _padding(coff: int, d: int, rows: int, toks: int) -> Case:
    return Case(f"{config_name(coff, d)}/ragged3+pad{rows}r{toks}t", coff, d, RAGGED3,
                "padding",
                "capacity rows get nonzero grad_out on the fused side; token rows stay zero",
                grad_seed=PAD_GRAD_SEED, pad_rows=rows, pad_tokens=toks)


DRIFT = Case("drift/r4-c2d128/1x2048", 2, 128, (2048,), "drift",
             "production ratio=4 backward vs the reference: bitwise dKV/dScore", ratio=4)

CASES: tuple[Case, ...] = (
    _union(1, 128, (8192,), "one segment, small forward/backward buckets"),
    _union(1, 128, (8192,) * 3, "N=192: forward default bucket, backward small bucket edge"),
    _union(1, 128, RAGGED3, "tails in every segment"),
    _union(1, 128, EDGEPACK, "short, empty, 3-token and exact-multiple segments"),
    _union(1, 128, (65536,), "long context, default buckets"),
    _union(1, 128, (131072,), "N=1024: forward large bucket (two-phase)"),
    _union(2, 128, (8192,), "overlap windows, small buckets"),
    _union(2, 128, EDGEPACK, "first-block rule across short and empty segments"),
    _union(2, 128, (65536,), "overlap windows, default buckets"),
    _union(1, 512, (8192,), "wide head, forward default bucket"),
    _union(1, 512, (65536,), "wide head, long context"),
    _union(1, 512, (131072,), "wide head, forward large bucket"),
    _union(2, 512, (8192,), "widest window, small forward bucket"),
    _union(2, 512, (65536,), "widest window, mid forward bucket"),
    _union(2, 512, (131072,), "widest window, forward large bucket"),
    Case("c2d128/1x8192/x64", 2, 128, (8192,), "scaled",
         "kv and grad_out x64: counts and parity unchanged, bounds scale", scale=64.0),
    _padding(1, 512, 8, 37),
    _padding(2, 512, 8, 21),
    _padding(1, 128, 5, 37),
    _padding(2, 128, 5, 21),
    Case("c1d128/overflow", 1, 128, (128,), "overflow",
         "fp32 score+ape overflows: NaN patterns must match eager, the fp64 oracle stays finite",
         inputs="overflow"),
)

_PEAKED = ("scores x16: windows with some e_k below 2^-64, subnormal or 0 (each divided one by "
           "one) beside windows whose divisions share one reciprocal; dKV/dScore still bitwise")
_PARTIAL = ("+inf scores in late chunks of three windows (both halves of one at coff=2) and "
            "one NaN kv: NaN masks equal eager, finite positions pass G2/G3")

HARDENING: tuple[Case, ...] = (
    Case("c2d128/ragged3/partial-overflow", 2, 128, RAGGED3, "hardening", _PARTIAL,
         inputs="partial_overflow"),
    Case("c1d512/ragged3/partial-overflow", 1, 512, RAGGED3, "hardening",
         _PARTIAL.replace(" (both halves of one at coff=2)", "") + " (wide-head chunking)",
         inputs="partial_overflow"),
    Case("c2d128/edgepack+pad5r21t/pad-nonfinite", 2, 128, EDGEPACK, "hardening",
         "inf/NaN only capacity padding rows read: gradients finite and equal to the clean "
         "pack's", grad_seed=PAD_GRAD_SEED, pad_rows=5, pad_tokens=21, inputs="pad_nonfinite"),
)


def _small(ratio: int, coff: int, d: int, lens: tuple[int, ...], why: str,
           kind: str = "union", suffix: str = "", **kw) -> Case:
    return Case(f"r{ratio}/c{coff}d{d}/{_pack_name(lens)}{suffix}", coff, d, lens, kind, why,
                ratio=ratio, **kw)


def _small_padding(ratio: int, coff: int, d: int, lens: tuple[int, ...], rows: int,
                   toks: int, why: str) -> Case:
    return _small(ratio, coff, d, lens, why, "padding", f"+pad{rows}r{toks}t",
                  grad_seed=PAD_GRAD_SEED, pad_rows=rows, pad_tokens=toks)


def _r4(coff: int, d: int, lens: tuple[int, ...], why: str, kind: str = "union",
        suffix: str = "", **kw) -> Case:
    return _small(4, coff, d, lens, why, kind, suffix, **kw)


def _r4_padding(coff: int, d: int, lens: tuple[int, ...], rows: int, toks: int,
                why: str) -> Case:
    return _small_padding(4, coff, d, lens, rows, toks, why)


R4_CASES: tuple[Case, ...] = (
    _r4(1, 128, (8192,), "one segment"),
    _r4(1, 128, RAGGED3, "tails in every segment"),
    _r4(1, 128, EDGEPACK, "short, empty, 3-token and exact-multiple segments"),
    _r4(2, 128, (8192,), "overlap windows"),
    _r4(2, 128, RAGGED3, "overlap windows, tails in every segment"),
    _r4(2, 128, EDGEPACK, "first-block rule across short and empty segments"),
    _r4(2, 128, (65536,), "long context, overlap windows"),
    _r4(1, 512, (8192,), "wide head"),
    _r4(1, 512, RAGGED3, "wide head, tails"),
    _r4(1, 512, EDGEPACK, "wide head, short and empty segments"),
    _r4(2, 512, (8192,), "widest window"),
    _r4(2, 512, RAGGED3, "widest window, tails"),
    _r4(2, 512, EDGEPACK, "widest window, first-block rule"),
    _r4(2, 512, (65536,), "long context, widest window"),
    _r4(1, 65, RAGGED3, "odd head dim: the forward's one-column form, 65 column groups, so a "
        "last CTA holds the one group past 64 threads; tails in every segment"),
    _r4(2, 40, EDGEPACK, "head dim 40, not a multiple of 32: narrow CTAs, every column "
        "guarded (40 of a backward CTA's 128 threads); short and empty segments"),
    _r4_padding(2, 128, RAGGED3, 8, 21,
                "capacity rows get nonzero grad_out on the fused side; token rows stay zero"),
    _r4_padding(1, 512, SHORT4, 8, 37,
                "a first segment shorter than ratio: padding rows read across its boundary"),
    Case("r4/c1d128/overflow", 1, 128, (128,), "overflow",
         "fp32 score+ape overflows: NaN patterns must match eager, the fp64 oracle stays finite",
         ratio=4, inputs="overflow"),
    _r4(2, 128, RAGGED3, _PARTIAL, "partial-overflow", "/partial-overflow",
        inputs="partial_overflow"),
    _r4(2, 128, RAGGED3, _PEAKED, "peaked", "/peaked", inputs="peaked"),
)


_DET = ("deterministic backward: dAPE from per-CTA partials summed in a fixed order, bitwise "
        "over the runs (G1); out, dKV, dScore and the tolerances as in the default mode")


def _det(base: Case, why: str) -> Case:
    return Case(f"{base.name}/deterministic", base.coff, base.d, base.lens, "deterministic",
                f"{_DET}; {why}", ratio=base.ratio, pad_rows=base.pad_rows,
                pad_tokens=base.pad_tokens, grad_seed=base.grad_seed, deterministic=True)


# ratio=128: one per config on a ragged or edge pack (staged and regwin kernels both run).
DETERMINISTIC: tuple[Case, ...] = (
    _det(_union(1, 128, EDGEPACK, ""), "short, empty and exact-multiple segments"),
    _det(_union(2, 128, RAGGED3, ""), "overlap windows, tails in every segment"),
    _det(_union(1, 512, EDGEPACK, ""), "wide head, short and empty segments"),
    _det(_padding(2, 512, 8, 21), "widest window, capacity padding rows and tokens"),
)

# ratio=4: two (both coffs, one with padding).
R4_DETERMINISTIC: tuple[Case, ...] = (
    _det(_r4(1, 128, EDGEPACK, ""), "short, empty and exact-multiple segments"),
    _det(_r4_padding(2, 512, RAGGED3, 8, 21, ""), "widest window, capacity padding rows"),
)


_D72_WHY = ("head dim 72, not a multiple of 32, at the 64-position window: the forward's "
            "one-column form, 72 column groups, so a last CTA holds the 8 past 64 threads; tails")
_OVERFLOW = "fp32 score+ape overflows: NaN patterns must match eager, the fp64 oracle stays finite"


def small_cases(ratio: int) -> tuple[Case, ...]:
    """The named cases of one small ratio (not 4): every config on one segment, ragged packs
    with tails in every segment, edge packs (short, empty, 3-token and exact-multiple
    segments; ``SHORT2`` at ratio 2, where only a 1-token segment is short), capacity padding
    with a first segment shorter than ratio, overflow, partial overflow, scaled inputs, a
    CSA2-style coff=1 zero-APE case (at ratio 2 also on a long segment) and peaked scores."""
    edge = SHORT2 if ratio == 2 else EDGEPACK
    short = SHORT2 if ratio == 2 else SHORT4
    cases = [
        _small(ratio, 1, 128, (8192,), "one segment"),
        _small(ratio, 1, 128, RAGGED3, "tails in every segment"),
        _small(ratio, 1, 128, edge, "short, empty and exact-multiple segments"),
        _small(ratio, 2, 128, (8192,), "overlap windows"),
        _small(ratio, 2, 128, RAGGED3, "overlap windows, tails in every segment"),
        _small(ratio, 2, 128, edge, "first-block rule across short and empty segments"),
        _small(ratio, 1, 512, (8192,), "wide head"),
        _small(ratio, 1, 512, edge, "wide head, short and empty segments"),
        _small(ratio, 2, 512, (8192,), "widest window"),
        _small(ratio, 2, 512, RAGGED3, "widest window, tails"),
        _small(ratio, 2, 72, RAGGED3, _D72_WHY if 2 * ratio > FWD_VEC2_MAX_WINDOW else
               "head dim 72, not a multiple of 32: narrow CTAs, every column guarded; tails"),
        _small_padding(ratio, 2, 128, RAGGED3, 8, 21, "capacity rows get nonzero grad_out on "
                       "the fused side; token rows stay zero"),
        _small_padding(ratio, 1, 512, short, 8, 37, "a first segment shorter than ratio: "
                       "padding rows read across its boundary"),
        Case(f"r{ratio}/c1d128/overflow", 1, 128, (128,), "overflow", _OVERFLOW, ratio=ratio,
             inputs="overflow"),
        _small(ratio, 2, 128, RAGGED3, _PARTIAL, "partial-overflow", "/partial-overflow",
               inputs="partial_overflow"),
        Case(f"r{ratio}/c2d128/1x8192/x64", 2, 128, (8192,), "scaled",
             "kv and grad_out x64: dKV/dScore still bitwise, counts unchanged, bounds scale",
             ratio=ratio, scale=64.0),
        _small(ratio, 1, 128, RAGGED3, "CSA2-style: coff=1, zero APE (s = f32(score))",
               "zero-ape", "/zero-ape", inputs="zero_ape"),
        _small(ratio, 2, 128, RAGGED3, _PEAKED, "peaked", "/peaked", inputs="peaked"),
    ]
    if 2 * ratio == MAX_WINDOW:
        cases.append(_small(ratio, 2, 40, edge, "a small head dim at the largest window (64 "
                            "positions, the APE re-read per row): 40 of a backward CTA's 128 "
                            "threads; short and empty segments"))
    if ratio == 2:
        cases.append(_small(ratio, 1, 128, (32768,), "CSA2-style (Megatron-LM's ratio-2 "
                            "variant): coff=1, zero APE, a long segment", "zero-ape",
                            "/zero-ape", inputs="zero_ape"))
    return _served(cases)


def _served(cases) -> tuple[Case, ...]:
    """The cases whose config the small-ratio family serves at their ratio (a window wider
    than a thread's registers, ratio * coff > MAX_WINDOW, has no kernel)."""
    return tuple(c for c in cases if not config_problems(c.ratio, c.coff, c.d))


def small_deterministic(ratio: int) -> tuple[Case, ...]:
    """The deterministic-mode cases of one small ratio: both coffs, one with padding."""
    edge = SHORT2 if ratio == 2 else EDGEPACK
    return _served((_det(_small(ratio, 1, 128, edge, ""),
                         "short, empty and exact-multiple segments"),
                    _det(_small_padding(ratio, 2, 512, RAGGED3, 8, 21, ""),
                         "widest window, capacity padding rows")))


SMALL_CASES: dict[int, tuple[Case, ...]] = {r: small_cases(r) for r in SMALL_RATIOS}
SMALL_DETERMINISTIC: dict[int, tuple[Case, ...]] = {r: small_deterministic(r)
                                                    for r in SMALL_RATIOS}


def case_by_name(name: str) -> Case:
    small = [c for r in SMALL_RATIOS for c in SMALL_CASES[r] + SMALL_DETERMINISTIC[r]]
    for case in (DRIFT, *CASES, *HARDENING, *R4_CASES, *DETERMINISTIC, *R4_DETERMINISTIC,
                 *small):
        if case.name == name:
            return case
    raise KeyError(name)
