"""The gate's known-answer self-tests (``csagate.gates.selftest``): all pass on this machine,
fast; each one fails when the machinery it checks is sabotaged (planted here by monkeypatching
the module the verdict calls through); a failed self-test stops ``run``, ``fuzz``, ``compare``
and the pytest plugin with exit 3 (or a failed test) naming it, before anything is judged."""

from __future__ import annotations

import json
import math

import pytest
import torch
from adapter_source import reference_adapter
from click.testing import CliRunner
from csagate.gates import casefile, comparators, fuzz, limits, runner, selftest
from csagate.gates import plugin as plugin_mod

from csagate.cli import cli
from csagate.pytest_plugin import check


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    """Every test starts with no self-test result remembered in the process."""
    monkeypatch.setattr(selftest, "_DONE", {})


def names_failing(device="cpu") -> set[str]:
    return {c.name for c in selftest.run(device).failed}


def test_every_self_test_passes_here_and_fast():
    first = selftest.run("cpu")
    assert first.ok, first.message()
    assert len(first.checks) == len(selftest.CHECKS) >= 40
    again = selftest.run("cpu")
    assert again.seconds < 1.0, again.seconds          # warm: well under a second
    assert again.summary == f"{len(selftest.CHECKS)}/{len(selftest.CHECKS)}"


def test_names_are_unique_and_say_what_they_check():
    names = [name for name, _ in selftest.CHECKS]
    assert len(names) == len(set(names))
    assert all(":" in name for name in names)


def _values_not_bits(fused, ref, *, mask=None):
    """``bitwise`` comparing values: -0 == +0 again (a planted fault of the gate's own logic)."""
    judged = torch.ones(fused.shape, dtype=torch.bool) if mask is None else mask
    differs = (fused != ref) & ~(torch.isnan(fused) & torch.isnan(ref)) & judged
    flat = comparators._flat_index(differs)
    return comparators.Bitwise(
        numel=int(judged.sum()), n_diff=int(differs.sum()), n_zero_sign=0,
        first_index=comparators._unravel(flat, fused.shape), fused_bits=None, ref_bits=None,
        fused_value=None, ref_value=None, ok=not bool(differs.any()))


def _allowance_one_over_alpha(numel, rate=limits.COUNT_FRACTION, alpha=limits.FALSE_ALARM):
    """``count_allowance`` with 1/alpha in place of ln(1/alpha): every element allowed."""
    return numel


# (what is sabotaged, the attribute, its replacement, a self-test that must now fail)
SABOTAGE = [
    ("bitwise compares values", comparators, "bitwise", _values_not_bits,
     "bitwise: -0 is not +0"),
    ("the allowance is every element", limits, "count_allowance", _allowance_one_over_alpha,
     "count allowance: sound and tight against the exact binomial tail"),
    ("tolerance ignores its bound", comparators, "tolerance",
     lambda fused, ref, *, bound, allowed, mask=None: comparators.Tolerance(
         fused.numel(), 0, allowed, 0.0, bound, None, None, None, True),
     "tolerance: at the bound passes, one ulp beyond fails"),
    ("zeros never fail", comparators, "exact_zeros",
     lambda t, mask: comparators.Zeros(int(mask.sum()), 0, None, None, True),
     "zeros: +0 and -0 pass; 2^-100 and NaN in a masked slot fail"),
    ("a judged check reported inconclusive", runner, "_gate",
     lambda gate, tensor, check, status=None, reason=None: runner.GateResult(
         gate, tensor, runner.INCONCLUSIVE, {}, "inconclusive"),
     "records: a check is inconclusive on empty input only"),
    ("the seam drops the bitwise claim", plugin_mod, "applies_of",
     lambda impl, real=plugin_mod.applies_of: __import__("dataclasses").replace(
         real(impl), bitwise=()),
     "seam: a claimed bitwise output is held to its claim"),
    ("case files lose pad_rows", casefile, "case_from_dict",
     lambda doc, real=casefile.case_from_dict: real(
         {k: v for k, v in doc.items() if k != "pad_rows"}),
     "case file: written and read back equal, field by field"),
    ("the shrinker takes a passing candidate", fuzz, "signature",
     lambda result: frozenset(g.gate for g in result.gates),
     "shrinker: a candidate that passes is never taken; one that fails is"),
    ("NaN prefill becomes zero prefill", runner, "_fill", lambda run: 0.0,
     "seam: a never-consumed slot left unwritten fails zeros and G1"),
]


@pytest.mark.parametrize("what, module, attr, fake, expected", SABOTAGE,
                         ids=[s[0] for s in SABOTAGE])
def test_a_sabotaged_machinery_fails_its_self_test(monkeypatch, what, module, attr, fake,
                                                    expected):
    assert expected in {name for name, _ in selftest.CHECKS}
    monkeypatch.setattr(module, attr, fake)
    if what == "the shrinker takes a passing candidate":   # a status test that lets it through
        monkeypatch.setattr(fuzz, "fails", lambda result: True)
    assert expected in names_failing(), what


def test_the_second_derivation_catches_a_shifted_ape_row(monkeypatch):
    """The oracle and the fp32 reference share their geometry: an APE row off by one there
    is invisible to G3, and the scalar derivation sees it."""
    from csagate.reference import compressor

    real = compressor._slots

    def shifted(cu, cuc, n_rows, ratio, coff):
        s = real(cu, cuc, n_rows, ratio, coff)
        return compressor._Slots(s.token, s.valid, s.half, (s.ape_row + 1) % ratio)

    monkeypatch.setattr(compressor, "_slots", shifted)
    assert "oracle: the fp64 oracle agrees with its scalar derivation" in names_failing()


def test_binomial_tail_is_the_exact_tail():
    # small n: the sum written out with exact binomial coefficients
    n, p = 12, 0.3
    for k in range(n + 2):
        exact = sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(k, n + 1))
        assert selftest.binomial_tail(n, p, k) == pytest.approx(exact, rel=1e-12, abs=1e-300)


def test_ensure_remembers_a_failure_and_raises_every_time(monkeypatch):
    monkeypatch.setattr(limits, "count_allowance", _allowance_one_over_alpha)
    for _ in range(2):
        with pytest.raises(selftest.SelfTestFailed) as info:
            selftest.ensure("cpu")
    text = str(info.value)
    assert text.startswith("self-test failed on cpu: ") and "no verdict" in text
    assert "\n" not in text and "(also failed: " in text
    failed = {c.name for c in info.value.tests.failed}
    assert "count allowance: sound and tight against the exact binomial tail" in failed


# --- a failed self-test stops every command, before anything is judged --------------------------

ADAPTER = reference_adapter("Supports(ratios=(4,))")


@pytest.fixture
def adapter(tmp_path):
    path = tmp_path / "adapter.py"
    path.write_text(ADAPTER)
    return f"{path}:Reference"


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture
def broken(monkeypatch):
    monkeypatch.setattr(comparators, "bitwise", _values_not_bits)


def _refused(result, report=None):
    assert result.exit_code == 3, result.output
    text = " ".join(result.stderr.split())
    assert "self-test failed on cpu: bitwise: -0 is not +0" in text, text
    assert "GATE" not in result.stdout and "FUZZ" not in result.stdout
    if report is not None:
        doc = json.loads(report.read_text())
        assert doc["verdict"] == "COULD NOT EVALUATE" and "self-test failed" in doc["reason"]


def test_run_refuses_a_verdict(broken, adapter, tmp_path):
    report = tmp_path / "v.json"
    _refused(invoke("run", "--impl", adapter, "--device", "cpu", "--ratio", "4", "--case",
                    "r4/c1d128/overflow", "--json", report), report)


def test_fuzz_refuses_a_verdict(broken, adapter, tmp_path):
    report = tmp_path / "f.json"
    _refused(invoke("fuzz", "--impl", adapter, "--device", "cpu", "--trials", 1, "--json",
                    report), report)


def test_compare_refuses(broken, adapter):
    _refused(invoke("compare", "--impl", adapter, "--impl", "decode", "--device", "cpu",
                    "--ratio", "4", "--case", "r4/c1d128/overflow"))


def test_the_pytest_plugin_fails_the_test(broken, adapter):
    with pytest.raises(pytest.fail.Exception, match="self-test failed on cpu"):
        check(adapter, ratio=4, cases=["r4/c1d128/overflow"])


def test_a_passing_run_reports_the_self_test_in_its_verdict_and_json(adapter, tmp_path):
    report = tmp_path / "v.json"
    result = invoke("run", "--impl", adapter, "--device", "cpu", "--ratio", "4", "--case",
                    "r4/c1d128/overflow", "--json", report)
    assert result.exit_code == 0, result.output
    total = len(selftest.CHECKS)
    assert f"self-test {total}/{total}" in result.stdout
    doc = json.loads(report.read_text())
    assert doc["selftest"]["passed"] == doc["selftest"]["total"] == total
    assert doc["selftest"]["device"] == "cpu" and doc["selftest"]["failed"] == []
