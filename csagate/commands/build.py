from __future__ import annotations

import click

from csagate import console, options
from csagate.exitcodes import ExitCode
from csagate.gates.errors import one_line
from csagate.progress import progress_bar
from csagate.render import kernel_json, kernels_doc


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
               "(`csagate cache info`).",
               epilog=ExitCode.listing(pass_="built", usage="usage error",
                                       could_not_evaluate="could not build (no DSL, a compile "
                                                          "error)"))
@options.ratio_option("all", options.KERNEL_RATIO_HELP)
@options.arch_option
@options.json_flag("Print the kernels as JSON on stdout (the shape of `probe --json`).")
def command(ratio: str, arch: str | None, as_json: bool) -> None:
    options.require_dsl()
    arch = options.resolve_arch(arch)
    from csagate.kernels import api

    keys = options.keys_of(ratio, arch)
    records = []
    with progress_bar(len(keys), f"compiling for {arch}") as bar:
        task = bar.add_task(f"compiling ({arch})", total=len(keys), tag="")

        def advance(record, i, n):
            bar.update(task, advance=1, tag=record.key.tag)

        try:
            for r in options.ratios_of(ratio):
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
