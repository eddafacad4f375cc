"""``csagate schedules``: the ratio=128 dispatch tables and the kernels they can select."""

from __future__ import annotations

import dataclasses
import json

import click

from csagate import console
from csagate.exitcodes import ExitCode
from csagate.kernels.schedule import ARCH_TABLES, ARCHES


@click.command("schedules", help="Print the ratio=128 dispatch tables and the kernels they select.",
               epilog=ExitCode.listing(pass_="printed", usage="usage error"))
@click.option("--arch", type=click.Choice(["all", *ARCHES]), default="all",
              show_default=True, help="Whose tables: the H100's and H200's (sm_90a), the B200's "
                                      "(sm_100a; sm_103a, the B300, selects from them), or both.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the tables (every entry's schedule fields) as JSON on stdout.")
def command(arch: str, as_json: bool) -> None:
    from csagate.kernels import schedule as S

    if arch != "all" and ARCH_TABLES[arch] != arch:
        console.err().print(f"{arch} has no tables of its own: it selects from "
                            f"{ARCH_TABLES[arch]}'s")
        arch = ARCH_TABLES[arch]
    if as_json:
        click.echo(json.dumps(tables_json(S.TABLE_ARCHES if arch == "all" else (arch,)),
                              indent=2))
        return

    out = console.out()
    out.print(f"bucket constants: small N <= {S.SMALL_NB_MAX}, large N >= {S.LARGE_NB_MIN}, "
              f"backward small N <= {S.BWD_SMALL_NB_MAX}")
    for table_arch in S.TABLE_ARCHES if arch == "all" else (arch,):
        for direction in ("forward", "backward"):
            table = console.new_table(f"{table_arch} ratio=128 {direction} table",
                                      ("config", "bucket", "tag", "schedule", "smem B", "valid"),
                                      marks=("smem B",), right=("smem B",))
            for coff, d, bucket, sched, smem, problems in table_entries(table_arch, direction):
                table.add_row(S.config_name(coff, d), bucket, console.Ident(sched.tag),
                              console.schedule_text(sched), str(smem),
                              "yes" if not problems else "; ".join(problems))
            console.print_table(table, out)
        n_fwd = len(S.selectable("fwd", table_arch))
        n_bwd = len(S.selectable("bwd", table_arch))
        out.print(f"{table_arch} selectable kernels: forward {n_fwd}, backward {n_bwd}, "
                  f"total {n_fwd + n_bwd}")


def table_entries(arch: str, direction: str):
    """(coff, d, bucket, schedule, smem bytes, problems) of every entry of ``arch``'s
    ``direction`` ("forward" or "backward") table, config by config."""
    from csagate.kernels import schedule as S

    tables = (S.FWD_TABLES if direction == "forward" else S.BWD_TABLES)[arch]
    for coff, d in S.CONFIGS:
        for bucket, entries in tables.items():
            sched = entries.get((coff, d))
            if sched is None:
                continue
            smem = (S.fwd_smem_bytes(sched) if direction == "forward"
                    else S.bwd_smem_bytes(coff, sched))
            yield coff, d, bucket, sched, smem, tuple(S.config_problems(coff, d, sched))


def tables_json(arches) -> dict:
    """Every table entry of ``arches``: config, bucket, tag, schedule fields, smem, problems."""
    from csagate.kernels import schedule as S

    doc = {"schema": "csagate.schedules/1",
           "buckets": {"small_max": S.SMALL_NB_MAX, "large_min": S.LARGE_NB_MIN,
                       "bwd_small_max": S.BWD_SMALL_NB_MAX}, "tables": []}
    for arch in arches:
        for direction in ("forward", "backward"):
            for coff, d, bucket, sched, smem, problems in table_entries(arch, direction):
                fields = {k: (str(v) if isinstance(v, str) else v)
                          for k, v in dataclasses.asdict(sched).items()}
                doc["tables"].append({
                    "arch": arch, "direction": direction, "config": S.config_name(coff, d),
                    "bucket": bucket, "tag": sched.tag, "schedule": fields,
                    "smem_bytes": smem, "problems": list(problems)})
    return doc
