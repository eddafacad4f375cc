"""``csagate cases``: the drift check and the named cases of a contract family, in order.

Plain data: this imports no torch. A case name (the string ``--case`` takes; its prefix is the
config) is never split across lines; ``-v`` adds each case's ``why`` under its name.
"""

from __future__ import annotations

import click

from csagate import console
from csagate.commands import run as run_cmd
from csagate.commands.run import case_counts, ratio_option

COLUMNS = ("#", "case", "tokens", "rows", "kind")


@click.command("cases", help="List the drift check and the named gate cases (hardening and "
               "deterministic-mode cases after the upstream ones), in order; -v adds why each "
               "case exists.")
@ratio_option("The contract family, or all.")
@click.option("-v", "--verbose", is_flag=True, help="Show each case's reason (its `why`).")
def command(ratio: str, verbose: bool) -> None:
    for contract in run_cmd.contracts(ratio):  # a module attribute: the tests' seam
        table = console.new_table(f"csagate ratio={contract.ratio} gate: drift check + "
                                  f"{case_counts(contract)}", COLUMNS,
                                  marks=("#", "tokens", "rows", "kind"), names=("case",),
                                  right=("#", "tokens", "rows"), compact=True)
        for i, case in enumerate((contract.drift, *contract.all_cases)):
            table.add_row(str(i), case.name, str(case.tokens), str(case.rows), case.kind)
            if verbose:
                table.add_row("", console.prose(case.why, style="dim"), "", "", "")
        console.print_table(table)
