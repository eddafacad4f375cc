"""The docs quote the gate's counts; the code (the contracts' case lists) owns them. Every
"N cases" and every "N/N" headline in README.md and docs/CONTRACT.md must match the code, and
README's sample verdict must list the real cases in order with the real headline."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from csagate.gates.contracts import CONTRACT_VERSION, R4, R128

REPO = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "docs/CONTRACT.md")

# every "N cases" the docs may state: a case list of the code, or a part of one
CASE_COUNTS = {len(R128.cases), len(R128.all_cases), len(R4.cases), len(R4.all_cases),
               len(R128.hardening), len(R128.deterministic_cases), len(R4.deterministic_cases)}
CASE_COUNT = re.compile(r"(?<![=\w.])(\d+) (?:named |upstream |hardening |deterministic )?cases\b")
HEADLINE = re.compile(r"GATE PASS (\d+)/(\d+)(?: \+ (\d+)/(\d+) hardening)?"
                      r"(?: \+ (\d+)/(\d+)\s+deterministic)?")


def _text(name: str) -> str:
    return " ".join((REPO / name).read_text().split())   # a phrase may wrap


@pytest.mark.parametrize("name", DOCS)
def test_every_stated_case_count_is_the_codes(name):
    text = _text(name)
    found = [int(n) for n in CASE_COUNT.findall(text)]
    assert found, f"{name} states no case count"
    for n in found:
        assert n in CASE_COUNTS, f"{name}: '{n} cases' matches no case list of the code"


@pytest.mark.parametrize("name", DOCS)
def test_every_headline_is_the_codes(name):
    text = _text(name)
    headlines = HEADLINE.findall(text)
    assert headlines, f"{name} quotes no headline"
    for passed, total, hp, ht, dp, dt in headlines:
        assert passed == total and int(total) in (len(R128.cases), len(R4.cases))
        family = R128 if int(total) == len(R128.cases) else R4
        if ht:
            assert hp == ht and int(ht) == len(family.hardening)
        if dt:
            assert dp == dt and int(dt) == len(family.deterministic_cases)


def test_the_contract_states_its_version():
    assert f"Contract version {CONTRACT_VERSION} " in _text("docs/CONTRACT.md")


def test_readme_sample_verdict_is_the_current_case_list():
    text = (REPO / "README.md").read_text()
    block = text[text.index("```text\ncsagate ratio=128 gate"):]
    block = block[:block.index("```", 8)]
    rows = [line.split() for line in block.splitlines() if line.split()
            and line.split()[0].isdigit()]
    assert [r[1] for r in rows] == [c.name for c in (R128.drift, *R128.all_cases)]
    assert [r[0] for r in rows] == [str(i) for i in range(len(rows))]
    n, h, d = len(R128.cases), len(R128.hardening), len(R128.deterministic_cases)
    assert f"GATE PASS {n}/{n} + {h}/{h} hardening + {d}/{d} deterministic" in block
    assert all(len(line) <= 80 for line in block.splitlines())


SELF_TEST = re.compile(r"self-test (\d+)/(\d+)")


@pytest.mark.parametrize("name", DOCS)
def test_every_quoted_self_test_count_is_the_codes(name):
    from csagate.gates.selftest import CHECKS

    for passed, total in SELF_TEST.findall(_text(name)):
        assert passed == total and int(total) == len(CHECKS), f"{name}: self-test {total}"
