"""``csagate compare --impl A --impl B``: the same inputs through two implementations.

Per case and output: max |A - B|, the count of differing elements, and each one's max error
against the fp64 oracle and the fp32 eager reference, in an 80-column table (``--json`` for
every number). Exit 0 when it ran (a difference is a measurement, not a failure), 2 on a bad
value, 3 when either implementation cannot run here.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import click

from csagate import console
from csagate.commands.run import RATIOS
from csagate.exitcodes import ExitCode
from csagate.impl_choice import load_impl

COLUMNS = ("case / output", "|A-B|", "n diff", "A-fp64", "B-fp64", "A-fp32", "B-fp32")


def _num(x: float) -> str:
    if x != x or x == float("inf"):
        return "inf" if x == float("inf") else "nan"
    return "0" if x == 0 else f"{x:.1e}"


def table(diffs, a: str, b: str):
    from rich import box

    t = console.new_table(f"compare A={a} B={b}: max |error|", COLUMNS,
                          marks=COLUMNS[1:], right=COLUMNS[1:])
    t.box = box.SIMPLE_HEAD
    for d in diffs:
        t.add_row(d.case.name, *([""] * 6))
        if d.error:
            t.add_row(f"  raised: {d.error}", *([""] * 6))
        for x in d.tensors:
            t.add_row(f"  {x.tensor}", _num(x.max_abs), str(x.n_diff), _num(x.a_oracle),
                      _num(x.b_oracle), _num(x.a_eager), _num(x.b_eager))
    return t


def _cases(ratio: str, names, a, b):
    from csagate.commands.run import contracts

    cases = [c for k in contracts(ratio) for c in k.cases + k.hardening]
    if names:
        valid = {c.name for k in contracts(ratio) for c in k.all_cases}
        bad = [n for n in names if n not in valid]
        if bad:
            raise click.BadParameter(f"unknown case {bad[0]!r} (`csagate cases` lists them)",
                                     param_hint="--case")
        cases = [c for c in cases if c.name in set(names)]
    return [c for c in cases if a.supports.covers(c.ratio, c.coff, c.d)
            and b.supports.covers(c.ratio, c.coff, c.d)]


def _check(impls):
    if len(impls) != 2:
        raise click.UsageError(f"compare needs exactly two --impl, got {len(impls)}")
    return impls


def _ready(impl, device):
    """Exit 3 with one line unless ``impl`` runs here (2 when its check exits)."""
    from csagate.impl_choice import checked_unavailable

    why = checked_unavailable(impl, device)
    if why:
        console.abort(f"{impl.name}: {why} (nothing was compared)",
                      ExitCode.COULD_NOT_EVALUATE)


@click.command("compare", help="Run the same inputs (the gate's cases) through two "
               "implementations and print, per case and output, max |A - B|, the count of "
               "differing elements, and each one's error against the fp64 oracle and the fp32 "
               "eager reference.", epilog=ExitCode.help_text())
@click.option("--impl", "impls", multiple=True, required=True, metavar="NAME",
              callback=lambda ctx, p, v: tuple(load_impl(x) for x in v),
              help="An implementation (twice: A, then B); as for `csagate run --impl`.")
@click.option("--ratio", type=click.Choice(RATIOS), default="128",
              show_default=True, help="The contract family whose cases are compared.")
@click.option("--case", "names", multiple=True, metavar="NAME",
              help="Only this case (repeatable).")
@click.option("--device", "device_index", type=click.IntRange(min=0), default=0,
              show_default=True, help="CUDA device index.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write every number to this file.")
def command(impls, ratio, names, device_index, json_path) -> None:
    a, b = _check(impls)
    if json_path is not None and not json_path.resolve().parent.is_dir():
        raise click.BadParameter(f"directory {str(json_path.resolve().parent)!r} does not "
                                 "exist", param_hint="--json")
    cases = _cases(ratio, names, a, b)
    device = compare_device(device_index)
    for impl in (a, b):
        _ready(impl, device)
    from csagate.gates.compare import compare
    from csagate.gates.runner import build_targets

    targets = build_targets(cases, None)
    for impl in (a, b):
        prepare = getattr(impl, "prepare", None)
        if callable(prepare):
            try:
                prepare(targets, None)
            except Exception as exc:
                console.abort(f"{impl.name}: preparing it failed: {console.one_line(exc)}",
                              ExitCode.COULD_NOT_EVALUATE)
    diffs = compare(a, b, cases, device)
    console.print_table(table(diffs, a.name, b.name), console.out())
    if json_path is not None:
        from csagate.render import _jsonable

        doc = {"schema": "csagate.compare/1", "a": a.name, "b": b.name, "ratio": ratio,
               "cases": [{"name": d.case.name, "error": d.error,
                          "tensors": [dataclasses.asdict(x) for x in d.tensors]}
                         for d in diffs]}
        json_path.write_text(json.dumps(_jsonable(doc), indent=2) + "\n")
        console.err().print(f"wrote {json_path}")
    raise click.exceptions.Exit(int(ExitCode.PASS))


def compare_device(device_index: int):
    """The device both run on (exit 3 without a GPU); a seam the CPU tests replace."""
    import torch

    if not torch.cuda.is_available():
        console.abort("no CUDA GPU visible: nothing can be compared",
                      ExitCode.COULD_NOT_EVALUATE)
    return torch.device("cuda", device_index)
