"""The figures and tables of docs/KERNELS.md, written from the JSON or the code that holds them.

A figure block of the doc lies between two marker lines::

    <!-- figures:KIND SOURCE [SOURCE ...] -->
    ...what ``render(KIND, sources)`` returns...
    <!-- /figures -->

Each SOURCE is a JSON file, relative to the doc's folder (``figures/probe-sm_90a.json``), that
``csagate probe --json`` or ``csagate bench --json`` wrote, except for ``dispatch``. The kinds:

- ``dispatch``: the ratio=128 dispatch tables of each SOURCE, an arch (``sm_90a``), written from
  ``kernels/schedule.py`` itself: one row per config and bucket (buckets that select one kernel
  share a row) with the kernel's threads, CTAs across the columns (gy), window slots per
  thread (C) and shared memory, then the count of distinct kernels.
- ``probe-d128``: the small ratios' registers at d=128 from a probe file, one row per ratio:
  each direction's c1 and c2 kernel (registers and schedule tag).
- ``probe``: the register probe (``csagate probe --ratio all --arch ARCH --json``): the summary
  line, one row per ratio=128 kernel, one row per small ratio (its register range).
- ``bench-r128-large`` / ``bench-r128-short``: the ratio=128 shape rows (``"shapes"`` of
  ``csagate bench --ratio 128 --json``) above / at ``perf.profile.SHORT_TOKENS`` tokens.
- ``bench-small``: the small-ratio rows (``"small"`` of ``csagate bench --ratio R --json``),
  longest packs first.

A bench file's ``"peer"`` rows (``--peer cudnn``) add an **x cuDNN** column per direction to the
rows of the same ratio, config and tokens (cuDNN µs over ours, the mean of both orders).

``python -m csagate.perf.doc_figures`` rewrites every block whose sources all exist and names
the blocks whose sources do not (left as written); ``--check`` rewrites nothing and exits 1
when a block with its sources differs from its render. Nothing here imports torch.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from csagate.kernels import schedule as S
from csagate.kernels.registry import TABLE_RATIO
from csagate.perf.profile import SHORT_TOKENS

DOC = Path(__file__).resolve().parents[1] / "docs" / "KERNELS.md"
BLOCK = re.compile(r"^<!-- figures:(?P<kind>[\w-]+)(?P<sources>(?: [^\s>]+)+) -->\n"
                   r"(?P<body>.*?)^<!-- /figures -->$", re.MULTILINE | re.DOTALL)


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def _row(cells) -> str:
    return "| " + " | ".join(cells) + " |"


def _table(header: tuple[str, ...], rows: list[list[str]]) -> list[str]:
    return [_row(header), "|" + "---|" * len(header), *(_row(r) for r in rows)]


def _num(value) -> str:
    return "?" if value is None else str(value)


# --- dispatch ---------------------------------------------------------------------------------

CODE_KINDS = ("dispatch",)  # kinds whose SOURCEs name arches, not files


def _rows_range(lo: int | None, hi: int | None) -> str:
    if lo is None and hi is None:
        return "all"
    if lo is None:
        return f"<= {hi}"
    return f">= {lo}" if hi is None else f"{lo}-{hi}"


def _bucket_ranges(direction: str, coff: int, d: int) -> dict[str, tuple[int | None, int | None]]:
    """{bucket: (first N, last N)} of one config's buckets, None where a range is open."""
    if direction == "bwd":
        if (coff, d) not in S.BWD_SMALL:
            return {"default": (None, None)}
        return {"small": (None, S.BWD_SMALL_NB_MAX), "default": (S.BWD_SMALL_NB_MAX + 1, None)}
    small, large = (coff, d) in S.FWD_SMALL, (coff, d) in S.FWD_LARGE
    out = {"small": (None, S.SMALL_NB_MAX)} if small else {}
    out["default"] = (S.SMALL_NB_MAX + 1 if small else None, S.LARGE_NB_MIN - 1 if large else None)
    if large:
        out["large"] = (S.LARGE_NB_MIN, None)
    return out


def _dispatch_table(direction: str, arch: str) -> tuple[list[str], int]:
    """The table's lines and how many distinct kernels it selects."""
    tables = S.tables(direction, arch)
    rows, kernels = [], set()
    for coff, d in S.CONFIGS:
        merged: list[tuple[list[str], object, int | None, int | None]] = []
        for bucket, (lo, hi) in _bucket_ranges(direction, coff, d).items():
            sched = tables[bucket][(coff, d)]
            if merged and merged[-1][1] == sched:
                names, _, first, _ = merged[-1]
                merged[-1] = ([*names, bucket], sched, first, hi)
            else:
                merged.append(([bucket], sched, lo, hi))
        for names, sched, lo, hi in merged:
            kernels.add((coff, d, sched.tag))
            geo = S.R128Geometry(d, coff, sched)
            smem = (S.fwd_smem_bytes(sched) if direction == "fwd"
                    else S.bwd_smem_bytes(coff, sched))
            rows.append([S.config_name(coff, d), ", ".join(names), _rows_range(lo, hi),
                         sched.tag, str(sched.threads_x * sched.tchunks), str(geo.gy),
                         str(geo.chunk), str(smem)])
    if direction == "fwd":
        kernel = "forward kernel"
    else:
        forms = {"register window" if s.regwin else "staged"
                 for t in tables.values() for s in t.values()}
        kernel = f"backward kernel ({forms.pop()})" if len(forms) == 1 else "backward kernel"
    return _table(("config", "bucket", "N", kernel, "threads", "gy", "C", "smem B"), rows), \
        len(kernels)


def render_dispatch(arches: list[str]) -> str:
    lines: list[str] = []
    for arch in arches:
        fwd, n_fwd = _dispatch_table("fwd", arch)
        bwd, n_bwd = _dispatch_table("bwd", arch)
        lines += [f"`csagate schedules --arch {arch}` (`kernels/schedule.py`):", "", *fwd, "",
                  *bwd, "", f"{n_fwd} + {n_bwd} = {n_fwd + n_bwd} kernels (one per config and "
                  "schedule)."]
    return "\n".join(lines)


# --- probe ----------------------------------------------------------------------------------


def _regs_range(kernels: list[dict]) -> str:
    regs = sorted(k["regs"] for k in kernels if k["regs"] is not None)
    if not regs:
        return "-"
    return str(regs[0]) if regs[0] == regs[-1] else f"{regs[0]}-{regs[-1]}"


def _spill_stack(kernels: list[dict]) -> str:
    worst = max((max(k["spill_st"] or 0, k["spill_ld"] or 0) for k in kernels), default=0)
    stack = max((k["stack"] or 0 for k in kernels), default=0)
    return f"{worst} / {stack}"


def render_probe(docs: list[tuple[str, dict]]) -> str:
    """The summary of each probe file, its ratio=128 kernels one per row, then its small ratios
    one per row."""
    lines = []
    for name, doc in docs:
        kernels = doc["kernels"]
        lines.append(f"`csagate probe --ratio {doc['ratio']} --arch {doc['arch']} --json` "
                     f"(`{name}`): {doc['summary']}.")
        table = [k for k in kernels if k["ratio"] == TABLE_RATIO]   # the probe's order
        if table:
            lines += ["", *_table(
                ("ratio=128 kernel", "regs", "spill st/ld", "stack", "ex2.approx"),
                [[f"`{k['tag']}`" + (" (det.)" if k["deterministic"] else ""), _num(k["regs"]),
                  f"{_num(k['spill_st'])}/{_num(k['spill_ld'])}", _num(k["stack"]),
                  _num(k["ex2_approx"])] for k in table])]
        small = sorted({k["ratio"] for k in kernels if k["ratio"] != TABLE_RATIO})
        if small:
            rows = []
            for ratio in small:
                of = [k for k in kernels if k["ratio"] == ratio]
                by = {d: [k for k in of if k["direction"] == d] for d in ("fwd", "bwd")}
                rows.append([str(ratio), str(len(of)), _regs_range(by["fwd"]),
                             _regs_range(by["bwd"]), _spill_stack(of)])
            lines += ["", *_table(("ratio", "kernels", "fwd regs", "bwd regs",
                                   "max spill / stack B"), rows)]
    return "\n".join(lines)


def render_probe_d128(docs: list[tuple[str, dict]]) -> str:
    lines = []
    for name, doc in docs:
        cell = {(k["ratio"], k["direction"], k["coff"]):
                f"{_num(k['regs'])} (`{k['schedule']['tag']}`)" for k in doc["kernels"]
                if k["ratio"] != TABLE_RATIO and k["d"] == 128 and not k["deterministic"]}
        ratios = sorted({r for r, _, _ in cell})
        rows = [[str(r), *(" / ".join(cell.get((r, direction, c), "-") for c in (1, 2))
                           for direction in ("fwd", "bwd"))] for r in ratios]
        lines += [f"`csagate probe --ratio {doc['ratio']} --arch {doc['arch']} --json` (`{name}`), "
                  "d=128:", "", *_table(("ratio", "forward regs, c1 / c2",
                                         "backward regs, c1 / c2"), rows)]
    return "\n".join(lines)


# --- bench ----------------------------------------------------------------------------------


def _ratio_of(row: dict) -> int:
    return int(row.get("extra", {}).get("ratio", TABLE_RATIO))


def _key(config: str, ratio: int, tokens: int) -> tuple[str, int]:
    """Rows and peer rows meet on ("r4 c1d128", tokens); a ratio=128 shape row's config has
    no ratio prefix."""
    return (config if config.startswith("r") else f"r{ratio} {config}", tokens)


def _peers(docs: list[tuple[str, dict]]) -> dict[tuple[str, int], dict]:
    return {_key(p["config"], TABLE_RATIO, p["tokens"]): p
            for _, doc in docs for p in doc.get("peer", ())}


def _cold(row: dict, direction: str) -> str:
    """``28.1 (64 / 90%)``: cold µs (% of the copy ceiling / % of a cold copy of its bytes)."""
    return (f"{row[f'fused_{direction}_cold_us']:.1f} ({100 * row[f'{direction}_roofline']:.0f} "
            f"/ {100 * row[f'{direction}_vs_copy']:.0f}%)")


def _speedup(peer: dict | None, direction: str) -> str:
    return "-" if peer is None else f"{peer[f'{direction}_speedup']:.2f}"


def _caption(docs: list[tuple[str, dict]]) -> str:
    parts = [f"`{name}`: {doc['gpu']}, iters {doc['iters']}, copy ceiling "
             f"{doc['copy_bw_Bps'] / 1e12:.2f} TB/s" for name, doc in docs]
    return "From " + "; ".join(parts) + "."


def _with_peer(header: tuple[str, ...], cells: list[list[str]], peers: list[dict | None],
               after: dict[str, int]) -> tuple[tuple[str, ...], list[list[str]]]:
    """An x cuDNN column after each direction's column (its index in ``after``) when some row
    has a peer row; "-" in the rows without one."""
    if not any(peers):
        return header, cells
    cols = list(header)
    for direction, i in sorted(after.items(), key=lambda kv: -kv[1]):
        cols.insert(i + 1, "x cuDNN")
        for row, peer in zip(cells, peers, strict=True):
            row.insert(i + 1, _speedup(peer, direction))
    return tuple(cols), cells


def _bench_rows(docs, key: str, keep) -> list[dict]:
    return [r for _, doc in docs for r in doc.get(key, ()) if keep(r)]


def render_bench(kind: str, docs: list[tuple[str, dict]]) -> str:
    peers = _peers(docs)
    if kind == "bench-small":
        rows = sorted(_bench_rows(docs, "small", lambda r: True), key=lambda r: -r["tokens"])
        header = ("ratio, config", "tokens", "fwd kernel", "fwd µs", "bwd kernel", "bwd µs",
                  "bwd graph µs", "det. µs")
        after = {"fwd": 3, "bwd": 5}
        cells = [[r["config"], str(r["tokens"]), r["fwd_kernel"].split("_", 2)[-1],
                  _cold(r, "fwd"), r["bwd_kernel"].split("_", 2)[-1], _cold(r, "bwd"),
                  f"{r['fused_bwd_graph_us']:.1f}", f"{r['fused_bwd_det_cold_us']:.1f}"]
                 for r in rows]
    elif kind == "bench-r128-large":
        rows = _bench_rows(docs, "shapes", lambda r: r["tokens"] != SHORT_TOKENS)
        header = ("config", "tokens", "fwd cold µs (% roof / % copy)",
                  "bwd cold µs (% roof / % copy)", "det. cost")
        after = {"fwd": 2, "bwd": 3}
        cells = [[r["config"], str(r["tokens"]), _cold(r, "fwd"), _cold(r, "bwd"),
                  f"{100 * r['bwd_det_cost']:+.1f}%"] for r in rows]
    elif kind == "bench-r128-short":
        rows = _bench_rows(docs, "shapes", lambda r: r["tokens"] == SHORT_TOKENS)
        header = ("config", "fwd cold µs (% roof / % copy)", "bwd cold µs (% roof / % copy)",
                  "bwd graph µs", "det. cold µs (cost)")
        after = {"fwd": 1, "bwd": 2}
        cells = [[r["config"], _cold(r, "fwd"), _cold(r, "bwd"),
                  f"{r['fused_bwd_graph_us']:.1f}",
                  f"{r['fused_bwd_det_cold_us']:.1f} ({100 * r['bwd_det_cost']:+.1f}%)"]
                 for r in rows]
    else:
        raise ValueError(f"unknown figure kind {kind!r}")
    found = [peers.get(_key(r["config"], _ratio_of(r), r["tokens"])) for r in rows]
    header, table = _with_peer(header, cells, found, after)
    return "\n".join([_caption(docs), "", *_table(header, table)])


def render(kind: str, sources: list, names: list[str] | None = None) -> str:
    """The body of a ``kind`` block from its source files (``names``: as the marker writes
    them), or from the code for a code kind (``sources``: its arches)."""
    if kind in CODE_KINDS:
        return render_dispatch([str(a) for a in sources])
    docs = list(zip(names or [p.name for p in sources], (_load(p) for p in sources),
                    strict=True))
    if kind == "probe":
        return render_probe(docs)
    if kind == "probe-d128":
        return render_probe_d128(docs)
    return render_bench(kind, docs)


# --- the doc --------------------------------------------------------------------------------


def blocks(text: str) -> list[re.Match]:
    return list(BLOCK.finditer(text))


def rewrite(text: str, base: Path) -> tuple[str, list[str]]:
    """``text`` with every block whose sources exist (relative to ``base``) rendered again, and
    the blocks left as written (``KIND: missing SOURCE``)."""
    missing: list[str] = []

    def one(m: re.Match) -> str:
        names = m["sources"].split()
        head = m.group(0).split("\n", 1)[0]
        if m["kind"] in CODE_KINDS:
            return f"{head}\n{render(m['kind'], names)}\n<!-- /figures -->"
        paths = [base / n for n in names]
        absent = [n for n, p in zip(names, paths, strict=True) if not p.is_file()]
        if absent:
            missing.append(f"{m['kind']}: missing {', '.join(absent)}")
            return m.group(0)
        return f"{head}\n{render(m['kind'], paths, names)}\n<!-- /figures -->"

    return BLOCK.sub(one, text), missing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m csagate.perf.doc_figures",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--doc", type=Path, default=DOC, help=f"the doc (default: {DOC})")
    parser.add_argument("--check", action="store_true",
                        help="rewrite nothing; exit 1 when a block differs from its render")
    args = parser.parse_args(argv)
    text = args.doc.read_text()
    new, missing = rewrite(text, args.doc.parent)
    for line in missing:
        print(f"left as written: {line}", file=sys.stderr)
    if args.check:
        if new != text:
            print(f"{args.doc}: figure blocks differ from their JSON; run "
                  "python -m csagate.perf.doc_figures", file=sys.stderr)
            return 1
        return 0
    if new != text:
        args.doc.write_text(new)
        print(f"wrote {args.doc}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
