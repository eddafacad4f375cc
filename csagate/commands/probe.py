from __future__ import annotations

import json

import click
from rich.table import Table

from csagate import console
from csagate.commands.build import (
    RATIO_CHOICES,
    gpu_arch,
    one_line,
    print_table,
    progress_bar,
    ratios_of,
    require_dsl,
)
from csagate.exitcodes import ExitCode
from csagate.kernels.schedule import ARCHES


def _num(value) -> str:
    return "?" if value is None else str(value)


@click.command("probe", help="Register probe: compile every kernel of a ratio, run ptxas -v "
               "on its PTX and report registers, spills, stack and ex2.approx. Exit 0 only if "
               "every kernel has 0 spill / 0 stack and none was skipped.")
@click.option("--ratio", type=click.Choice(RATIO_CHOICES), default="all", show_default=True,
              help="ratio=128: the 16 kernels of the dispatch tables; ratio=4: coff 1/2 x "
                   "d 65/128/512.")
@click.option("--arch", type=click.Choice(ARCHES), default=None,
              help="ptxas target [default: this machine's GPU, else sm_100a].")
@click.option("--keep-ptx", "keep_ptx", metavar="DIR",
              type=click.Path(file_okay=False, writable=True),
              default=None, help="Keep the PTX files in DIR (default: a temp dir, removed).")
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON on stdout.")
def command(ratio: str, arch: str | None, keep_ptx: str | None, as_json: bool) -> None:
    require_dsl()
    from csagate.perf.probe import PtxasNotFound, find_ptxas, probe, summary

    try:
        find_ptxas()
    except PtxasNotFound as exc:
        console.abort(str(exc), ExitCode.COULD_NOT_EVALUATE)
    if arch is None:
        arch = gpu_arch() or "sm_100a"
    from csagate.kernels.cache import keys_for

    keys = [key for r in ratios_of(ratio) for key in keys_for(r, arch)]
    with progress_bar(len(keys), f"probing for {arch}") as bar:
        task = bar.add_task(f"probing ({arch})", total=len(keys), tag="")
        try:
            rows = probe(keys, keep_dir=keep_ptx,
                         progress=lambda row, i, n: bar.update(task, advance=1, tag=row.tag))
        except PtxasNotFound as exc:
            console.abort(str(exc), ExitCode.COULD_NOT_EVALUATE)
        except Exception as exc:  # a compile error: nothing was probed to judge
            console.abort(f"build failed: {one_line(exc)}", ExitCode.COULD_NOT_EVALUATE)

    ok, line = summary(rows, arch)
    out = console.out()
    if as_json:
        out.print_json(json.dumps({
            "arch": arch, "ok": ok, "summary": line,
            "kernels": [{"kernel": r.tag, "kind": r.kind, "schedule": list(r.schedule),
                         "arch": r.arch, "regs": r.regs, "spill_st": r.spill_st,
                         "spill_ld": r.spill_ld, "stack": r.stack, "ex2_approx": r.ex2,
                         "rc": r.rc, "clean": r.clean, "note": r.note} for r in rows]}))
    else:
        table = Table(title=f"csagate probe: ptxas -v -arch={arch}")
        for col, just in (("kernel", "left"), ("arch", "left"), ("regs", "right"),
                          ("spill st/ld", "right"), ("stack", "right"),
                          ("ex2.approx", "right"), ("status", "left")):
            table.add_column(col, justify=just, no_wrap=True)
        for r in rows:
            table.add_row(r.tag, r.arch, _num(r.regs), f"{_num(r.spill_st)}/{_num(r.spill_ld)}",
                          _num(r.stack), _num(r.ex2), r.note,
                          style=None if r.clean else "bold red")
        print_table(table)
        out.print(line, soft_wrap=True)
    if keep_ptx:
        console.err().print(f"PTX kept in {keep_ptx}")
    if not ok:
        raise click.exceptions.Exit(int(ExitCode.CONTRACT_FAILURE))
