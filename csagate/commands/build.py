from __future__ import annotations

import json
from pathlib import Path

import click

from csagate import console
from csagate.console import one_line
from csagate.exitcodes import ExitCode
from csagate.kernels.registry import RATIOS, SMALL_RATIOS, TABLE_RATIO
from csagate.kernels.schedule import ARCHES

RATIO_CHOICES = (*(str(r) for r in RATIOS), "all")
ARCH_CHOICES = ARCHES
FALLBACK_ARCH = "sm_100a"
ARCH_HELP = ("Build target [default: this machine's GPU (sm_90a on an H200, sm_100a on a B200); "
             f"with no supported GPU, {FALLBACK_ARCH}]. No GPU is needed to cross-compile.")
KERNELS_SCHEMA = "csagate.kernels/1"


def ratios_of(choice: str) -> tuple[int, ...]:
    return RATIOS if choice == "all" else (int(choice),)


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


def resolve_arch(arch: str | None) -> str:
    """``--arch`` of `build` and `probe`: as given, else this machine's GPU's, else sm_100a
    (said on stderr, so a cross-compile is never silent)."""
    if arch is not None:
        return arch
    found = gpu_arch()
    if found is not None:
        return found
    console.err().print(f"no supported GPU here: cross-compiling for {FALLBACK_ARCH} "
                        "(--arch sm_90a for the H200)")
    return FALLBACK_ARCH


def ratio_option(fn):
    """``--ratio R|all``: the kernel families to build or probe (build and probe alike)."""
    return click.option("--ratio", type=click.Choice(RATIO_CHOICES), default="all",
                        show_default=True,
                        help=f"the small ratios ({', '.join(map(str, SMALL_RATIOS))}): the "
                             "coff 1/2 x d 65/128/512 they serve (vec=1, vec=2, drift d); "
                             f"ratio={TABLE_RATIO}: the kernels of the dispatch tables.")(fn)


def arch_option(fn):
    return click.option("--arch", type=click.Choice(ARCH_CHOICES), default=None,
                        help=ARCH_HELP)(fn)


def kernel_json(key) -> dict:
    """The fields `build --json` and `probe --json` share for one kernel."""
    import dataclasses

    sched = key.schedule
    schedule = {"tag": getattr(sched, "tag", str(sched))}
    if dataclasses.is_dataclass(sched):
        schedule |= dataclasses.asdict(sched)
    return {"tag": key.tag, "kind": key.kind, "direction": key.direction, "ratio": key.ratio,
            "config": key.config, "coff": key.coff, "d": key.d, "arch": key.arch,
            "deterministic": key.deterministic, "schedule": schedule}


def kernels_doc(command: str, ratio: str, arch: str, kernels: list[dict], **extra) -> str:
    """The one JSON shape of `build --json` and `probe --json`."""
    return json.dumps({"schema": KERNELS_SCHEMA, "command": command, "ratio": ratio,
                       "arch": arch, **extra, "kernels": kernels})


def progress_bar(total: int, what: str):
    """A rich progress bar on stderr when it is a terminal; otherwise one status line."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    err = console.err()
    if not err.is_terminal:
        err.print(f"{what}: {total} kernels")
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                    TextColumn("{task.fields[tag]}"), console=err, transient=True,
                    disable=not err.is_terminal)


def build_table(records, arch: str):
    """One row per kernel: its tag, every field of its schedule, where it came from (compiled,
    or a cache hit: loaded from the disk cache or built earlier in this process), seconds."""
    table = console.new_table(f"csagate build: {len(records)} kernels for {arch}",
                              ("kernel", "schedule", "cached", "s"), marks=("cached", "s"),
                              right=("s",))
    for rec in records:
        table.add_row(console.Ident(rec.key.tag), console.schedule_text(rec.key.schedule),
                      "hit" if rec.hit else "no", f"{rec.seconds:.2f}")
    return table


@click.command("build", help="Compile (or cross-compile) every kernel a ratio can select, "
               "and show each kernel's schedule, whether it was a cache hit, and its compile "
               "(or load) time. Compiled kernels are kept in the per-user disk cache "
               "(`csagate cache info`).")
@ratio_option
@arch_option
@click.option("--json", "as_json", is_flag=True,
              help="Print the kernels as JSON on stdout (the shape of `probe --json`).")
def command(ratio: str, arch: str | None, as_json: bool) -> None:
    require_dsl()
    arch = resolve_arch(arch)
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

    compiled = [rec for rec in records if not rec.hit]
    if as_json:
        console.out().print_json(kernels_doc(
            "build", ratio, arch,
            [kernel_json(rec.key) | {"compile_s": round(rec.seconds, 4),
                                     "cache_hit": rec.hit} for rec in records],
            cache="cache_hit: loaded from the disk cache (or compiled earlier in this process)",
            compile_s=round(sum(rec.seconds for rec in compiled), 4)))
        return
    console.print_table(build_table(records, arch))
    line = (f"{len(records)} kernels: {len(compiled)} compiled in "
            f"{sum(rec.seconds for rec in compiled):.1f} s")
    if len(compiled) < len(records):
        line += f", {len(records) - len(compiled)} cache hits"
    console.out().print(line, soft_wrap=True)


def existing_parent(ctx, param, value):
    """A path option whose parent directory must exist (exit 2 otherwise, like --json)."""
    if value is not None and not Path(value).resolve().parent.is_dir():
        raise click.BadParameter(f"directory {str(Path(value).resolve().parent)!r} does not "
                                 "exist")
    return value
