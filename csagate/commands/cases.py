"""``csagate cases``: the drift check and the named cases of a contract family, in order."""

from __future__ import annotations

import click

from csagate import console
from csagate.commands.run import RATIOS


@click.command("cases", help="List the drift check and the named gate cases (hardening and "
               "deterministic-mode cases after the upstream ones), in order.")
@click.option("--ratio", type=click.Choice(RATIOS), default="128",
              show_default=True, help="The contract family: 128, 2, 4, 8, 16, 32, or all.")
def command(ratio: str) -> None:
    from csagate.commands.run import contracts

    for contract in contracts(ratio):
        hard = f" + {len(contract.hardening)} hardening" if contract.hardening else ""
        if contract.deterministic:
            hard += f" + {len(contract.deterministic)} deterministic"
        cols = ("#", "case", "config", "tokens", "rows", "kind")
        table = console.new_table(f"csagate ratio={contract.ratio} gate: drift check + "
                                  f"{len(contract.cases)} named cases{hard}", cols,
                                  marks=("#", "tokens", "rows"), right=("#", "tokens", "rows"))
        for i, case in enumerate((contract.drift, *contract.all_cases)):
            config = case.config if case.ratio == 128 else f"r{case.ratio} {case.config}"
            table.add_row(str(i), case.name, config, str(case.tokens), str(case.rows),
                          case.kind)
        console.print_table(table)
