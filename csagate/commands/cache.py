"""``csagate cache info|clear``: the per-user disk cache of compiled kernels.

Where it lives (``CSAGATE_CACHE_DIR`` overrides; else ``$XDG_CACHE_HOME/csagate`` or
``~/.cache/csagate``), whether it passes its safety rules (a private folder of the current
user), how many kernels it holds; ``clear`` removes them.
"""

from __future__ import annotations

import json

import click

from csagate import console


def _cache():
    from csagate.kernels.diskcache import DiskCache

    return DiskCache()


@click.group("cache", help="The disk cache of compiled kernels: `info` says where it is and "
             "what it holds, `clear` empties it. CSAGATE_CACHE_DIR moves it; "
             "CSAGATE_DISK_CACHE=0 turns it off.")
def command() -> None:
    pass


@command.command("info", help="Where the kernel cache lives, whether it is usable, its size.")
@click.option("--json", "as_json", is_flag=True, help="Print the facts as JSON on stdout.")
def info(as_json: bool) -> None:
    facts = _cache().info()
    if as_json:
        click.echo(json.dumps(facts, indent=2))
        return
    table = console.new_table("csagate kernel cache", ("fact", "value"))
    for name, value in (("folder", facts["root"]), ("usable", "yes" if facts["usable"] else
                                                     "no (see the warning above)"),
                        ("kernels", str(facts["entries"])),
                        ("bytes", str(facts["bytes"]))):
        table.add_row(name, value)
    console.print_table(table)


@command.command("clear", help="Remove every cached kernel (the next build compiles again).")
def clear() -> None:
    removed = _cache().clear()
    console.err().print(f"removed {removed} file(s) from the kernel cache")
