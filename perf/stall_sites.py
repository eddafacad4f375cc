"""Where a kernel's warps wait, per SASS instruction, from Nsight Compute's source page.

Record one launch with the SourceCounters section and export its source page as CSV::

    ncu --clock-control none --profile-from-start off -k 'regex:r128bwd' \\
        --section SourceCounters --section WarpStateStats -o out/src \\
        python -m csagate.perf.profile launch --direction bwd --shape c2d512:131072
    ncu --import out/src.ncu-rep --page source --csv --print-source sass > out/sass.csv
    python -m csagate.perf.stall_sites out/sass.csv --top 15

It prints each stall reason's share of the warp-state samples, then the instructions holding
the most samples, with their index in the SASS listing, their share and their top reasons
(docs/PERF_NOTES.md section 7.1 reads one this way: a PRMT right after the backward's fetch).
Pure Python (no torch, no cutlass).
"""

from __future__ import annotations

import argparse
import csv
import sys
from dataclasses import dataclass, field
from pathlib import Path

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"
SOURCE = "Source"
STALL_PREFIX = "stall_"  # per-reason sample columns; the "(Not Issued)" copies are skipped


@dataclass(frozen=True)
class Site:
    index: int                 # position in the SASS listing
    sass: str
    samples: int
    executed: int
    reasons: dict[str, int] = field(default_factory=dict)

    def top_reasons(self, n: int = 3) -> list[tuple[str, int]]:
        ranked = sorted(self.reasons.items(), key=lambda kv: (-kv[1], kv[0]))
        return [(name, count) for name, count in ranked[:n] if count]


@dataclass(frozen=True)
class Profile:
    kernel: str
    sites: list[Site]

    @property
    def total(self) -> int:
        return sum(s.samples for s in self.sites)

    def reason_totals(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in self.sites:
            for name, count in s.reasons.items():
                out[name] = out.get(name, 0) + count
        return out

    def top(self, n: int) -> list[Site]:
        return sorted(self.sites, key=lambda s: (-s.samples, s.index))[:n]


def _int(text: str) -> int:
    text = text.strip().replace(",", "")
    try:
        return int(float(text))
    except ValueError:
        return 0  # "-" and blanks: no samples


def parse(text: str) -> list[Profile]:
    """Every kernel of an export: each a ``"Kernel Name",<name>`` line, then its table."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith('"Kernel Name"')]
    if not starts:
        raise ValueError('no "Kernel Name" line: not an ncu --page source --csv export')
    return [_parse_one(lines[a:b]) for a, b in zip(starts, starts[1:] + [len(lines)])]


def _parse_one(lines: list[str]) -> Profile:
    kernel = next(csv.reader([lines[0]]))[1]
    rows = list(csv.reader(lines[1:]))
    if not rows:
        raise ValueError(f"{kernel}: the source page has no table")
    header, body = rows[0], rows[1:]
    col = {name: i for i, name in enumerate(header)}
    missing = [name for name in (SOURCE, SAMPLES) if name not in col]
    if missing:
        raise ValueError(f"the source page lacks column(s) {missing}: record with "
                         "--section SourceCounters and export with --print-source sass")
    stall_cols = {name[len(STALL_PREFIX):]: i for name, i in col.items()
                  if name.startswith(STALL_PREFIX) and "(" not in name}
    sites = []
    for row in body:
        if len(row) < len(header):
            continue
        sites.append(Site(len(sites), row[col[SOURCE]].strip(), _int(row[col[SAMPLES]]),
                          _int(row[col[EXECUTED]]) if EXECUTED in col else 0,
                          {name: _int(row[i]) for name, i in stall_cols.items()}))
    return Profile(kernel, sites)


def report(profile: Profile, top: int = 15) -> list[str]:
    total = profile.total
    if total == 0:
        return [f"{profile.kernel}: no warp-state samples"]
    lines = [f"{profile.kernel}: {total} samples"]
    shares = sorted(profile.reason_totals().items(), key=lambda kv: (-kv[1], kv[0]))
    lines.append("  " + ", ".join(f"{name} {100 * count / total:.1f}%"
                                   for name, count in shares if count))
    for s in profile.top(top):
        why = " ".join(f"{name}={count}" for name, count in s.top_reasons())
        lines.append(f"  {s.index:5d} {100 * s.samples / total:5.1f}% {s.samples:7d}  "
                     f"{s.sass[:60]:60s} executed {s.executed:9d}  {why}")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m csagate.perf.stall_sites", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", type=Path, help="ncu --page source --csv --print-source sass output")
    ap.add_argument("--top", type=int, default=15, help="instructions to list (default 15)")
    ap.add_argument("--kernel", default=None, help="only kernels whose name contains this")
    ns = ap.parse_args(argv)
    try:
        profiles = parse(ns.csv.read_text())
    except (OSError, ValueError) as exc:
        print(f"stall_sites: {exc}", file=sys.stderr)
        return 2
    chosen = [p for p in profiles if ns.kernel is None or ns.kernel in p.kernel]
    if not chosen:
        print(f"stall_sites: no kernel name contains {ns.kernel!r}", file=sys.stderr)
        return 2
    print("\n\n".join("\n".join(report(p, ns.top)) for p in chosen))
    return 0


if __name__ == "__main__":
    sys.exit(main())
