"""``csagate compare --report DIR``: DIR/compare.json (the document ``--json`` writes), one PNG
per case where A and B differ, and DIR/index.html listing every case with its key numbers and
its picture.

A picture has, on the left, the quantiles of |A - B| in bf16 steps (p50, p90, p99, p99.9,
max) of each output on a symlog axis (linear up to one step, logarithmic above, so a 0 is a
bar of no height labelled 0 and an infinite value a hatched bar to the top labelled inf); on
the right, where ``out`` differs: the fraction of its elements that differ (a log axis) and
the max (bar) and p99 (dot) in bf16 steps, per segment length bucket, per window quarter and for the
capacity padding rows. A case where nothing differs is listed as "no difference" and a case
where either side raised with its one line, neither with a picture. Everything is drawn from
the JSON document as written, so the page and the pictures show exactly its numbers.
matplotlib is the optional extra of ``csagate run --report``: without it the JSON and the
page are written all the same, the page saying why there are no pictures. The formatting of
a difference and of a count of steps is shared with compare's tables.
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path

from csagate.report import (
    NO_MATPLOTLIB,
    NO_MATPLOTLIB_NOTE,
    figures_html,
    have_matplotlib,
    page_head,
    slug,
)

QUANTILES = (("p50", "p50"), ("p90", "p90"), ("p99", "p99"), ("p999", "p99.9"),
             ("max", "max"))
QUARTERS = {"first quarter": "Q1", "second quarter": "Q2", "third quarter": "Q3",
            "last quarter": "Q4"}


def abs_text(x: float) -> str:
    """A difference or an error: 0, inf, nan, else 2 significant digits (1.6e-02)."""
    x = float(x)
    if not math.isfinite(x):
        return "inf" if x == float("inf") else "nan"
    return "0" if x == 0 else f"{x:.1e}"


def steps_text(x: float) -> str:
    """A count of bf16 steps: an integer as one, a fraction (fp32 dAPE) to 2 digits."""
    x = float(x)
    if not math.isfinite(x):
        return "inf" if x == float("inf") else "nan"
    return str(int(x)) if x == int(x) else f"{x:.2g}"


def differs(case: dict) -> bool:
    """Some element of some output differs (a case that raised has nothing to draw)."""
    return not case["error"] and any(t["n_diff"] > 0 for t in case["tensors"])


def _where_label(w: dict) -> str:
    if w["by"] == "padding":
        return "padding"
    return QUARTERS.get(w["group"], w["group"]) if w["by"] == "window" else w["group"]


def _top(values) -> float:
    """Where a non-finite bar ends: above every finite value (at least 10 steps)."""
    return max([10.0, *(float(v) for v in values if math.isfinite(float(v)))]) * 8


def _bars(ax, xs, values, width, color, top: float, label=None) -> None:
    """Bars of ``values`` (JSON numbers or "inf"/"nan"): a non-finite value is a hatched bar
    up to ``top``; every bar is labelled with its value (a 0 too)."""
    heights = [float(v) if math.isfinite(float(v)) else top for v in values]
    drawn = ax.bar(xs, heights, width, color=color, label=label)
    for bar, value in zip(drawn, values):
        if not math.isfinite(float(value)):
            bar.set_hatch("//")
        ax.annotate(steps_text(value), (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    xytext=(0, 4), textcoords="offset points", ha="center", va="bottom",
                    rotation=90, fontsize=6)


def _quantile_panel(ax, tensors: list[dict]) -> None:
    import matplotlib

    colors = matplotlib.colormaps["viridis"]
    width = 0.8 / len(QUANTILES)
    top = _top([t["steps"][key] for t in tensors for key, _ in QUANTILES])
    for k, (key, name) in enumerate(QUANTILES):
        xs = [i + (k - (len(QUANTILES) - 1) / 2) * width for i in range(len(tensors))]
        _bars(ax, xs, [t["steps"][key] for t in tensors], width,
              colors(k / (len(QUANTILES) - 1)), top, name)
    ax.set_yscale("symlog", linthresh=1.0)
    ax.set_ylim(0, top * 8)
    ax.set_xticks(range(len(tensors)), [t["tensor"] for t in tensors])
    ax.set_ylabel("|A - B| in bf16 steps (symlog)")
    ax.set_title("quantiles over every element", fontsize=9)
    ax.legend(fontsize=7, ncols=len(QUANTILES), loc="upper center")


def fraction_floor(where: list[dict]) -> float:
    """The log axis's floor: a decade below the smallest nonzero fraction (one element of
    the largest group at most), so every differing group shows as a bar."""
    smallest = min((w["n_diff"] / w["numel"] for w in where if w["n_diff"] and w["numel"]),
                   default=1.0)
    largest = max((w["numel"] for w in where), default=1)
    return min(smallest, 1.0 / max(largest, 1)) / 10


def _where_panels(ax_frac, ax_steps, where: list[dict]) -> None:
    xs = range(len(where))
    colors = {"length": "tab:blue", "window": "tab:orange", "padding": "tab:gray"}
    shade = [colors[w["by"]] for w in where]
    floor = fraction_floor(where)
    fraction = [max(w["n_diff"] / w["numel"], floor) if w["numel"] else floor for w in where]
    bars = ax_frac.bar(xs, fraction, 0.7, color=shade)
    for bar, w in zip(bars, where):
        ax_frac.annotate(f"{w['n_diff']}/{w['numel']}",
                         (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                         xytext=(0, 2), textcoords="offset points", ha="center",
                         va="bottom", fontsize=6)
    # a log axis: 0.9% and 90% both show (a linear 0-1 axis flattens the small ones); a
    # group where nothing differs stays at the axis floor, labelled by its count
    ax_frac.set_yscale("log")
    ax_frac.set_ylim(fraction_floor(where), 1.5)
    ax_frac.set_xticks(list(xs), [])
    ax_frac.set_ylabel("fraction differing (log)")
    ax_frac.set_title("where out differs: segment length | window quarter | padding",
                      fontsize=9)
    top = _top([w["max_steps"] for w in where])
    _bars(ax_steps, list(xs), [w["max_steps"] for w in where], 0.7, shade, top)
    p99 = [float(w["p99"]) if math.isfinite(float(w["p99"])) else top for w in where]
    ax_steps.plot(list(xs), p99, "o", color="black", markersize=3)
    ax_steps.set_yscale("symlog", linthresh=1.0)
    ax_steps.set_ylim(0, top * 8)
    ax_steps.set_ylabel("steps: max (bar), p99 (dot)")
    ax_steps.set_xticks(list(xs), [_where_label(w) for w in where], fontsize=7)
    for ax in (ax_frac, ax_steps):
        for i in range(1, len(where)):
            if where[i]["by"] != where[i - 1]["by"]:
                ax.axvline(i - 0.5, color="0.6", linewidth=0.6, linestyle="--")


def picture(path: Path, case: dict, a: str, b: str) -> None:
    """One PNG for ``case`` (a case of the JSON document): the quantile panel, and the where
    panels when ``out`` has its groups."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tensors = [t for t in case["tensors"] if t.get("steps")]
    where = [w for t in case["tensors"] if t["tensor"] == "out" for w in t["where"]]
    if where:
        fig = plt.figure(figsize=(11, 4.8), dpi=100)
        grid = fig.add_gridspec(2, 2, width_ratios=(1, 1.3))
        _quantile_panel(fig.add_subplot(grid[:, 0]), tensors)
        _where_panels(fig.add_subplot(grid[0, 1]), fig.add_subplot(grid[1, 1]), where)
    else:
        fig, ax = plt.subplots(figsize=(6.4, 4.8), dpi=100)
        _quantile_panel(ax, tensors)
    fig.suptitle(f"{case['name']}: |A - B|, A={a} B={b}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _case_rows(case: dict) -> str:
    name = html.escape(case["name"])
    if case["error"]:
        return (f"<tr><td>{name}</td><td colspan=\"8\">raised: "
                f"{html.escape(case['error'])}</td></tr>")
    rows = []
    for t in case["tensors"]:
        steps = "".join(f"<td>{steps_text(t['steps'][key]) if t.get('steps') else '-'}</td>"
                        for key, _ in QUANTILES)
        rows.append(f"<tr><td>{name}</td><td>{html.escape(t['tensor'])}</td>"
                    f"<td>{abs_text(t['max_abs'])}</td><td>{t['n_diff']} / {t['numel']}</td>"
                    f"{steps}</tr>")
    return "".join(rows)


def _caption(case: dict) -> str:
    return "; ".join(f"{t['tensor']}: {t['n_diff']} of {t['numel']} differ, max |A-B| "
                     f"{abs_text(t['max_abs'])}"
                     + (f", max {steps_text(t['steps']['max'])} steps" if t.get("steps") else "")
                     for t in case["tensors"] if t["n_diff"])


def _page(doc: dict, pictures: dict[str, str], note: str) -> str:
    a, b = doc["a"], doc["b"]
    title = f"csagate compare A={a} B={b}"
    steps = [name for _, name in QUANTILES[:-1]] + ["max steps"]
    heads = "".join(f"<th>{h}</th>" for h in ("case", "output", "max |A-B|", "n diff", *steps))
    sections = []
    for case in doc["cases"]:
        head = f"<h3>{html.escape(case['name'])}</h3>"
        if case["error"]:
            sections.append(f"{head}<p>raised: {html.escape(case['error'])}</p>")
        elif not differs(case):
            sections.append(f"{head}<p>no difference</p>")
        elif case["name"] in pictures:
            figure = figures_html([(pictures[case["name"]], f"{case['name']} |A-B|",
                                    _caption(case))])
            sections.append(head + figure)
        else:
            sections.append(f"{head}<p>{html.escape(_caption(case))}</p>")
    beyond = "".join(f"<li>{html.escape(line)}</li>" for line in doc["beyond"])
    bounds = ", ".join(f"{k} {v:g}" for k, v in doc["bounds"].items()) or "none"
    return (
        page_head(title) +
        f"<h1>{html.escape(title)}</h1>"
        f"<p>ratio={html.escape(str(doc['ratio']))}; |A - B| in bf16 steps: p50 to max over "
        "every element of each output.</p>"
        f"<table><tr>{heads}</tr>{''.join(_case_rows(c) for c in doc['cases'])}</table>"
        f"<p>bounds: {html.escape(bounds)}</p>"
        + (f"<h2>beyond the bound</h2><ul>{beyond}</ul>" if beyond else "") +
        f"<h2>per case</h2>{note}{''.join(sections)}"
        "<p><a href=\"compare.json\">compare.json</a> holds every number.</p>"
        "</body></html>\n")


def write_report(directory: Path, text: str) -> list[str]:
    """Write compare.json (``text``, the ``--json`` document), the pictures and index.html;
    return the status lines (``wrote ...``)."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.json").write_text(text)
    doc = json.loads(text)
    lines = [f"wrote {out / 'compare.json'}"]
    drawn = [c for c in doc["cases"] if differs(c)]
    draw = have_matplotlib()
    pictures = {}
    for case in drawn if draw else ():
        name = f"{slug(case['name'])}.png"
        picture(out / name, case, doc["a"], doc["b"])
        pictures[case["name"]] = name
    note = NO_MATPLOTLIB_NOTE if drawn and not draw else ""
    (out / "index.html").write_text(_page(doc, pictures, note))
    lines.append(f"wrote {out / 'index.html'} ({len(pictures)} picture(s))")
    if note:
        lines.append(NO_MATPLOTLIB)
    return lines
