"""README says what the code is: the contract version, the package version, the refs its Action
examples use, and every environment variable csagate reads (and none it does not)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from csagate.gates.contracts import CONTRACT_VERSION
from csagate.kernels.env import KNOWN

from csagate import __version__

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
FLAT = " ".join(README.split())


def test_the_contract_and_package_versions_are_the_codes():
    stated = set(re.findall(r"contract version (\d+)", FLAT))
    assert stated == {CONTRACT_VERSION}, stated
    versions = set(re.findall(r"\(version (\d+\.\d+\.\d+)\)", FLAT))
    assert versions == {__version__}, versions


def _refs(text: str) -> set[str]:
    return set(re.findall(r"uses: OWNER/csagate@([\w.\-]+)", text))


def test_the_action_refs_exist():
    """Every ``OWNER/csagate@REF`` in README and the example workflow is main or a tag of
    this repository (a tag that does not exist fails every job that copies the example)."""
    tags = set(subprocess.run(["git", "tag", "--list"], cwd=ROOT, capture_output=True,
                              text=True).stdout.split())
    example = (ROOT / "docs" / "examples" / "csagate-gate.yml").read_text()
    refs = _refs(README) | _refs(example)
    assert refs, "no Action example found"
    assert refs <= {"main"} | tags, refs - ({"main"} | tags)


def _read_by_the_code() -> set[str]:
    """The variables csagate's own modules read: every ``os.environ`` lookup of a literal
    name, and the variables kernels/env.py parses."""
    found = set(KNOWN)
    for folder in ("csagate", "kernels", "gates", "perf", "reference"):
        for path in (ROOT / folder).rglob("*.py"):
            text = path.read_text()
            found |= set(re.findall(r"environ(?:\.get)?\(?\[?[\"']([A-Z_]+)[\"']", text))
            found |= set(re.findall(r"getenv\([\"']([A-Z_]+)[\"']", text))
    # set for the compiler by kernels/_dsl.py, not read from the user; CSAGATE_PTX_DUMP_PID
    # marks the process that owns the dump folder
    return found - {"CUTE_DSL_KEEP", "CUTE_DSL_DUMP_DIR", "CSAGATE_PTX_DUMP_PID"}


def test_every_variable_the_code_reads_is_listed_and_none_else():
    section = README[README.index("### Environment variables"):]
    section = section[:section.index("\n## ", 1) if "\n## " in section else len(section)]
    listed = set(re.findall(r"^\| `([A-Z_]+)` \|", section, re.M))
    read = _read_by_the_code() | {"COLUMNS", "NO_COLOR"}   # read by rich and click
    assert listed == read, (f"listed, not read: {sorted(listed - read)}; read, not listed: "
                            f"{sorted(read - listed)}")
