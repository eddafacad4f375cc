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

__all__ = ["BucketEdges", "EdgeProbe", "TableCoverage", "beyond_configs", "bucket_edges",
           "declared_bucket", "edge_probes", "entry_config", "entry_configs", "kernel_config",
           "table_coverage"]

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
    unexpected: tuple[str, ...]     # selected kernels of the tables' configs in no table entry
    ok: bool
    beyond: tuple[str, ...] = ()    # selected kernels of configs the tables do not list: a
    #                                 case beyond the contract's configs (recorded, not gated)

    def summary(self) -> str:
        text = (f"{self.direction} {self.n_covered}/{self.n_expected} kernels of "
                f"{self.n_entries} table entries")
        if self.missing:
            text += "; no case selects " + ", ".join(self.missing)
        if self.unexpected:
            text += "; selected but in no table entry: " + ", ".join(self.unexpected)
        return text


def _minus(these: Sequence[Any], those: Sequence[Any]) -> tuple[Any, ...]:
    """The kernels of ``these`` that are not in ``those``, in ``these``' order."""
    return tuple(k for k in these if k not in those)


def entry_config(key: Any) -> Any:
    """The ``(coff, d)`` config of a table entry key ``(..., (coff, d))``; None if the key
    names none."""
    if isinstance(key, tuple) and key and isinstance(key[-1], tuple):
        return key[-1]
    return None


def kernel_config(kernel: Any) -> Any:
    """The ``(coff, d)`` config of a selected kernel (a Selection); None if it names none."""
    coff, d = getattr(kernel, "coff", None), getattr(kernel, "d", None)
    return None if coff is None or d is None else (coff, d)


def beyond_configs(kernels: Iterable[Any], configs: set) -> tuple[Any, ...]:
    """The kernels whose config is known and not one of ``configs`` (the tables' configs):
    a case at an extra head dim selects them; no table entry expects them."""
    return tuple(k for k in kernels
                 if configs and kernel_config(k) is not None and kernel_config(k) not in configs)


def table_coverage(direction: str, entries: Mapping[Any, Any],
                   selected: Iterable[Any]) -> TableCoverage:
    """Every distinct kernel of ``entries`` (table entry -> kernel) is in ``selected``, and
    every selected kernel of the entries' configs is one of them. A selected kernel of a config
    the entries do not list (a case beyond the contract's configs: an odd head dim) is neither
    expected nor unexpected: it is reported in ``beyond``."""
    want = tuple(dict.fromkeys(entries.values()))
    got = tuple(dict.fromkeys(selected))
    configs = {c for c in map(entry_config, entries) if c is not None}
    missing = _minus(want, got)
    beyond = beyond_configs(_minus(got, want), configs)
    unexpected = _minus(_minus(got, want), beyond)
    return TableCoverage(direction=direction, n_entries=len(entries), n_expected=len(want),
                         n_covered=len(want) - len(missing),
                         missing=tuple(map(_name, missing)),
                         unexpected=tuple(map(_name, unexpected)),
                         ok=not missing and not unexpected,
                         beyond=tuple(map(_name, beyond)))


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
