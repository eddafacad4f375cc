"""``csagate impls``: the implementations the gate can judge here, and why the rest cannot."""

from __future__ import annotations

import click

from csagate import console


def _device():
    import torch

    if torch.cuda.is_available():
        return torch.device("cuda", 0)
    return torch.device("cpu")


def rows() -> list[tuple[str, str, str, str, str]]:
    """(name, origin, directions, envelope, status) per implementation found by name."""
    from csagate.gates.implementation import (
        ImplError,
        has_backward,
        has_dispatch,
        known,
        load,
        unavailable,
    )

    device = _device()
    found = []
    for name, entry in known().items():
        try:
            impl = load(entry)
        except ImplError as exc:
            found.append((name, entry.origin, "-", "-", f"cannot load: {exc}"))
            continue
        parts = ["fwd+bwd" if has_backward(impl) else "fwd only"]
        if getattr(impl, "deterministic", False):
            parts.append("det")
        if has_dispatch(impl):
            parts.append("hooks")
        try:
            why = unavailable(impl, device)
        except Exception as exc:   # an adapter's own check that raised: say so, go on
            why = f"its availability check raised {console.one_line(exc)}"
        found.append((name, entry.origin, " ".join(parts), impl.supports.text(),
                       "available" if why is None else why))
    return found


@click.command("impls", help="List the implementations `csagate run --impl` and `csagate "
               "compare` can judge: the built-ins, the packages registered under the entry-point "
               "group csagate.implementations, and for each whether it can run here (or why "
               "not: a missing package, the compute capability). A local adapter is passed as "
               "--impl path/to/file.py:NAME or module:NAME.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the implementations as JSON on stdout.")
def command(as_json: bool) -> None:
    if as_json:
        import json

        click.echo(json.dumps({"schema": "csagate.impls/1", "impls": [
            {"name": name, "from": origin, "provides": provides, "envelope": envelope,
             "available": why == "available", "why": None if why == "available" else why}
            for name, origin, provides, envelope, why in rows()]}, indent=2))
        return
    out = console.out()
    table = console.new_table("implementations", ("name", "from", "provides", "envelope",
                                                  "here"), marks=("name", "from", "here"),
                              compact=True)
    found = rows()
    for name, origin, provides, envelope, why in found:
        table.add_row(name, origin, provides, console.prose(envelope),
                      "yes" if why == "available" else "no")
    console.print_table(table, out)
    for name, _, _, _, why in found:   # the reasons as wrapped lines, never folded mid-word
        if why != "available":
            console.print_wrapped(out, f"{name}: {why}", indent="  ", hang="    ")
