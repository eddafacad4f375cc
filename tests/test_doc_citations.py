"""Every citation of a docs/ section in the code, tests and docs names a section that exists.

A citation is ``CONTRACT.md section 4.2``, ``docs/KERNELS.md sections 1-2``, ``CONTRACT section
3.1`` or ``CONTRACT.md 2.5``; a section exists when the cited document has a heading numbered so
(``## 4.`` or ``### 4.2``; ``5.4a`` included).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = {"CONTRACT": "docs/CONTRACT.md", "KERNELS": "docs/KERNELS.md",
        "PERF_NOTES": "docs/PERF_NOTES.md", "MUTANTS": "docs/MUTANTS.md"}
CITE = re.compile(r"\b(CONTRACT|KERNELS|PERF_NOTES|MUTANTS)(?:\.md)?,?\s+(?:sections?\s+)?"
                  r"(\d+(?:\.\d+)?[a-z]?)(?:\s*(?:-|and)\s*(\d+(?:\.\d+)?[a-z]?))?")
HEADING = re.compile(r"^#{2,4}\s+(\d+(?:\.\d+)*[a-z]?)\.?\s", re.M)
SOURCES = ("csagate", "kernels", "gates", "reference", "perf", "mutants", "tests", "docs")


def _sections(doc: str) -> set[str]:
    path = ROOT / DOCS[doc]
    return set(HEADING.findall(path.read_text())) if path.exists() else set()


def _citations():
    for top in SOURCES:
        for path in sorted((ROOT / top).rglob("*")):
            if path.suffix not in (".py", ".md") or "__pycache__" in path.parts:
                continue
            for n, line in enumerate(path.read_text().splitlines(), start=1):
                for m in CITE.finditer(line):
                    yield f"{path.relative_to(ROOT)}:{n}", m.group(1), m.group(2), m.group(3)
    for n, line in enumerate((ROOT / "README.md").read_text().splitlines(), start=1):
        for m in CITE.finditer(line):
            yield f"README.md:{n}", m.group(1), m.group(2), m.group(3)


def test_citations_are_found():
    """The pattern sees the citations the code makes (a test that could pass on no input)."""
    found = list(_citations())
    assert len(found) >= 20
    assert any(doc == "CONTRACT" for _, doc, _, _ in found)


@pytest.mark.parametrize("where,doc,first,last", list(_citations()),
                         ids=lambda v: v if isinstance(v, str) else None)
def test_every_cited_section_exists(where, doc, first, last):
    have = _sections(doc)
    for number in (first, last):
        if number is not None:
            assert number in have, f"{where}: {DOCS[doc]} has no section {number}"
