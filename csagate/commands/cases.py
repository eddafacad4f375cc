"""``csagate cases``: the drift check and the named cases of a contract family, in order.

Plain data: this imports no torch. A case name (the string ``--case`` takes; its prefix is the
config) is never split across lines; ``-v`` adds each case's ``why`` under its name.
"""

from __future__ import annotations

import click

from csagate import console, options
from csagate.exitcodes import ExitCode

COLUMNS = ("#", "case", "tokens", "rows", "kind")


def why_text(case) -> str:
    """A case's ``why``; a ratio=128 forward-bucket note names the form each arch's table
    has there (the sm_90a large bucket of c1d128 is not the sm_100a's two-phase)."""
    why = case.why
    if "(two-phase)" not in why:
        return why
    from csagate.kernels import registry
    from csagate.kernels.schedule import TABLE_ARCHES

    bucket = next((b for b in ("large", "small", "default") if f"{b} bucket" in why), None)
    forms = []
    for arch in TABLE_ARCHES:
        sched = registry.tables(case.ratio, "fwd", arch).get(bucket, {}).get((case.coff, case.d))
        if sched is not None:
            forms.append(f"{str(sched.form).replace('twophase', 'two-phase')} on {arch}")
    return why.replace("(two-phase)", f"({', '.join(forms)})" if forms else "")


def case_json(case) -> dict:
    return {"name": case.name, "ratio": case.ratio, "coff": case.coff, "d": case.d,
            "tokens": case.tokens, "rows": case.rows, "kind": case.kind,
            "why": why_text(case)}


@click.command("cases", help="List the drift check and the named gate cases (hardening and "
               "deterministic-mode cases after the upstream ones), in order; -v adds why each "
               "case exists.",
               epilog=ExitCode.listing(pass_="listed", usage="usage error"))
@options.ratio_option("128", "The contract family, or all.")
@click.option("-v", "--verbose", is_flag=True, help="Show each case's reason (its `why`).")
@options.json_flag("Print the families and their cases (with each why) as JSON on stdout.")
def command(ratio: str, verbose: bool, as_json: bool) -> None:
    if as_json:
        import json

        click.echo(json.dumps({"schema": "csagate.cases/1", "families": [
            {"ratio": k.ratio, "drift": case_json(k.drift),
             "cases": [case_json(c) for c in k.cases],
             "hardening": [case_json(c) for c in k.hardening],
             "deterministic": [case_json(c) for c in k.deterministic_cases]}
            for k in options.contracts(ratio)]}, indent=2))
        return
    for contract in options.contracts(ratio):  # a module attribute: the tests' seam
        table = console.new_table(f"csagate ratio={contract.ratio} gate: drift check + "
                                  f"{options.case_counts(contract)}", COLUMNS,
                                  marks=("#", "tokens", "rows", "kind"), names=("case",),
                                  right=("#", "tokens", "rows"), compact=True)
        for i, case in enumerate((contract.drift, *contract.all_cases)):
            table.add_row(str(i), case.name, str(case.tokens), str(case.rows), case.kind)
            if verbose:
                table.add_row("", console.prose(why_text(case), style="dim"), "", "", "")
        console.print_table(table)
