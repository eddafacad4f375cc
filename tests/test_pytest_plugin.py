"""The pytest plugin (``csagate.pytest_plugin``, entry point ``pytest11``): a user's test file
asks for the ``csagate_contract`` fixture and judges its adapter on the CPU. A correct adapter
passes (the fixture returns the verdict); a planted fault fails the test with the failing
gate, case by case, and the shrunk fuzz failures; a bad argument fails in one line; an
implementation that cannot run here is skipped with the reason.

The named case is r4/c1d128/overflow (a 4096-element output: half a second on the CPU) and
the fuzz budgets are three trials of seed 12, whose packs are a few tokens. What the plugin
imports when called is imported here first: pytester's in-process runs drop the modules a run
imported, and torch does not survive being imported twice in one process.
"""

from __future__ import annotations

from importlib import metadata

import csagate.gates.builtin_impls  # noqa: F401
import csagate.gates.fuzz  # noqa: F401
import csagate.gates.runner  # noqa: F401
import csagate.reference  # noqa: F401
import pytest
import torch
from adapter_source import reference_adapter
from gate_backends import FailingBuildImpl, RefImpl

import csagate.options  # noqa: F401
from csagate.pytest_plugin import check

pytest_plugins = ["pytester"]

ADAPTERS = reference_adapter('Supports(ratios=(4,))') + '''

class NanToZero(Reference):
    """out's NaNs (the overflow cases) written as zeros."""
    name = "nan-to-zero"

    def forward(self, kv, score, ape, cu, cuc, n_rows, *, ratio, coff):
        out = super().forward(kv, score, ape, cu, cuc, n_rows, ratio=ratio, coff=coff)
        return out.nan_to_num(0.0)


class OddHeadDim(Reference):
    """out wrong in one element when the head dim is odd."""
    name = "odd-head-dim"

    def forward(self, kv, score, ape, cu, cuc, n_rows, *, ratio, coff):
        out = super().forward(kv, score, ape, cu, cuc, n_rows, ratio=ratio, coff=coff)
        if out.shape[0] and out.shape[1] % 2:
            out[-1, 0] += 1.0
        return out


class NeedsAGpu(Reference):
    name = "needs-a-gpu"
    supports = Supports(ratios=(4,), min_compute_capability=(9, 0))
'''

OVERFLOW = "r4/c1d128/overflow"


@pytest.fixture
def suite(pytester):
    pytester.makepyfile(adapters=ADAPTERS)
    pytester.syspathinsert()
    return pytester


def test_the_plugin_is_registered_under_pytest11():
    (ep,) = [e for e in metadata.entry_points(group="pytest11") if e.name == "csagate"]
    assert ep.value == "csagate.pytest_plugin"


def test_a_correct_adapter_passes_and_gets_its_verdict(suite):
    suite.makepyfile(test_mine=f'''
from adapters import Reference


def test_class(csagate_contract):
    v = csagate_contract(Reference, cases=["{OVERFLOW}"], fuzz_trials=3, fuzz_seed=12)
    assert v.ok and v.headline.startswith("GATE PASS 1/1 (subset run")
    assert "drift check not run on the CPU" in v.headline


def test_string_and_fuzz_only(csagate_contract):
    assert csagate_contract("adapters.py:Reference", cases=(), fuzz_trials=3) is None
''')
    result = suite.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)


def test_a_planted_fault_fails_naming_the_gate_and_the_shrunk_case(suite):
    suite.makepyfile(test_mine=f'''
from adapters import NanToZero, OddHeadDim


def test_named_case(csagate_contract):
    csagate_contract(NanToZero(), cases=["{OVERFLOW}"])


def test_fuzz(csagate_contract):
    csagate_contract(OddHeadDim, cases=[], fuzz_trials=3, fuzz_seed=12)
''')
    result = suite.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines([
        "*csagate: nan-to-zero fails the ratio=4 contract on cpu",
        "*GATE FAIL 0/1 (subset run*",
        f"*{OVERFLOW}: G2 out: NaN masks differ*",
        "*csagate: odd-head-dim fails the ratio=4 contract on cpu",
        "*FUZZ FAIL */3 trials failed (seed 12); 1 distinct failure(s), shrunk:",
        "*fuzz/s12/t*/min/r4/c*d1/*: G2 out* (trials *)",
    ])
    assert "Traceback" not in result.stdout.str()
    assert "pytest_plugin.py" not in result.stdout.str()    # no frame of the plugin shown


def test_bad_arguments_fail_in_one_line_and_a_gpu_only_adapter_is_skipped(suite):
    suite.makepyfile(test_mine='''
import pytest
from adapters import NeedsAGpu, Reference


@pytest.mark.parametrize("kwargs, words", [
    (dict(cases=["r4/c1d128/overflw"]), "'r4/c1d128/overflw' at ratio=4. Did you mean"),
    (dict(cases=["c1d128/overflow"]), "a case of ratio=128: pass ratio=128"),
    (dict(ratio=3), "ratio 3: no contract family; one of 2, 4, 8, 16, 32, 128"),
    (dict(device="gpu"), "device 'gpu': expected cpu"),
    (dict(fuzz_trials=-1), "fuzz_trials -1"),
    (dict(ratio=128, cases=(), fuzz_trials=1), "nothing to fuzz"),
])
def test_bad(csagate_contract, kwargs, words):
    with pytest.raises(pytest.fail.Exception) as info:
        csagate_contract(Reference, **kwargs)
    assert words in str(info.value) and "\\n" not in str(info.value)


def test_not_an_implementation(csagate_contract):
    with pytest.raises(pytest.fail.Exception, match="has no name, supports, forward"):
        csagate_contract(object())
    with pytest.raises(pytest.fail.Exception, match="unknown implementation 'nope'"):
        csagate_contract("nope")


def test_gpu_only(csagate_contract):
    csagate_contract(NeedsAGpu, cases=["r4/c1d128/overflow"])
''')
    result = suite.runpytest("-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(passed=7, skipped=1)
    result.stdout.fnmatch_lines(["*csagate: needs-a-gpu cannot be judged on cpu: needs-a-gpu "
                                 "cannot run on the CPU: no CUDA GPU*"])


# --- the GPU path, with the reference as the stand-in of the gate's kernels ---------------------


@pytest.fixture
def gpu_stand_in(monkeypatch, tmp_path):
    """``device="cuda"`` judged on the CPU: the adapter on CPU tensors, the drift check on
    ``used["drift"]`` (the reference stand-in of tests/gate_backends.py, or a broken one) as
    the gate's own kernels, the preflight saying the CPU (``gates.judging``'s seams)."""
    from csagate.gates import judging

    (tmp_path / "plugin_adapters.py").write_text(ADAPTERS)
    monkeypatch.syspath_prepend(str(tmp_path))
    used = {"drift": RefImpl()}
    monkeypatch.setattr(judging, "load_builtin", lambda: used["drift"])
    monkeypatch.setattr(judging, "preflight", lambda device, kernels: torch.device("cpu"))
    return used


def test_on_a_gpu_the_drift_check_runs_before_the_cases_and_the_fuzz(gpu_stand_in):
    v = check("plugin_adapters:Reference", device="cuda", cases=[OVERFLOW])
    assert v.ok and v.drift_run and v.drift.ok
    assert (4, 2, 128) in gpu_stand_in["drift"].built          # drift/r4-c2d128/1x2048

    gpu_stand_in["drift"] = RefImpl()
    assert check("plugin_adapters:Reference", device="cuda", cases=(), fuzz_trials=1,
                 fuzz_seed=12) is None
    assert gpu_stand_in["drift"].built == [(4, 2, 128)]        # the drift check alone


def test_on_a_gpu_a_failing_drift_check_fails_and_judges_nothing(gpu_stand_in):
    class Drifting(RefImpl):
        def after_backward(self, kv, score, ape, cu, cuc, grad_out, dkv, dscore, dape,
                           prefill, *, ratio, coff):
            dkv[0, 0] += 1.0

    gpu_stand_in["drift"] = Drifting()
    with pytest.raises(pytest.fail.Exception) as info:
        check("plugin_adapters:OddHeadDim", device="cuda", cases=(), fuzz_trials=3)
    text = str(info.value)
    assert "the reference drift check failed (fail): the fuzz trials were not run" in text
    assert "drift dkv" in text and "FUZZ" not in text
    with pytest.raises(pytest.fail.Exception) as info:
        check("plugin_adapters:Reference", device="cuda", cases=[OVERFLOW], fuzz_trials=3)
    assert "the reference drift check failed" in str(info.value)
    assert "FUZZ" not in str(info.value)

    gpu_stand_in["drift"] = FailingBuildImpl()
    with pytest.raises(pytest.fail.Exception, match="could not evaluate ref-adapter on "
                       "cuda:0: building ratio=128 c1d128 for sm_90a failed"):
        check("plugin_adapters:Reference", device="cuda", cases=[OVERFLOW])


def test_a_bad_argument_fails_without_a_chained_exception(suite):
    """An unknown case or ratio fails the test in one line, with no "During handling of the
    above exception" chain behind it."""
    suite.makepyfile(test_mine='''
from adapters import Reference


def test_unknown_case(csagate_contract):
    csagate_contract(Reference, cases=["r4/c1d128/overflw"])


def test_bad_ratio(csagate_contract):
    csagate_contract(Reference, ratio=3)
''')
    result = suite.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=2)
    text = result.stdout.str()
    assert "During handling of the above exception" not in text
    assert "direct cause of the following exception" not in text
    assert "Traceback" not in text
