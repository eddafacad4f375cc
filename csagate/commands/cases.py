from __future__ import annotations

import click

from csagate import console


@click.command("cases", help="List the drift check and the 21 named cases, in order.")
@click.option("--ratio", type=click.Choice(["128"]), default="128", show_default=True,
              help="The contract family (the gate is defined for ratio=128).")
def command(ratio: str) -> None:
    from csagate.gates.cases import CASES, DRIFT

    cols = ("#", "case", "config", "tokens", "rows", "kind")
    table = console.new_table(f"csagate ratio={ratio} gate: drift check + {len(CASES)} named "
                              "cases", cols, marks=("#", "tokens", "rows"),
                              right=("#", "tokens", "rows"))
    for i, case in enumerate((DRIFT, *CASES)):
        config = case.config if case.ratio == 128 else f"r{case.ratio} {case.config}"
        table.add_row(str(i), case.name, config, str(case.tokens), str(case.rows), case.kind)
    console.print_table(table)
