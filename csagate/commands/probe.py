from __future__ import annotations

from pathlib import Path

import click

from csagate import console, options
from csagate.exitcodes import ExitCode
from csagate.gates.errors import one_line
from csagate.progress import progress_bar
from csagate.render import kernel_json, kernels_doc


def existing_parent(ctx, param, value):
    """A path option whose parent directory must exist (exit 2 otherwise, like --json)."""
    if value is not None and not Path(value).resolve().parent.is_dir():
        raise click.BadParameter(f"directory {str(Path(value).resolve().parent)!r} does not "
                                 "exist")
    return value


def _num(value) -> str:
    return "?" if value is None else str(value)


def probe_table(rows, arch: str):
    """One row per kernel: registers, spill stores/loads, stack, ex2.approx count, status."""
    cols = ("kernel", "regs", "spill\nst/ld", "stack", "ex2\napprox", "status")
    table = console.new_table(f"csagate probe: ptxas -v -arch={arch}", cols,
                              marks=cols[1:5], right=cols[1:5])
    for r in rows:
        table.add_row(console.Ident(r.tag), _num(r.regs), f"{_num(r.spill_st)}/{_num(r.spill_ld)}",
                      _num(r.stack), _num(r.ex2), r.note, style=None if r.clean else "bold red")
    return table


@click.command("probe", help="Register probe: compile every kernel of a ratio, run ptxas -v "
               "on its PTX and report registers, spills, stack and ex2.approx. Exit 0 only if "
               "every kernel has 0 spill / 0 stack and none was skipped. ptxas: the "
               "nvidia-cuda-nvcc-cu12 wheel's (dev extra), else PATH, else $CUDA_HOME/bin.",
               epilog=ExitCode.listing(pass_="every kernel clean", contract_failure="a kernel "
                                       "spills, uses stack or was skipped", usage="usage error",
                                       could_not_evaluate="could not probe (no DSL, no "
                                                          "ptxas, a compile error)"))
@options.ratio_option("all", options.KERNEL_RATIO_HELP)
@options.arch_option
@click.option("--keep-ptx", "keep_ptx", metavar="DIR", callback=existing_parent,
              type=click.Path(file_okay=False, writable=True),
              default=None, help="Keep the PTX files in DIR (its parent must exist; default: "
                                 "a temp dir, removed).")
@options.json_flag("Print the kernels as JSON on stdout (the shape of `build --json`).")
def command(ratio: str, arch: str | None, keep_ptx: str | None, as_json: bool) -> None:
    options.require_dsl()
    from csagate.perf.probe import PtxasNotFound, find_ptxas, probe, summary

    try:
        find_ptxas()
    except PtxasNotFound as exc:
        console.abort(str(exc), ExitCode.COULD_NOT_EVALUATE)
    arch = options.resolve_arch(arch)
    keys = options.keys_of(ratio, arch)
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
        out.print_json(kernels_doc(
            "probe", ratio, arch,
            [kernel_json(key) | {"regs": r.regs, "spill_st": r.spill_st,
                                 "spill_ld": r.spill_ld, "stack": r.stack, "ex2_approx": r.ex2,
                                 "rc": r.rc, "clean": r.clean, "note": r.note}
             for key, r in zip(keys, rows, strict=True)],
            ok=ok, summary=line, ptxas=find_ptxas()))
    else:
        console.print_table(probe_table(rows, arch))
        out.print(line, soft_wrap=True)
    if keep_ptx:
        console.err().print(f"PTX kept in {keep_ptx}")
    if not ok:
        raise click.exceptions.Exit(int(ExitCode.CONTRACT_FAILURE))
