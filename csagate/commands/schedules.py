from __future__ import annotations

import click
from rich.table import Table

from csagate import console
from csagate.kernels.schedule import TABLE_ARCHES


@click.command("schedules", help="Print the ratio=128 dispatch tables and the kernels they select.")
@click.option("--arch", type=click.Choice(["all", *TABLE_ARCHES]), default="all",
              show_default=True, help="Whose tables: the H200's (sm_90a), the B200's (sm_100a, "
                                      "also sm_103a's), or both.")
def command(arch: str) -> None:
    from csagate.kernels import schedule as S

    out = console.out()
    out.print(f"bucket constants: small N <= {S.SMALL_NB_MAX}, large N >= {S.LARGE_NB_MIN}, "
              f"backward small N <= {S.BWD_SMALL_NB_MAX}")
    for table_arch in S.TABLE_ARCHES if arch == "all" else (arch,):
        for direction, tables, fields in (
            ("forward", S.FWD_TABLES[table_arch],
             ("vec", "tchunks", "thr_x", "2phase", "fastexp", "unroll", "prefetch", "oneexp")),
            ("backward", S.BWD_TABLES[table_arch],
             ("vec", "tchunks", "thr_x", "fastexp", "goreuse", "regwin")),
        ):
            table = Table(title=f"{table_arch} ratio=128 {direction} table")
            for col in ("config", "bucket", *fields, "tag", "smem B", "valid"):
                table.add_column(col, no_wrap=True)
            for coff, d in S.CONFIGS:
                for bucket, entries in tables.items():
                    sched = entries.get((coff, d))
                    if sched is None:
                        continue
                    smem = (S.fwd_smem_bytes(sched) if direction == "forward"
                            else S.bwd_smem_bytes(coff, sched))
                    problems = S.config_problems(coff, d, sched)
                    values = [getattr(sched, f) for f in sched.__dataclass_fields__]
                    table.add_row(S.config_name(coff, d), bucket,
                                  *(("T" if v else "F") if isinstance(v, bool) else str(v)
                                    for v in values),
                                  sched.tag, str(smem),
                                  "yes" if not problems else "; ".join(problems))
            console.print_table(table, out)
        n_fwd = len(S.selectable("fwd", table_arch))
        n_bwd = len(S.selectable("bwd", table_arch))
        out.print(f"{table_arch} selectable kernels: forward {n_fwd}, backward {n_bwd}, "
                  f"total {n_fwd + n_bwd}")
