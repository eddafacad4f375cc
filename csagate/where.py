"""Where a failing case's errors sit, as lines printed below the verdict table.

Reads the ``where`` records ``csagate.gates.locate`` left in each case's ``recorded`` numbers;
judges nothing.
"""

from __future__ import annotations

from rich.console import Console

from csagate.gates.verdict import Verdict

MAX_LINES = 12   # cases x tensors printed; the JSON (--json, --report) holds every one


def _segments(where: dict) -> str:
    segs = where.get("segments")
    if not segs:
        return ""
    text = ", ".join(f"{s} ({n})" for s, n in segs)
    return f" in segment(s) {text};"


def _blocks(where: dict) -> str:
    blocks = where["column_blocks"]
    counts = blocks["counts"]
    hit = [i for i, n in enumerate(counts) if n]
    width = blocks["width"]
    worst = max(range(len(counts)), key=counts.__getitem__)
    span = f"{hit[0]}" if len(hit) == 1 else f"{len(hit)} of {len(counts)}"
    return (f" column block(s) {span} ({width} columns each; most in block {worst}, "
            f"columns {worst * width}-{(worst + 1) * width - 1})")


def where_line(case: str, where: dict) -> str:
    """One line: the case, tensor and gate, how many, which segments, rows and column
    blocks, and the first offending element with its fused, eager and oracle values."""
    rows, first = where["rows"], where["first"]
    seg = "" if first["segment"] is None else f", segment {first['segment']}"
    span = (f"{where['row_axis']}s {rows['first']}..{rows['last']} ({rows['n']} of "
            f"{rows['of']})")
    return (f"{case}: {where['tensor']} ({where['gate']}): {where['n_offending']} of "
            f"{where['numel']} elements off;{_segments(where)} {span};{_blocks(where)}; "
            f"first at {first['index']}{seg}: fused {first['fused']:.6g}, eager "
            f"{first['eager']:.6g}, oracle {first['oracle']:.6g}")


def where_lines(verdict: Verdict) -> list[str]:
    lines = []
    for result in verdict.cases:
        for where in result.recorded.get("where", ()):
            lines.append(where_line(result.name, where))
    return lines


def print_where(verdict: Verdict, console: Console) -> None:
    """The location lines (at most ``MAX_LINES``), under a heading, when there are any."""
    from csagate.render import print_lines

    lines = where_lines(verdict)
    if not lines:
        return
    print_lines(console, "where the errors sit:")
    for line in lines[:MAX_LINES]:
        print_lines(console, line, indent="  - ", hang="    ")
    if len(lines) > MAX_LINES:
        print_lines(console, f"  ({len(lines) - MAX_LINES} more in the JSON report)")
