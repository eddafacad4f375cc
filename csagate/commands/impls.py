"""``csagate impls``: the implementations the gate can judge here, and why the rest cannot;
``--impl VALUE`` checks one adapter (it loads, its ``supports`` is well-formed, its methods take
the arguments the gate passes) in one line: exit 0, or 2 with the reason."""

from __future__ import annotations

import click

from csagate import console
from csagate.exitcodes import ExitCode
from csagate.gates.errors import one_line


def _device():
    import torch

    if torch.cuda.is_available():
        return torch.device("cuda", 0)
    return torch.device("cpu")


def rows() -> list[tuple[str, str, str, str, str]]:
    """(name, origin, directions, envelope, status) per implementation found by name."""
    from csagate.gates.implementation import known, load
    from csagate.gates.plugin import ImplError

    device = _device()
    found = []
    for name, entry in known().items():
        try:
            impl = load(entry)
        except ImplError as exc:
            found.append((name, entry.origin, "-", "-", f"cannot load: {exc}"))
            continue
        found.append((name, entry.origin, _provides(impl), impl.supports.text(),
                      _here(impl, device)))
    return found


def _provides(impl) -> str:
    """``fwd+bwd det hooks``: the directions, the deterministic backward, the dispatch hooks;
    ``=ref out`` for the outputs it claims bitwise the fp32 reference."""
    from csagate.gates.plugin import applies_of, has_backward, has_dispatch

    parts = ["fwd+bwd" if has_backward(impl) else "fwd only"]
    if getattr(impl, "deterministic", False):
        parts.append("det")
    if has_dispatch(impl):
        parts.append("hooks")
    claimed = applies_of(impl).bitwise
    if claimed:
        parts.append("=ref " + "/".join(claimed))
    return " ".join(parts)


def _here(impl, device) -> str:
    """"available", or why ``impl`` cannot run on ``device`` (its own check raising: said)."""
    from csagate.gates.plugin import ImplError, unavailable

    try:
        why = unavailable(impl, device)
    except ImplError as exc:
        why = str(exc)
    except Exception as exc:   # an adapter's own check that raised: say so, go on
        why = f"its availability check raised {one_line(exc)}"
    return "available" if why is None else why


def check(value: str) -> str:
    """One line on the adapter ``value`` names when it keeps the protocol; exit 2 with the
    reason when it does not load or does not keep it."""
    from csagate.exitcodes import ExitCode
    from csagate.gates.implementation import load, resolve
    from csagate.gates.plugin import ImplError, conformance

    try:
        impl = load(resolve(value))
    except ImplError as exc:
        console.abort(str(exc), ExitCode.USAGE)
    problem = conformance(impl)
    if problem:
        console.abort(f"--impl {value}: {problem}", ExitCode.USAGE)
    here = _here(impl, _device())
    return (f"{value}: ok: {impl.name!r}, {_provides(impl)}, {impl.supports.text()}; here: "
            + ("yes" if here == "available" else f"no ({here})"))


@click.command("impls", help="List the implementations `csagate run --impl` and `csagate "
               "compare` can judge: the built-ins, the packages registered under the entry-point "
               "group csagate.implementations, and for each whether it can run here (or why "
               "not: a missing package, the compute capability). 'provides': fwd+bwd or fwd "
               "only, det (a deterministic backward), hooks (the dispatch hooks), =ref OUTPUTS "
               "(claimed bitwise the fp32 reference, which the gate checks). A local adapter "
               "is passed as --impl path/to/file.py:NAME or module:NAME.",
               epilog=ExitCode.listing(pass_="listed (--impl: the adapter keeps the protocol)",
                                       usage="usage error (--impl: it does not load or keep "
                                             "the protocol)"))
@click.option("--json", "as_json", is_flag=True,
              help="Print the implementations as JSON on stdout.")
@click.option("--impl", "impl", metavar="VALUE",
              help="Check one adapter instead (NAME, path/to/file.py:NAME or module:NAME): it "
                   "loads, its supports is well-formed, forward and its optional hooks take the "
                   "arguments the gate passes. One line; exit 0, or 2 with the reason.")
def command(as_json: bool, impl: str | None) -> None:
    if impl is not None:
        if as_json:
            raise click.UsageError("--impl checks one adapter: leave out --json")
        click.echo(check(impl))
        return
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
