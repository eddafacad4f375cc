"""docs/PERF_NOTES.md stays short, and every citation of one of its sections names a heading.

A citation is ``PERF_NOTES.md section 6.1``, ``PERF_NOTES section 10`` or ``PERF_NOTES.md
sections 3.1 and 4-8``, also when a line wrap falls inside it; a section exists when the file
has a heading numbered so (``## 4.`` or ``### 4.2``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTES = ROOT / "docs" / "PERF_NOTES.md"
MAX_LINES = 700
NUMBER = r"\d+(?:\.\d+)*"
CITE = re.compile(rf"\bPERF_NOTES(?:\.md)?,?\s+sections?\s+({NUMBER})"
                  rf"((?:\s*(?:,|-|and)\s*{NUMBER})*)")
HEADING = re.compile(rf"^#{{2,4}}\s+({NUMBER})\.?\s", re.M)
SKIP = {".git", ".venv", "node_modules", "__pycache__", "build", "dist"}


def _sources() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*")
                  if p.suffix in (".py", ".md") and p.is_file()
                  and p != Path(__file__).resolve()  # its own examples are not citations
                  and not SKIP.intersection(p.relative_to(ROOT).parts)
                  and not any(part.startswith(".") for part in p.relative_to(ROOT).parts))


def _citations(text: str):
    """(line, section number) for every number a citation names, ranges by their ends."""
    for m in CITE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        yield line, m.group(1)
        for number in re.findall(NUMBER, m.group(2)):
            yield line, number


def _all_citations():
    return [(f"{p.relative_to(ROOT)}:{line}", number)
            for p in _sources() for line, number in _citations(p.read_text(errors="replace"))]


def test_perf_notes_is_at_most_700_lines():
    n = len(NOTES.read_text().splitlines())
    assert n <= MAX_LINES, f"docs/PERF_NOTES.md has {n} lines; at most {MAX_LINES}"


def test_the_pattern_reads_the_forms_the_repo_uses():
    text = ("see PERF_NOTES.md section 6.1, and (PERF_NOTES section 10);\n"
            "PERF_NOTES.md sections 3.1 and 4-8; docs/PERF_NOTES.md\n    section 14.2 wraps")
    assert [n for _, n in _citations(text)] == ["6.1", "10", "3.1", "4", "8", "14.2"]
    assert not list(_citations("PERF_NOTES.md (\"Host cost\") and PERF_NOTES.md, sweep 2"))


def test_citations_are_found():
    """The scan sees the code's and the docs' citations (a test that could pass on none)."""
    found = _all_citations()
    assert len(found) >= 10
    assert any(where.startswith("kernels/") for where, _ in found)
    assert any(where.startswith("docs/KERNELS.md") for where, _ in found)


@pytest.mark.parametrize("where,number", _all_citations())
def test_every_cited_section_is_a_heading(where, number):
    have = set(HEADING.findall(NOTES.read_text()))
    assert number in have, f"{where}: docs/PERF_NOTES.md has no section {number}"
