from __future__ import annotations

import json

import click
from rich.table import Table

from csagate import console
from csagate.exitcodes import ExitCode
from csagate.kernels.schedule import ARCHES

RATIO_CHOICES = ("4", "128", "all")
ARCH_CHOICES = ("auto", *ARCHES)


def ratios_of(choice: str) -> tuple[int, ...]:
    return (4, 128) if choice == "all" else (int(choice),)


def require_dsl() -> None:
    """Exit 3 with one line when nvidia-cutlass-dsl does not import."""
    from csagate.kernels._dsl import dsl_available

    ok, why = dsl_available()
    if not ok:
        console.abort(why, ExitCode.COULD_NOT_EVALUATE)


def gpu_arch() -> str | None:
    """The build target of the current GPU; None without one (or one we do not build for)."""
    import torch

    if not torch.cuda.is_available():
        return None
    from csagate.kernels._dsl import device_arch

    arch = device_arch()
    return arch if arch in ARCHES else None


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def print_table(table) -> None:
    console.print_table(table)


def progress_bar(total: int, what: str):
    """A rich progress bar on stderr when it is a terminal; otherwise one status line."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    err = console.err()
    if not err.is_terminal:
        err.print(f"{what}: {total} kernels")
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[tag]}"), console=err, transient=True,
                    disable=not err.is_terminal)


@click.command("build", help="Compile (or cross-compile) every kernel a ratio can select, "
               "and show compile time and cache hits.")
@click.option("--ratio", type=click.Choice(RATIO_CHOICES), default="all", show_default=True,
              help="ratio=4: coff 1/2 x d 65/128/512 (vec=1, vec=2, drift d); ratio=128: the "
                   "16 kernels of the dispatch tables.")
@click.option("--arch", type=click.Choice(ARCH_CHOICES), default="auto", show_default=True,
              help="Build target; auto = this machine's GPU (needs one).")
@click.option("--json", "as_json", is_flag=True, help="Print the records as JSON on stdout.")
def command(ratio: str, arch: str, as_json: bool) -> None:
    require_dsl()
    if arch == "auto":
        arch = gpu_arch()
        if arch is None:
            console.abort(f"--arch auto needs a CUDA GPU ({', '.join(ARCHES)}) here: pass "
                          + " or ".join(f"--arch {a}" for a in ARCHES) + " to cross-compile",
                          ExitCode.COULD_NOT_EVALUATE)
    from csagate.kernels import api
    from csagate.kernels.cache import keys_for

    keys = [key for r in ratios_of(ratio) for key in keys_for(r, arch)]
    records = []
    with progress_bar(len(keys), f"compiling for {arch}") as bar:
        task = bar.add_task(f"compiling ({arch})", total=len(keys), tag="")

        def advance(record, i, n):
            bar.update(task, advance=1, tag=record.key.tag)

        try:
            for r in ratios_of(ratio):
                records += api.build(r, arch=arch, progress=advance)
        except Exception as exc:  # a compile error: nothing was built to judge
            console.abort(f"build failed: {one_line(exc)}", ExitCode.COULD_NOT_EVALUATE)

    if as_json:
        console.out().print_json(json.dumps([
            {"kernel": rec.key.tag, "kind": rec.key.kind, "ratio": rec.key.ratio,
             "coff": rec.key.coff, "d": rec.key.d, "schedule": list(rec.key.schedule.astuple()),
             "arch": rec.key.arch, "compile_s": round(rec.seconds, 4), "cache_hit": rec.hit}
            for rec in records]))
        return
    table = Table(title=f"csagate build: {len(records)} kernels for {arch}")
    for col, just in (("kernel", "left"), ("schedule", "left"), ("arch", "left"),
                      ("compile s", "right"), ("cache hit", "left")):
        table.add_column(col, justify=just, no_wrap=True)
    for rec in records:
        sched = ",".join(("T" if v else "F") if isinstance(v, bool) else str(v)
                         for v in rec.key.schedule.astuple())
        table.add_row(rec.key.tag, sched, rec.key.arch, f"{rec.seconds:.2f}",
                      "yes" if rec.hit else "no")
    print_table(table)
    compiled = [rec for rec in records if not rec.hit]
    console.out().print(f"{len(records)} kernels: {len(compiled)} compiled in "
              f"{sum(rec.seconds for rec in compiled):.1f} s, {len(records) - len(compiled)} "
              "cached", soft_wrap=True)
