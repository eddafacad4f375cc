"""The mutation self-test's catalogue stays true to the source: every planted bug applies
exactly once and its mutated tree still builds (the GPU run, `make mutants`, then proves the
gate fails on each; docs/MUTANTS.md holds its table). The gate-logic mutants are judged here,
on the CPU: each one's planted-fault test fails in its mutated tree."""

import importlib.util
import sys
from pathlib import Path

import pytest
from csagate.kernels.registry import RATIOS

ROOT = Path(__file__).resolve().parents[1]


def _load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "mutants" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


catalog = _load("catalog")
run = _load("run")
GATES = {"G1", "G2", "G3", "zeros", "isolation", "drift", "coverage", "edges", "op",
         "n/a",     # a gate-logic mutant: the n/a rows of a direction not provided
         "exit 2"}  # a gate-logic mutant: loading an adapter that exits
CPU_JUDGED = [m for m in catalog.MUTANTS if m.judge == "cpu"]


def test_catalogue_has_at_least_twelve_out_of_contract_mutants():
    names = [m.name for m in catalog.MUTANTS]
    assert len(names) == len(set(names))
    caught = [m for m in catalog.MUTANTS if not m.in_contract]
    assert len(caught) >= 12
    for m in catalog.MUTANTS:
        assert m.ratio in RATIOS and m.why and m.find != m.replace
        assert (m.expect in GATES) != bool(m.in_contract), m.name


@pytest.mark.parametrize("mutant", catalog.MUTANTS, ids=lambda m: m.name)
def test_every_mutant_applies_exactly_once(mutant):
    text = (ROOT / mutant.file).read_text()
    mutated = run.apply(mutant, text)
    assert mutated != text and mutated.count(mutant.replace) >= 1


def test_apply_refuses_a_stale_or_ambiguous_find():
    m = catalog.Mutant("x", "f", "abc", "abd", 128, "G2", "why")
    with pytest.raises(ValueError, match="0 times"):
        run.apply(m, "xyz")
    with pytest.raises(ValueError, match="2 times"):
        run.apply(m, "abc abc")


def test_failed_gates_reads_a_report():
    report = {"drift": {"gates": [{"gate": "drift", "status": "pass"}]},
              "cases": [{"name": "a", "status": "fail",
                         "gates": [{"gate": "G2", "tensor": "out", "status": "fail"},
                                   {"gate": "G1", "tensor": "out", "status": "pass"}]},
                        {"name": "b", "status": "pass", "gates": []}],
              "coverage": {"status": "fail", "fwd": {"missing": ["k"], "unexpected": []},
                           "bwd": {"missing": [], "unexpected": []}, "edges": {"ok": False}}}
    assert run.failed_gates(report) == ("G2", "coverage", "edges")
    assert run.failed_gates({}) == ()


def test_every_mutated_file_parses_and_the_sample_is_one_per_kernel_file():
    for mutant in catalog.MUTANTS:
        run.parses(mutant)
    chosen = run.sampled(list(catalog.MUTANTS))
    files = {m.file for m in catalog.MUTANTS if m.name in chosen}
    assert len(files) == len(chosen)
    assert files == {m.file for m in catalog.MUTANTS
                     if m.file.startswith("kernels/") and m.file != "kernels/schedule.py"}


def test_a_mutant_that_breaks_the_build_is_reported(dsl, tmp_path):
    """The build step fails on a mutated tree whose kernels no longer compile (here: every
    compile raises)."""
    bad = catalog.Mutant("raises", "kernels/cache.py", "    return key.build()\n",
                         "    raise RuntimeError('planted')\n", 4, "G2", "every compile raises")
    outcome = run.build(bad, tmp_path, "sm_90a")
    assert not outcome.ok and "build exit" in outcome.detail, outcome.detail


def test_one_mutant_per_kernel_file_builds(dsl):
    """The first mutant of each kernel source file, in a copy of the tree with its own compile
    cache, cross-compiles the kernels of its ratio that the file reaches for sm_90a (a mutant
    that no longer builds would test nothing on the GPU); `make mutants` builds them all."""
    assert run.main(["check", "--arch", "sm_90a", "--jobs", "2", "--sample"]) == 0


def test_gate_logic_mutants_name_an_existing_cpu_test_and_touch_no_kernel():
    assert len(CPU_JUDGED) >= 5
    for m in CPU_JUDGED:
        assert not m.file.startswith("kernels/") and not m.in_contract, m.name
        path, _, test = m.cpu_test.partition("::")
        assert (ROOT / path).is_file() and f"def {test}(" in (ROOT / path).read_text(), m.name
    assert {m.expect for m in CPU_JUDGED} >= {"n/a", "op", "coverage", "G1", "zeros"}
    from csagate.gates.selftest import CHECKS

    checks = {name for name, _ in CHECKS}
    for m in CPU_JUDGED:   # each is stopped at run time by a self-test that exists
        assert m.selftest in checks, m.name
    files = {m.file for m in CPU_JUDGED}
    assert {"gates/runner.py", "gates/coverage.py"} <= files


@pytest.mark.parametrize("mutant", CPU_JUDGED, ids=lambda m: m.name)
def test_gate_logic_mutant_is_caught_on_the_cpu(mutant, tmp_path):
    """The mutant applied to a copy of the tree: its planted-fault test must fail there (run
    in a fresh process that imports csagate from the copy)."""
    run.make_tree(mutant, tmp_path)
    outcome = run.judge_cpu(mutant, tmp_path)
    assert outcome.ok, outcome.detail


def test_gate_mode_leaves_the_gate_logic_mutants_to_the_cpu():
    assert run.main(["gate", CPU_JUDGED[0].name]) == 1     # none of them is judged on a GPU
    gpu = [m for m in catalog.MUTANTS if m.judge == "gpu"]
    assert "fwd-column-guard-rounds-down" in {m.name for m in gpu}
