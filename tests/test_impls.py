"""Any implementation under the gate: adapters from a file and an entry point, what a
forward-only one gets (``n/a``, never PASS), a planted fault caught at the right gate and
located, bad ``--impl`` values (one line, exit 2), ``--report``, ``csagate compare``, and the
built-in gather formulation against the reference. CPU only: the drift check runs on the
reference-backed stand-in of ``tests/gate_backends.py``, the adapters on CPU tensors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from adapter_source import reference_adapter
from click.testing import CliRunner
from csagate.gates import builtin_impls
from csagate.gates.driver import Driver
from csagate.gates.implementation import load, resolve
from csagate.gates.plugin import ImplError
from csagate.gates.runner import run_gate
from csagate.gates.verdict import FAIL, INCONCLUSIVE, NA, PASS
from csagate.reference import backward, make_grad_out, make_pack
from gate_backends import (
    SMALL_CASES,
    SMALL_CONTRACT,
    SMALL_R4_CONTRACT,
    RefImpl,
    case_named,
    driven,
    use_stand_in,
)

from csagate import options
from csagate.cli import cli

ADAPTER = reference_adapter('Supports()') + '''

class ForwardOnly(Reference):
    name = "fwd-only"
    backward = None


class Faulty(Reference):
    """One element of out moved by 0.5 in the case with 14 rows of d 16 and coff 2."""
    name = "faulty"

    def forward(self, kv, score, ape, cu, cuc, n_rows, *, ratio, coff):
        out = super().forward(kv, score, ape, cu, cuc, n_rows, ratio=ratio, coff=coff)
        if coff == 2 and n_rows == 14 and out.shape[1] == 16:
            out[3, 5] += 0.5
        return out


NOT_AN_IMPL = object()
'''


@pytest.fixture
def adapter(tmp_path) -> Path:
    path = tmp_path / "my_adapter.py"
    path.write_text(ADAPTER)
    return path


@pytest.fixture
def cpu_run(monkeypatch):
    """``csagate run`` on the small contracts: drift on the reference stand-in, the judged
    implementation on CPU tensors (test double of the GPU)."""
    small = {"128": (SMALL_CONTRACT,), "4": (SMALL_R4_CONTRACT,),
             "all": (SMALL_CONTRACT, SMALL_R4_CONTRACT)}
    monkeypatch.setattr(options, "contracts", lambda ratio: small[ratio])
    use_stand_in(monkeypatch)


def invoke(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def gate(impl, cases=None):
    return run_gate(Driver(impl, torch.device("cpu")), SMALL_CONTRACT, cases=cases,
                    drift_driver=driven(RefImpl()))


# --- discovery ---------------------------------------------------------------------------


def test_adapter_from_a_file_is_judged_and_passes(adapter):
    impl = load(resolve(f"{adapter}:Reference"))
    assert impl.name == "ref-adapter"
    v = gate(impl)
    assert v.ok, v.reasons
    assert v.coverage.status == NA          # no dispatch hooks: not asserted, never PASS
    assert "coverage n/a" in v.headline and v.headline.startswith("GATE PASS")
    for r in v.cases:
        assert r.result("op", "out") is None    # the op comparison is the gate's kernels' own
        # zeros judged every never-consumed slot, and concluded nothing where a pack has none
        for z in r.results("zeros"):
            assert z.status == (INCONCLUSIVE if z.numbers["n_masked"] == 0 else PASS), z


def test_adapter_from_an_entry_point(tmp_path, monkeypatch):
    (tmp_path / "thirdparty_csa.py").write_text(ADAPTER)
    info = tmp_path / "thirdparty_csa-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: thirdparty-csa\n"
                                   "Version: 0.1\n")
    (info / "entry_points.txt").write_text("[csagate.implementations]\n"
                                           "thirdparty = thirdparty_csa:Reference\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    found = resolve("thirdparty")
    assert found.origin == "entry point (thirdparty-csa)"
    impl = load(found)
    assert impl.name == "ref-adapter"
    v = gate(impl, SMALL_CASES[:2])
    assert v.ok, v.reasons
    from csagate.commands.impls import rows

    listed = {row[0]: row for row in rows()}
    assert listed["thirdparty"][1] == "entry point (thirdparty-csa)"
    assert listed["thirdparty"][4] == "available"
    assert invoke("impls").exit_code == 0


def test_forward_only_adapter_gets_na_for_the_backward(adapter):
    v = gate(load(resolve(f"{adapter}:ForwardOnly")))
    assert v.ok, v.reasons
    assert "forward contract only" in v.headline
    for r in v.cases:
        assert r.gate_status("zeros") == NA
        for gate_name in ("G1", "G2", "G3"):
            for tensor in ("dkv", "dscore"):
                g = r.result(gate_name, tensor)
                if g is not None:
                    assert g.status == NA, (r.name, gate_name, tensor)
        g2_out = r.result("G2", "out") or r.result("G2", "out[NaN mask]")
        assert g2_out.status == PASS
        assert not any(g.status == PASS for g in r.gates if g.tensor.startswith("d"))


def test_planted_fault_is_caught_by_g2_and_located(adapter):
    v = gate(load(resolve(f"{adapter}:Faulty")))
    assert not v.ok
    failed = [r for r in v.cases if r.status == FAIL]
    assert [r.name for r in failed] == ["c2d16/edge"]
    r = failed[0]
    assert ("G2", "out") in {(g.gate, g.tensor) for g in r.failures}
    assert all(g.tensor == "out" for g in r.failures)
    where = r.recorded["where"][0]
    assert where["tensor"] == "out" and where["n_offending"] == 1
    assert where["first"]["index"] == [3, 5]
    assert abs(where["first"]["fused"] - where["first"]["eager"]) > 0.4
    # row 3 of the pack (7, 64, 0, ...) at ratio 8 is block 3 of segment 1
    assert where["first"]["segment"] == 1 and where["segments"] == [[1, 1]]
    assert where["column_blocks"]["counts"][5] == 1


def test_cli_run_with_a_file_adapter_prints_where_and_writes_the_report(adapter, cpu_run,
                                                                      tmp_path):
    report = tmp_path / "rep"
    result = invoke("run", "--impl", f"{adapter}:Faulty", "--report", str(report))
    assert result.exit_code == 1, result.output
    assert "where the errors sit:" in result.stdout
    assert "c2d16/edge: out (G2)" in result.stdout
    doc = json.loads((report / "verdict.json").read_text())
    assert doc["verdict"] == "FAIL" and doc["selection"]["impl"] == "faulty"
    assert doc["coverage"]["status"] == NA
    page = (report / "index.html").read_text()
    assert "GATE FAIL" in page
    pytest.importorskip("matplotlib")
    pngs = sorted(p.name for p in report.glob("*.png"))
    assert pngs == ["c2d16_edge__out__G2.png", "c2d16_edge__out__G3.png"]   # each failing check
    for png in pngs:
        assert (report / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert png in page


def test_cli_forward_only_exit_0_and_shows_na(adapter, cpu_run, tmp_path):
    """No backward: every row of dKV, dScore, dAPE (and their zeros) is n/a in the table and
    the JSON, counted apart from the passes; the headline says what was judged."""
    path = tmp_path / "v.json"
    result = invoke("run", "--impl", f"{adapter}:ForwardOnly", "--json", str(path))
    assert result.exit_code == 0, result.output
    assert "forward contract only" in result.stdout
    assert "n/a" in result.stdout
    doc = json.loads(path.read_text())
    assert "forward contract only" in doc["headline"]
    assert doc["gate_counts"]["n/a"] > 0 and doc["gate_counts"]["pass"] > 0
    for case in doc["cases"]:
        assert case["gate_status"]["zeros"] == "n/a"
        backward_rows = [g for g in case["gates"] if g["tensor"].startswith("d")]
        assert backward_rows and all(g["status"] == "n/a" for g in backward_rows), case["name"]
        assert case["gate_counts"]["n/a"] == len(backward_rows)


@pytest.mark.parametrize("value, words", [
    ("nope", "unknown implementation 'nope'"),
    ("eager-bf16", "Did you mean"),
    ("missing_file.py:X", "no such file"),
    ("{adapter}:Missing", "has no attribute 'Missing'"),
    ("{adapter}:NOT_AN_IMPL", "is not an implementation"),
    ("json:loads", "constructing it raised TypeError"),
    ("no_such_module_xyz:Impl", "cannot import"),
    (":Impl", "expected NAME"),
])
def test_bad_impl_values_are_one_line_exit_2(adapter, cpu_run, value, words):
    result = invoke("run", "--impl", value.format(adapter=adapter))
    assert result.exit_code == 2, result.output
    assert words in result.stderr
    assert result.stdout == ""
    message = [line for line in result.stderr.splitlines() if line.startswith("Error")]
    assert len(message) == 1 and "Traceback" not in result.stderr


def test_cudnn_missing_is_could_not_evaluate_exit_3(cpu_run, monkeypatch):
    import builtins as py

    real_import = py.__import__

    def no_cudnn(name, *args, **kwargs):
        if name == "cudnn" or name.startswith("cudnn."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(py, "__import__", no_cudnn)
    result = invoke("run", "--impl", "cudnn", "--ratio", "4")
    assert result.exit_code == 3
    lines = result.stderr.strip().splitlines()
    # one message (wrapped at the console width): csagate's line, not a traceback
    text = " ".join(line.strip() for line in lines)
    assert lines[0].startswith("csagate: ") and "Traceback" not in text
    assert "nvidia-cudnn-frontend is not importable" in text
    assert "csagate[cudnn]" in text



# --- an adapter that exits or interrupts: a usage error, never a silent exit ----------------

EXITING = """
import sys
from csagate.gates.plugin import Supports
from csagate.reference import forward


class Planted(BaseException):
    \"\"\"Neither an Exception nor an exit: still refused.\"\"\"


class Base:
    name = "exiting"
    supports = Supports()

    def forward(self, kv, score, ape, cu, cuc, n_rows, *, ratio, coff):
        return forward(kv, score, ape, cu, cuc, ratio=ratio, coff=coff, n_rows=n_rows)


class ExitsInInit(Base):
    def __init__(self):
        raise SystemExit(0)


class InterruptsInInit(Base):
    def __init__(self):
        raise KeyboardInterrupt


class PlantedInInit(Base):
    def __init__(self):
        raise Planted("planted")


class ExitsInSupports(Base):
    @property
    def supports(self):
        sys.exit(0)


class ExitsInUnavailable(Base):
    def unavailable(self, device):
        sys.exit(0)


class ExitsInForward(Base):
    def forward(self, kv, score, ape, cu, cuc, n_rows, *, ratio, coff):
        sys.exit(0)
"""


@pytest.fixture
def exiting(tmp_path) -> Path:
    path = tmp_path / "exiting.py"
    path.write_text(EXITING)
    return path


def _one_usage_line(result, *words):
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    message = [line for line in result.stderr.splitlines() if line.startswith("Error")]
    assert len(message) == 1 and "Traceback" not in result.stderr, result.stderr
    text = " ".join(result.stderr.split())
    for word in words:
        assert word in text, (word, text)


@pytest.mark.parametrize("body, raised", [
    ("import sys\nsys.exit(0)\n", "SystemExit: 0"),
    ("raise SystemExit('bye')\n", "SystemExit: bye"),
    ("raise KeyboardInterrupt\n", "KeyboardInterrupt"),
    ("class Planted(BaseException):\n    pass\nraise Planted('x')\n", "Planted: x"),
])
def test_an_adapter_that_exits_on_import_is_a_usage_error(tmp_path, cpu_run, body, raised):
    """``sys.exit(0)`` at import made ``csagate run --impl file.py:X`` exit 0 with no output."""
    path = tmp_path / "bad_import.py"
    path.write_text(body)
    result = invoke("run", "--impl", f"{path}:X")
    _one_usage_line(result, "bad_import.py:X", "importing it raised", raised)


@pytest.mark.parametrize("attr, what, raised", [
    ("ExitsInInit", "constructing it raised", "SystemExit: 0"),
    ("InterruptsInInit", "constructing it raised", "KeyboardInterrupt"),
    ("PlantedInInit", "constructing it raised", "Planted: planted"),
    ("ExitsInSupports", "reading its attributes raised", "SystemExit: 0"),
])
def test_an_adapter_that_exits_when_constructed_is_a_usage_error(exiting, cpu_run, attr, what,
                                                                 raised):
    result = invoke("run", "--impl", f"{exiting}:{attr}")
    _one_usage_line(result, f"exiting.py:{attr}", what, raised,
                    "must not exit or interrupt")


def test_an_adapter_whose_availability_check_exits_is_a_usage_error(exiting, cpu_run):
    result = invoke("run", "--impl", f"{exiting}:ExitsInUnavailable")
    assert result.exit_code == 2, result.output
    text = " ".join(result.stderr.split())
    assert "exiting: its availability check (unavailable) raised SystemExit: 0" in text
    assert "Traceback" not in text and result.stdout == ""


def test_an_adapter_module_that_exits_on_import_is_a_usage_error(tmp_path, cpu_run,
                                                                 monkeypatch):
    (tmp_path / "exits_module.py").write_text("raise SystemExit(0)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    result = invoke("run", "--impl", "exits_module:X")
    _one_usage_line(result, "exits_module:X", "cannot import", "SystemExit: 0")


def test_an_entry_point_that_exits_on_load_is_a_usage_error(tmp_path, cpu_run, monkeypatch):
    (tmp_path / "exiting_ep.py").write_text("raise SystemExit(0)\n")
    info = tmp_path / "exiting_ep-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: exiting-ep\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[csagate.implementations]\n"
                                           "exiting-ep = exiting_ep:Impl\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    result = invoke("run", "--impl", "exiting-ep")
    _one_usage_line(result, "entry point 'exiting-ep'", "importing it raised", "SystemExit: 0")


def test_an_adapter_whose_forward_exits_fails_its_cases_and_the_run_goes_on(exiting, cpu_run):
    """Mid-run, ``sys.exit(0)`` in forward is each case's error row (exit 1), not an exit 0."""
    result = invoke("run", "--impl", f"{exiting}:ExitsInForward")
    assert result.exit_code == 1, result.output
    assert "GATE FAIL 0/" in result.stdout
    assert "exiting.forward raised SystemExit: 0" in " ".join(result.stdout.split())


# --- compare -------------------------------------------------------------------------------


def test_compare_table_fits_80_columns_and_json(adapter, cpu_run, monkeypatch, tmp_path):
    out = tmp_path / "cmp.json"
    names = ("c1d16/ragged", "c2d32/ragged+pad2r3t")
    args = ["compare", "--impl", f"{adapter}:Reference", "--impl", "eager-bf16w",
            "--json", str(out), "--device", "cpu"]
    for name in names:
        args += ["--case", name]
    result = CliRunner().invoke(cli, args, env={"COLUMNS": "80"}, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert max(len(line) for line in result.stdout.splitlines()) <= 80
    doc = json.loads(out.read_text())
    assert [c["name"] for c in doc["cases"]] == list(names)
    for case in doc["cases"]:
        by = {t["tensor"]: t for t in case["tensors"]}
        assert set(by) == {"out", "dkv", "dscore", "dape"}
        # A is the fp32 eager reference itself; B rounds its weights to bf16
        assert all(t["a_eager"] == 0 for t in by.values())
        assert by["out"]["max_abs"] == by["out"]["b_eager"] > 0
        assert by["out"]["n_diff"] > 0


def test_compare_needs_two_impls(cpu_run):
    result = invoke("compare", "--impl", "eager-bf16w")
    assert result.exit_code == 2 and "exactly two --impl" in result.stderr


# --- the built-in gather formulation -------------------------------------------------------


@pytest.mark.parametrize("coff", [1, 2])
def test_gather_formulation_equals_the_fp32_reference(coff):
    """The compiled built-in's formulation, run eagerly: bitwise the reference's out, dKV and
    dScore (one fp32 sum order), dAPE within fp32 accumulation order."""
    pack = make_pack((7, 64, 0, 9, 8, 3, 35), ratio=8, coff=coff, d=16, pad_rows=3,
                     pad_tokens=5)
    go = make_grad_out(pack.n_rows, 16)
    ref = backward(*pack.inputs(), go, ratio=8, coff=coff)

    class Eager(builtin_impls.EagerBf16Ape):
        def _fn(self, kv, score, ape, *index):
            return builtin_impls.pool(kv, score, ape, *index)

    impl = Eager()
    out = impl.forward(*pack.inputs(), pack.n_rows, ratio=8, coff=coff)
    dkv, dscore, dape = impl.backward(*pack.inputs(), go, ratio=8, coff=coff)
    assert torch.equal(out, ref.out)
    assert torch.equal(dkv, ref.dkv) and torch.equal(dscore, ref.dscore)
    assert torch.allclose(dape, ref.dape, atol=1e-6, rtol=0)


def test_bf16_ape_formulation_differs_from_fp32_only_by_its_rounding():
    case = case_named("c2d16/edge")
    pack = make_pack(case.lens, ratio=case.ratio, coff=case.coff, d=case.d)
    impl = builtin_impls.EagerBf16Ape()
    got = impl.forward(*pack.inputs(), pack.n_rows, ratio=8, coff=2)
    ref = backward(*pack.inputs(), make_grad_out(pack.n_rows, 16), ratio=8, coff=2).out
    assert not torch.equal(got, ref)
    assert (got.float() - ref.float()).abs().max() < 0.05


def test_resolve_builtins_and_errors():
    assert load(resolve("eager-bf16w")).name == "eager-bf16w"
    with pytest.raises(ImplError, match="Did you mean 'cudnn'"):
        resolve("cudnnn")


# --- csagate impls --impl: one adapter checked in one line ----------------------------------

CHECKED = '''
from csagate.gates.plugin import Supports
from csagate.reference import forward


class Good:
    name = "good"
    supports = Supports(ratios=(4,), head_dims=(16,))
    deterministic = True

    def forward(self, kv, score, ape, cu, cuc, n_rows, *, ratio, coff):
        return forward(kv, score, ape, cu, cuc, ratio=ratio, coff=coff, n_rows=n_rows)

    def backward(self, kv, score, ape, cu, cuc, grad_out, *, ratio, coff, deterministic=False):
        raise NotImplementedError

    def kernels(self, ratio, direction, configs=None):
        return {}

    def dispatch(self, ratio, direction, coff, d, n_rows):
        return None


class PositionalRatio(Good):
    def forward(self, kv, score, ape, cu, cuc, n_rows, ratio, coff):   # no *: still callable
        return None


class NoKeywords(Good):
    def forward(self, kv, score, ape, cu, cuc, n_rows):
        return None


class NotDeterministicEnough(Good):
    def backward(self, kv, score, ape, cu, cuc, grad_out, *, ratio, coff):
        raise NotImplementedError


class HalfDispatch(Good):
    dispatch = None


class BadCoffs(Good):
    supports = Supports(coffs=(3,))


class BadPrepare(Good):
    def prepare(self):
        return []


class BadClaim(Good):
    bitwise = ("out", "dq")
'''


@pytest.fixture
def checked(tmp_path) -> Path:
    path = tmp_path / "checked.py"
    path.write_text(CHECKED)
    return path


@pytest.mark.parametrize("name", ["Good", "PositionalRatio"])
def test_impls_impl_accepts_a_well_formed_adapter_in_one_line(checked, name):
    result = invoke("impls", "--impl", f"{checked}:{name}")
    assert result.exit_code == 0, result.output
    assert result.stdout.count("\n") == 1
    assert ": ok: 'good', fwd+bwd det hooks, ratio 4, coff 1/2, d 16; here: yes" in result.stdout


@pytest.mark.parametrize("name, needle", [
    ("NoKeywords", "forward cannot be called as forward(kv, score, ape, cu, cuc, n_rows, *, "
                   "ratio, coff)"),
    ("NotDeterministicEnough", "backward cannot be called as backward(kv, score, ape, cu, cuc, "
                               "grad_out, *, ratio, coff, deterministic)"),
    ("HalfDispatch", "kernels and dispatch come together"),
    ("BadCoffs", "supports.coffs must be a tuple of 1 and/or 2"),
    ("BadPrepare", "prepare cannot be called as prepare(targets, progress)"),
    ("BadClaim", "bitwise must be a tuple of output names (out, dkv, dscore, dape), got "
                 "('out', 'dq')"),
    ("Missing", "has no attribute 'Missing'"),
])
def test_impls_impl_refuses_a_broken_adapter_with_one_line(checked, name, needle):
    result = invoke("impls", "--impl", f"{checked}:{name}")
    assert result.exit_code == 2
    message = " ".join(result.stderr.split())
    assert message.startswith("csagate: ") and needle in message, message
    assert "Traceback" not in result.output


def test_impls_impl_checks_the_builtins_and_the_readme_adapter(adapter):
    for value in ("eager-bf16w", "compiled", "csagate", "cudnn", f"{adapter}:Reference"):
        result = invoke("impls", "--impl", value)
        assert result.exit_code == 0, (value, result.output)
    assert invoke("impls", "--impl", "nope").exit_code == 2


def test_an_adapter_subclassing_a_builtin_without_a_docstring_describes_itself(tmp_path):
    """``describe`` of the eager built-ins reads the class's docstring, inherited where a
    subclass has none (it raised AttributeError on ``None.strip()``)."""
    path = tmp_path / "sub_adapter.py"
    path.write_text("from csagate.gates.builtin_impls import EagerBf16Weights\n\n\n"
                    "class Sub(EagerBf16Weights):\n    name = 'sub'\n")
    impl = load(resolve(f"{path}:Sub"))
    described = Driver(impl, torch.device("cpu")).describe()
    assert described["formulation"].startswith("The reference's upstream formulation")
    result = invoke("run", "--impl", f"{path}:Sub", "--device", "cpu", "--ratio", "4",
                    "--case", "r4/c1d128/overflow")
    assert result.exit_code == 0, result.output
