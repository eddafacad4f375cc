"""The coverage check (docs/CONTRACT.md section 5.4): every kernel of every dispatch-table
entry is selected by some case (``table_coverage``), and the dispatcher's buckets start and end
at the declared rows (``bucket_edges``, probed at edge-1, edge, edge+1).

Pure Python (no torch). A config is a ``(coff, d)`` pair (named as ``schedule.config_name``
names it) or a string.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from csagate.gates.limits import BucketEdge
from csagate.kernels.schedule import config_name

__all__ = ["BucketEdges", "EdgeProbe", "TableCoverage", "bucket_edges", "declared_bucket",
           "edge_probes", "entry_configs", "table_coverage"]

# --- coverage over the dispatch tables' entries (docs/CONTRACT.md section 5.4) --------------------


def _name(kernel: Any) -> str:
    return str(getattr(kernel, "name", kernel))


def _config_label(config: Any) -> str:
    return config_name(*config) if isinstance(config, tuple) else str(config)


@dataclass(frozen=True)
class TableCoverage:
    """The distinct kernels of every (bucket, config) table entry against those cases selected."""

    direction: str
    n_entries: int                  # (bucket, config) entries in the tables
    n_expected: int                 # distinct kernels among them
    n_covered: int                  # of those, selected by some case
    missing: tuple[str, ...]        # table kernels no case selects
    unexpected: tuple[str, ...]     # selected kernels that are in no table entry
    ok: bool

    def summary(self) -> str:
        text = (f"{self.direction} {self.n_covered}/{self.n_expected} kernels of "
                f"{self.n_entries} table entries")
        if self.missing:
            text += "; no case selects " + ", ".join(self.missing)
        if self.unexpected:
            text += "; selected but in no table entry: " + ", ".join(self.unexpected)
        return text


def table_coverage(direction: str, entries: Mapping[Any, Any],
                   selected: Iterable[Any]) -> TableCoverage:
    """Every distinct kernel of ``entries`` (table entry -> kernel) is in ``selected``."""
    expected = list(dict.fromkeys(entries.values()))
    got = list(dict.fromkeys(selected))
    missing = tuple(_name(k) for k in expected if k not in set(got))
    unexpected = tuple(_name(k) for k in got if k not in set(expected))
    return TableCoverage(direction=direction, n_entries=len(entries), n_expected=len(expected),
                         n_covered=len(expected) - len(missing), missing=missing,
                         unexpected=unexpected, ok=not missing and not unexpected)


# --- pinned bucket edges (docs/CONTRACT.md section 5.4) -------------------------------------------


def declared_bucket(edges: Sequence[BucketEdge], entries: Mapping[tuple[str, str, Any], Any],
                    direction: str, config: Any, n_rows: int) -> str:
    """The bucket the declaration gives N: the first edge of ``direction`` that holds N and
    whose bucket has an entry for ``config`` in ``entries``; else ``default``."""
    for edge in edges:
        if (edge.direction == direction and edge.holds(n_rows)
                and (direction, edge.bucket, config) in entries):
            return edge.bucket
    return "default"


def edge_probes(edges: Sequence[BucketEdge], configs: Mapping[str, Iterable[Any]]
                ) -> tuple[tuple[str, Any, int, str], ...]:
    """(direction, config, N, edge label) at edge-1, edge, edge+1 for every config."""
    probes = []
    for edge in edges:
        for config in configs.get(edge.direction, ()):
            for n in (edge.edge - 1, edge.edge, edge.edge + 1):
                probes.append((edge.direction, config, n, edge.label))
    return tuple(probes)


@dataclass(frozen=True)
class EdgeProbe:
    direction: str
    config: str
    n_rows: int
    edge: str                  # the declared edge probed, e.g. "fwd large >= 1024"
    bucket: str                # the declared bucket of N
    expected: str | None       # that bucket's table entry (None: the table has none)
    selected: str | None       # what the dispatcher chose
    ok: bool


@dataclass(frozen=True)
class BucketEdges:
    """The dispatcher's choice at edge-1, edge, edge+1 against the declared bucket's entry."""

    edges: tuple[str, ...]     # the declared edges, as labels
    n_probes: int
    n_mismatch: int
    n_blind: int               # (edge, config) pairs with one kernel on both sides
    first: EdgeProbe | None    # the first mismatch
    probes: tuple[EdgeProbe, ...]
    ok: bool

    def summary(self) -> str:
        if self.first is None:
            return (f"{self.n_probes - self.n_mismatch}/{self.n_probes} probes at "
                    f"{', '.join(self.edges)} select the declared bucket's entry")
        p = self.first
        return (f"{self.n_mismatch} of {self.n_probes} probes off the declared edges, first "
                f"{p.direction} {p.config} at N={p.n_rows} ({p.edge}): the dispatcher selects "
                f"{p.selected}, the declared {p.bucket} bucket's entry is {p.expected}")


def entry_configs(entries: Mapping[tuple[str, str, Any], Any]) -> dict[str, list]:
    """The configs of each direction's table entries, in first-seen order."""
    configs: dict[str, list] = {}
    for direction, _, config in entries:
        configs.setdefault(direction, [])
        if config not in configs[direction]:
            configs[direction].append(config)
    return configs


def bucket_edges(edges: Sequence[BucketEdge], entries: Mapping[tuple[str, str, Any], Any],
                 dispatched: Mapping[tuple[str, Any, int], Any]) -> BucketEdges:
    """``entries``: (direction, bucket, config) -> kernel; ``dispatched``: (direction,
    config, N) -> the kernel the dispatcher selects, for every probe of ``edge_probes``."""
    configs = entry_configs(entries)
    found, blind = [], 0
    for direction, config, n, label in edge_probes(edges, configs):
        bucket = declared_bucket(edges, entries, direction, config, n)
        expected = entries.get((direction, bucket, config))
        selected = dispatched.get((direction, config, n))
        found.append(EdgeProbe(direction=direction, config=_config_label(config), n_rows=n,
                               edge=label, bucket=bucket,
                               expected=None if expected is None else _name(expected),
                               selected=None if selected is None else _name(selected),
                               ok=expected is not None and selected == expected))
    for edge in edges:   # the pairs whose two sides are one kernel: a moved edge is moot there
        for config in configs.get(edge.direction, ()):
            inside, outside = (
                entries.get((edge.direction,
                             declared_bucket(edges, entries, edge.direction, config, m), config))
                for m in (edge.edge, edge.edge + (1 if edge.upper else -1)))
            blind += inside == outside
    bad = [p for p in found if not p.ok]
    return BucketEdges(edges=tuple(e.label for e in edges), n_probes=len(found),
                       n_mismatch=len(bad), n_blind=blind, first=bad[0] if bad else None,
                       probes=tuple(found), ok=not bad)
