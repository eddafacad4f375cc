from __future__ import annotations

import click
from rich.table import Table

from csagate import console


@click.command("schedules", help="Print the ratio=128 dispatch tables and the kernels they select.")
def command() -> None:
    from kernels import schedule as S

    out = console.out()
    out.print(f"bucket constants: small N <= {S.SMALL_NB_MAX}, large N >= {S.LARGE_NB_MIN}, "
              f"backward small N <= {S.BWD_SMALL_NB_MAX}")
    for direction, tables, fields in (
        ("forward", (("small", S.FWD_SMALL), ("default", S.FWD_DEFAULT), ("large", S.FWD_LARGE)),
         ("vec", "tchunks", "thr_x", "2phase", "fastexp")),
        ("backward", (("small", S.BWD_SMALL), ("default", S.BWD_DEFAULT)),
         ("vec", "tchunks", "thr_x", "fastexp", "goreuse")),
    ):
        table = Table(title=f"ratio=128 {direction} table")
        for col in ("config", "bucket", *fields, "smem B", "valid"):
            table.add_column(col, no_wrap=True)
        for coff, d in S.CONFIGS:
            for bucket, entries in tables:
                sched = entries.get((coff, d))
                if sched is None:
                    continue
                smem = (S.fwd_smem_bytes(sched) if direction == "forward"
                        else S.bwd_smem_bytes(coff, sched))
                problems = S.config_problems(coff, d, sched)
                table.add_row(S.config_name(coff, d), bucket,
                              *(("T" if v else "F") if isinstance(v, bool) else str(v)
                                for v in sched.astuple()), str(smem),
                              "yes" if not problems else "; ".join(problems))
        console.print_table(table, out)
    n_fwd, n_bwd = len(S.selectable("fwd")), len(S.selectable("bwd"))
    out.print(f"selectable kernels: forward {n_fwd}, backward {n_bwd}, total {n_fwd + n_bwd}")
