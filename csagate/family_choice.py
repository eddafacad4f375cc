"""The contract families ``--ratio`` picks (``run``, ``cases``, ``compare``, ``fuzz``,
``bench``), and the ``--case`` names checked against them.

Plain data: this imports no torch. ``contracts`` is looked up as an attribute of this module by
every command, so the CLI tests can pick small contracts in one place.
"""

from __future__ import annotations

import difflib

import click

from csagate.gates.contracts import CONTRACTS  # plain data: no torch

RATIOS = (*(str(r) for r in CONTRACTS), "all")   # --ratio: one family, or every family


def contracts(ratio: str):
    """The contract families ``--ratio`` names (``all``: every family, in CONTRACTS' order)."""
    if ratio == "all":
        return tuple(CONTRACTS.values())
    return (CONTRACTS[int(ratio)],)


def ratio_option(help_: str):
    """``--ratio``, shared by ``run`` and ``cases``; eager, so ``--case`` names are checked
    against the family it picks."""
    return click.option("--ratio", type=click.Choice(RATIOS), default="128", show_default=True,
                        is_eager=True, help=help_)


def case_counts(contract) -> str:
    """``21 + 3 hardening + 4 deterministic cases``: a family's counts, from its data."""
    parts = [str(len(contract.cases))]
    parts += [f"{len(extra)} {word}" for extra, word in ((contract.hardening, "hardening"),
                                                         (contract.deterministic, "deterministic"))
              if extra]
    return " + ".join(parts) + " cases"


def unknown_case_message(name: str, valid: list[str], elsewhere: list[str]) -> str:
    """An unknown ``--case``: up to three close names (of this family, else of another one,
    with the ``--ratio`` that has it), never the whole list."""
    close = difflib.get_close_matches(name, valid, n=3)
    text = f"unknown case {name!r}."
    if name in elsewhere:
        return text + " It is a case of another family: add --ratio all (or its ratio)."
    if not close:
        close = difflib.get_close_matches(name, elsewhere, n=3)
        if close:
            return (text + f" Did you mean {', '.join(repr(c) for c in close)} (another "
                    "family: --ratio all)? See `csagate cases --ratio all`.")
        return text + " See `csagate cases` for the names."
    return text + f" Did you mean {', '.join(repr(c) for c in close)}? See `csagate cases`."


def check_case_names(names, ratio: str, param_hint: str | None = None) -> None:
    """A usage error (exit 2) naming the first of ``names`` that is no case of the families
    ``ratio`` picks."""
    chosen = contracts(ratio)
    valid = [c.name for k in chosen for c in k.all_cases]
    elsewhere = [c.name for k in contracts("all") if k not in chosen for c in k.all_cases]
    for name in names:
        if name not in valid:
            raise click.BadParameter(unknown_case_message(name, valid, elsewhere),
                                     param_hint=param_hint)
