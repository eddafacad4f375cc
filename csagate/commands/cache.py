"""``csagate cache info|clear|prune``: the per-user disk cache of compiled kernels.

Where it lives (``CSAGATE_CACHE_DIR`` overrides; else ``$XDG_CACHE_HOME/csagate`` or
``~/.cache/csagate``), whether it passes its safety rules (a private folder of the current
user), how many kernels it holds; ``clear`` removes them, ``prune`` keeps the most recently
used within a bound (a build prunes to 256 MiB / 1000 entries by itself). ``info`` only reads:
it creates no folder.
"""

from __future__ import annotations

import json

import click

from csagate import console
from csagate.exitcodes import ExitCode
from csagate.kernels.diskcache import MAX_BYTES, MAX_ENTRIES  # stdlib only: cheap


def _cache():
    from csagate.kernels.diskcache import DiskCache

    return DiskCache()


def _usable_or_abort(cache) -> None:
    from csagate.kernels.diskcache import root_problem

    problem = root_problem(cache.root)
    if problem:
        console.abort(f"kernel cache: {problem}", ExitCode.USAGE)


@click.group("cache", help="The disk cache of compiled kernels: `info` says where it is and "
             "what it holds, `clear` empties it, `prune` bounds it (a build prunes to "
             f"{MAX_BYTES >> 20} MiB / {MAX_ENTRIES} entries itself). CSAGATE_CACHE_DIR moves it; "
             "CSAGATE_DISK_CACHE=0 turns it off.",
             epilog=ExitCode.listing(pass_="done", usage="usage error (a cache folder that "
                                     "cannot be used)"))
def command() -> None:
    pass


@command.command("info", short_help="Where the cache lives, its size (reads only).",
                 help="Where the kernel cache lives, whether it is usable, its size "
                 "(reads only: creates nothing).",
                 epilog=ExitCode.listing(pass_="done", usage="usage error"))
@click.option("--json", "as_json", is_flag=True, help="Print the facts as JSON on stdout.")
def info(as_json: bool) -> None:
    facts = _cache().info()
    if as_json:
        click.echo(json.dumps(facts, indent=2))
        return
    usable = "yes" if facts["usable"] else f"no: {facts['problem']}"
    if facts["usable"] and not facts["exists"]:
        usable += " (not created yet: the first build creates it)"
    table = console.new_table("csagate kernel cache", ("fact", "value"))
    for name, value in (("folder", facts["root"]), ("usable", usable),
                        ("kernels", str(facts["entries"])), ("bytes", str(facts["bytes"])),
                        ("PTX dumps", f"{facts['ptx_files']} file(s), {facts['ptx_bytes']} "
                                      f"bytes in {facts['ptx_dir']} (`csagate cache clear`)"),
                        ("bound", f"{facts['max_entries']} entries, "
                                  f"{facts['max_bytes'] >> 20} MiB (`csagate cache prune`)")):
        table.add_row(name, value)
    console.print_table(table)


@command.command("clear", short_help="Remove every cached kernel and the PTX dumps.",
                 help="Remove every cached kernel and the compiler's PTX dumps (the "
                 "next build compiles again).",
                 epilog=ExitCode.listing(pass_="done", usage="usage error (a cache folder that "
                                         "cannot be used)"))
def clear() -> None:
    cache = _cache()
    _usable_or_abort(cache)
    removed = cache.clear()
    console.err().print(f"removed {removed} file(s) from the kernel cache")


@command.command("prune", short_help="Keep the newest kernels within a bound.",
                 help="Keep the most recently used kernels within a bound; remove the "
                 "rest.",
                 epilog=ExitCode.listing(pass_="done", usage="usage error (a cache folder that "
                                         "cannot be used)"))
@click.option("--max-mb", type=click.IntRange(min=0), default=MAX_BYTES >> 20,
              show_default=True, help="Keep at most this many MiB of kernels.")
@click.option("--max-entries", type=click.IntRange(min=0), default=MAX_ENTRIES,
              show_default=True,
              help="Keep at most this many kernels.")
def prune(max_mb: int, max_entries: int) -> None:
    cache = _cache()
    _usable_or_abort(cache)
    removed, freed = cache.prune(max_mb << 20, max_entries)
    console.err().print(f"removed {removed} kernel(s), {freed} bytes, from the kernel cache")
