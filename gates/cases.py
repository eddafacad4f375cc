"""The drift-check case and the 21 named cases of the ratio=128 gate, in the contract's order.

Data, not code (docs/CONTRACT.md section 5.2). The odd packs are the point: ``ragged3`` has tails in
every segment, ``edgepack`` has a short first segment, an empty segment, a 3-token segment,
exact multiples and one-token tails; the padding cases add capacity rows and token rows.
"""

from __future__ import annotations

from dataclasses import dataclass

from csagate.reference.inputs import GRAD_SEED, INPUT_SEED, PAD_GRAD_SEED, PAD_TOKEN_SEED

RAGGED3 = (1023, 2048, 509)
EDGEPACK = (127, 8192, 0, 129, 128, 3, 515, 1024)

KINDS = ("drift", "union", "scaled", "padding", "overflow")


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

    @property
    def config(self) -> str:
        return f"c{self.coff}d{self.d}"

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
    if len(set(lens)) == 1:
        return f"{len(lens)}x{lens[0]}"
    return "+".join(map(str, lens))


def _union(coff: int, d: int, lens: tuple[int, ...], why: str) -> Case:
    return Case(f"c{coff}d{d}/{_pack_name(lens)}", coff, d, lens, "union", why)


def _padding(coff: int, d: int, rows: int, toks: int) -> Case:
    return Case(f"c{coff}d{d}/ragged3+pad{rows}r{toks}t", coff, d, RAGGED3, "padding",
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
         "fp32 score+ape overflows: NaN patterns must match eager, the fp64 oracle stays finite"),
)


def case_by_name(name: str) -> Case:
    for case in (DRIFT, *CASES):
        if case.name == name:
            return case
    raise KeyError(name)
