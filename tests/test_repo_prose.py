"""The repository's prose speaks of the project only: no tracked text file says how the work on
it was organized (work periods, machine budgets, tracker numbers, who ran what).

Each check is one narrow pattern, so a legitimate use (a pytest fixture's scope, "issue
slots" in a profile) does not match it. Every tracked text file must pass every check.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SUFFIXES = (".md", ".py", ".toml")
NAMES = ("Makefile", ".ci/run")
# The files whose whole purpose is prose: they must pass every check.
PROSE = ("CHANGELOG.md", "docs/KERNELS.md", "docs/PERF_NOTES.md", "docs/MUTANTS.md")

CHECKS = {
    "work-period": re.compile(
        r"\b(first|second|third|fourth|fifth|sixth|seventh|this|that|previous|earlier|later"
        r"|next|last|one|same)\s+(?:#\s*)?s[e]ssion\b", re.IGNORECASE),  # across a comment wrap
    "machine-budget": re.compile(r"\bdevice[- ]t[i]me\b", re.IGNORECASE),
    "tracker-number": re.compile(r"\bissues?\s+\d+(\.\d+)?\b(?!\s*%)", re.IGNORECASE),
    "work-step": re.compile(r"\bstop\s+\d+\b", re.IGNORECASE),
    "who-ran-it": re.compile(r"\bthe\s+lead\b", re.IGNORECASE),
}

def tracked_text_files() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"not a git checkout ({exc.__class__.__name__}): no tracked-file list")
    this = Path(__file__).resolve().relative_to(ROOT).as_posix()
    return [f for f in out.splitlines()
            if (f.endswith(SUFFIXES) or f in NAMES) and f != this and (ROOT / f).is_file()]


def offenders(check: str, files: list[str]) -> list[str]:
    pattern = CHECKS[check]
    hits = []
    for name in files:
        text = (ROOT / name).read_text(encoding="utf-8", errors="replace")
        for match in pattern.finditer(text):
            number = text.count("\n", 0, match.start()) + 1
            hits.append(f"{name}:{number}: {' '.join(match.group(0).split())!r}")
    return hits


# The examples' words are joined at run time, so the file that holds the checks passes its own.
PERIOD, BUDGET = "ses" + "sion", "device" + " time"


def test_the_patterns_match_what_they_name_and_not_its_neighbours():
    assert CHECKS["work-period"].search(f"measured in the fifth {PERIOD}")
    assert not CHECKS["work-period"].search(f'@pytest.fixture(scope="{PERIOD}")')
    assert not CHECKS["work-period"].search(f"before anything in the {PERIOD} imports cutlass")
    assert CHECKS["work-period"].search(f"kept; fifth\n    # {PERIOD} (->_as): APE")
    assert CHECKS["machine-budget"].search(f"the {BUDGET} was spent")
    assert CHECKS["tracker-number"].search("(issue 12.4)")
    assert not CHECKS["tracker-number"].search("issue slots 33% busy")
    assert not CHECKS["tracker-number"].search("issue 33% of the cycles")
    assert CHECKS["work-step"].search("stop 3 of the plan")
    assert CHECKS["who-ran-it"].search("the lead sweeps on the H200")


def test_the_file_list_holds_the_docs():
    files = tracked_text_files()
    assert set(PROSE) <= set(files), sorted(set(PROSE) - set(files))


@pytest.mark.parametrize("check", sorted(CHECKS))
def test_docs_and_changelog_speak_of_the_project(check):
    hits = offenders(check, [f for f in tracked_text_files() if f in PROSE])
    assert not hits, "\n".join(hits)


@pytest.mark.parametrize("check", sorted(CHECKS))
def test_no_tracked_file_speaks_of_how_the_work_was_organized(check):
    hits = offenders(check, tracked_text_files())
    assert not hits, "\n".join(hits)
