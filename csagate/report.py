"""``run --report DIR``: the verdict JSON, one heatmap per failing case and tensor, one HTML
page.

The pictures draw the ``grid`` of each ``where`` record (``csagate.gates.locate``): the largest
absolute error per (row bin, column block), on a log scale, zero cells blank. matplotlib is
an optional extra (``pip install 'csagate[report]'``); without it the page says so and the
JSON is written all the same. The page's head, its figures, the file names and the
no-matplotlib messages are shared with ``compare --report`` (``csagate.pair_report``).
"""

from __future__ import annotations

import html
import re
from pathlib import Path

from csagate import render
from csagate.gates.verdict import Verdict
from csagate.where import where_line

NO_MATPLOTLIB = "no pictures: matplotlib is not installed (pip install 'csagate[report]')"
NO_MATPLOTLIB_NOTE = ("<p>The pictures need matplotlib: "
                      "<code>pip install 'csagate[report]'</code>.</p>")


def slug(text: str) -> str:
    """``text`` as a file name part: runs of other characters than [A-Za-z0-9_.-] become _."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")


def have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def heatmap(path: Path, case: str, where: dict) -> None:
    """One PNG: rows (bins) down, column blocks across, log10 of the largest error."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    grid = where["grid"]
    worst = np.array(grid["max_err"], dtype=float)
    worst[np.isinf(worst)] = np.nan
    finite = worst[np.isfinite(worst) & (worst > 0)]
    shown = np.where(worst > 0, np.log10(np.where(worst > 0, worst, 1.0)), np.nan)
    edges, width = grid["row_edges"], grid["col_block"]
    fig, ax = plt.subplots(figsize=(6.4, 4.8), dpi=100)
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="white")
    image = ax.imshow(np.ma.masked_invalid(shown), aspect="auto", interpolation="nearest",
                      cmap=cmap, extent=(0, worst.shape[1], edges[-1], 0))
    for bound in (where.get("segment_bounds") or ())[1:-1]:
        ax.axhline(bound, color="0.6", linewidth=0.6, linestyle="--")  # segment boundaries
    bar = fig.colorbar(image, ax=ax)
    bar.set_label("log10 max |error| in the cell")
    ax.set_xlabel(f"column block ({width} columns each)")
    ax.set_ylabel(f"{where['row_axis']} ({len(edges) - 1} bins)")
    against = "fp64 oracle" if where["gate"] == "G3" else "fp32 eager"
    if where["gate"] == "zeros":
        against = "zero"
    top = f"{finite.max():.2e}" if finite.size else "inf/NaN"
    ax.set_title(f"{case}: {where['tensor']} ({where['gate']}) vs {against}\n"
                 f"{where['n_offending']} of {where['numel']} elements off, max {top}",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def page_head(title: str) -> str:
    """An HTML page up to its ``<body>``: the title and the style every report page shares."""
    return ("<!doctype html><html><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(title)}</title>"
            "<style>body{font-family:sans-serif;max-width:60em;margin:2em auto}"
            "td,th{padding:2px 8px;border-bottom:1px solid #ddd}"
            "figure{margin:1em 0}img{max-width:100%}</style></head><body>")


def figures_html(pictures: list[tuple[str, str, str]]) -> str:
    """One ``<figure>`` per (file, alt text, caption)."""
    return "".join(
        f"<figure><img src=\"{html.escape(src)}\" alt=\"{html.escape(alt)}\">"
        f"<figcaption>{html.escape(caption)}</figcaption></figure>"
        for src, alt, caption in pictures)


def _page(verdict: Verdict, pictures: list[tuple[str, str, str]], note: str) -> str:
    head = html.escape(verdict.headline)
    colour = "#1a7f37" if verdict.ok else "#cf222e"
    rows = []
    for result in (verdict.drift, *verdict.cases):
        marks = "".join(f"<td>{html.escape(result.gate_status(g) or '-')}</td>"
                        for g in ("G1", "G2", "G3", "zeros"))
        rows.append(f"<tr><td>{html.escape(result.name)}</td>{marks}"
                    f"<td>{html.escape(result.status)}</td></tr>")
    reasons = "".join(f"<li>{html.escape(r)}</li>" for r in verdict.reasons)
    figures = figures_html(pictures)
    return (
        page_head("csagate verdict") +
        f"<h1 style=\"color:{colour}\">{head}</h1>"
        f"<p>ratio={verdict.ratio}; {html.escape(str(verdict.env.get('gpu', '')))} "
        f"{html.escape(str(verdict.env.get('arch', '')))}</p>"
        "<table><tr><th>case</th><th>G1</th><th>G2</th><th>G3</th><th>zeros</th>"
        f"<th>result</th></tr>{''.join(rows)}</table>"
        f"<h2>reasons</h2><ul>{reasons or '<li>none</li>'}</ul>"
        f"<h2>where the errors sit</h2>{note}{figures or '<p>no failing case</p>'}"
        "<p><a href=\"verdict.json\">verdict.json</a> holds every number.</p>"
        "</body></html>\n")


def write_report(directory: Path, verdict: Verdict, extra: dict | None = None, *,
                 several: bool = False) -> list[str]:
    """Write the report; return the status lines (``wrote ...``)."""
    out = Path(directory) / (f"r{verdict.ratio}" if several else "")
    out.mkdir(parents=True, exist_ok=True)
    render.write_json(out / "verdict.json", verdict, extra)
    pictures, lines = [], [f"wrote {out / 'verdict.json'}"]
    draw = have_matplotlib()
    for result in verdict.cases:
        for where in result.recorded.get("where", ()):
            caption = where_line(result.name, where)
            if not draw:
                continue
            name = f"{slug(result.name)}__{slug(where['tensor'])}__{slug(where['gate'])}.png"
            heatmap(out / name, result.name, where)
            pictures.append((name, f"{result.name} {where['tensor']} ({where['gate']})",
                             caption))
    note = "" if draw or not any(r.recorded.get("where") for r in verdict.cases) else \
        NO_MATPLOTLIB_NOTE
    (out / "index.html").write_text(_page(verdict, pictures, note))
    lines.append(f"wrote {out / 'index.html'} ({len(pictures)} picture(s))")
    if note:
        lines.append(NO_MATPLOTLIB)
    return lines
