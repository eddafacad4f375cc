"""``csagate fuzz`` on the CPU: adapters with a planted fault are found, the failure is shrunk
and written as a case file that ``csagate run --case-file`` replays to exit 1; a correct
adapter passes; the options are checked before any work; trial i of seed S is one pack.

The adapters are reference-backed (fp32 eager on CPU tensors), like README's adapter protocol;
the packs are small (seed 12's first trials are a few tokens), so each test takes seconds.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from adapter_source import reference_adapter
from click.testing import CliRunner
from csagate.gates import fuzz
from csagate.gates.builtin_impls import CSAGATE_SUPPORTS
from csagate.gates.casefile import load
from csagate.gates.cases import Case
from csagate.gates.driver import Driver
from csagate.gates.plugin import Supports
from csagate.gates.verdict import FAIL

from csagate.cli import cli

ADAPTER = reference_adapter('Supports(ratios=(4,))') + '''

class OddHeadDim(Reference):
    """out wrong in one element when the head dim is odd."""
    name = "odd-head-dim"

    def forward(self, kv, score, ape, cu, cuc, n_rows, *, ratio, coff):
        out = super().forward(kv, score, ape, cu, cuc, n_rows, ratio=ratio, coff=coff)
        if out.shape[1] % 2:
            out[-1, 0] += 1.0
        return out


class ShortSegment(Reference):
    """dScore wrong in one element when some segment is shorter than ratio (not empty)."""
    name = "short-segment"

    def backward(self, kv, score, ape, cu, cuc, grad_out, *, ratio, coff):
        dkv, dscore, dape = super().backward(kv, score, ape, cu, cuc, grad_out, ratio=ratio,
                                             coff=coff)
        lens = (cu[1:] - cu[:-1]).tolist()
        if any(0 < n < ratio for n in lens):
            dscore = dscore.clone()
            dscore[-1, -1] += 1.0
        return dkv, dscore, dape
'''

SEED = 12   # its trial 0 at ratio 4: coff 2, d 739, segments (1, 4): odd d and a short segment


def _module(tmp_path: Path):
    path = tmp_path / "adapters.py"
    path.write_text(ADAPTER)
    return path


@pytest.fixture
def adapters(tmp_path) -> Path:
    return _module(tmp_path)


def _impl(path: Path, name: str):
    from csagate.gates.implementation import load as load_impl
    from csagate.gates.implementation import resolve

    return load_impl(resolve(f"{path}:{name}"))


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


# --- the generator -----------------------------------------------------------------------------


def test_same_seed_same_trials_and_seeds_differ():
    env = fuzz.envelope(Supports(ratios=(4, 8)))
    first = [fuzz.draw(env, 5, i) for i in range(30)]
    assert [fuzz.draw(env, 5, i) for i in range(30)] == first
    assert fuzz.draw(env, 5, 17) == first[17]            # trial i alone: the same pack
    assert [fuzz.draw(env, 6, i) for i in range(30)] != first
    for case in first:
        assert case.kind == "fuzz" and env.valid(case) and 1 <= len(case.lens) <= 7
    # pinned: the generator is keyed on the string "csagate.fuzz/{seed}/{index}" (Python's
    # SHA-512 seeding), so these parameters are the same on every machine and Python
    env4 = fuzz.envelope(Supports(ratios=(4,)))
    case = fuzz.draw(env4, SEED, 0)
    assert (case.ratio, case.coff, case.d, case.lens) == (4, 2, 739, (1, 4))


def test_draws_mix_segment_kinds_dims_padding_and_scales():
    env = fuzz.envelope(Supports())
    cases = [fuzz.draw(env, 1, i) for i in range(200)]
    lens = [(n, c.ratio) for c in cases for n in c.lens]
    assert any(n == 0 for n, _ in lens) and any(0 < n < r for n, r in lens)
    assert any(n >= r and n % r == 0 for n, r in lens) and any(n > r and n % r for n, r in lens)
    assert any(c.d % 2 for c in cases) and any(c.d <= 16 for c in cases)
    assert {c.scale for c in cases} == {1.0, 8.0, 64.0}
    assert any(c.pad_rows for c in cases) and any(c.pad_tokens for c in cases)
    assert {c.ratio for c in cases} == {2, 4, 8, 16, 32, 128}
    assert max(c.tokens for c in cases) <= fuzz.CPU_SIZES.max_tokens + 128
    assert not any(c.deterministic for c in cases)   # Supports() alone: no deterministic mode


def test_peaked_scores_are_drawn_last_and_only_where_the_contract_is_bitwise(monkeypatch):
    env = fuzz.envelope(Supports())
    cases = [fuzz.draw(env, 3, i) for i in range(300)]
    peaked = [c for c in cases if c.inputs == "peaked"]
    assert peaked and {c.inputs for c in cases} == {"random", "peaked"}
    assert all(fuzz.peaked_allowed(c.ratio) for c in peaked) and not fuzz.peaked_allowed(128)
    share = len(peaked) / sum(1 for c in cases if c.ratio != 128)
    assert 0.05 < share < 0.3, share                      # PEAKED_RATE = 0.15
    assert all("/peaked" in c.name for c in peaked)
    assert not any("/peaked" in c.name for c in cases if c.inputs == "random")
    # drawn last: with no peaked draw at all (no random number taken for it) every trial is
    # the same pack, its scores plain
    monkeypatch.setattr(fuzz, "peaked_allowed", lambda ratio: False)
    plain = [fuzz.draw(env, 3, i) for i in range(300)]
    assert [replace(fuzz.params(c), inputs="random") for c in cases] == \
        [fuzz.params(c) for c in plain]


def test_the_shrinker_tries_plain_scores():
    env = fuzz.envelope(Supports())
    case = next(c for c in (fuzz.draw(env, 3, i) for i in range(300)) if c.inputs == "peaked")
    assert replace(case, inputs="random") in list(fuzz.candidates(case, env))


def test_envelope_is_supports_intersected_with_the_host_api():
    kernels = fuzz.envelope(CSAGATE_SUPPORTS)
    assert kernels.dims[(128, 1)] == (128, 512) and kernels.dims[(128, 2)] == (128, 512)
    assert {1, 65, 128, 512, 1024} <= set(kernels.dims[(4, 2)])   # the small ratios: any d
    free = fuzz.envelope(Supports(), ratios=(2, 128))
    assert free.dims[(128, 2)] == (128, 512)                 # ratio 128: validated dims only
    assert free.dims[(2, 1)] == tuple(range(2, 1025, 2))     # ratio*coff*d % 4 == 0
    assert free.dims[(2, 2)][:3] == (1, 2, 3)
    odd = fuzz.envelope(Supports(head_dims=(7,)))
    assert (2, 1) not in odd.dims and (128, 1) not in odd.dims and odd.dims[(4, 1)] == (7,)


# --- shrinking (library level) -------------------------------------------------------------------


def test_shrink_keeps_a_short_segment_and_drops_everything_else(adapters):
    impl = _impl(adapters, "ShortSegment")
    env = fuzz.envelope(impl.supports)
    judge = fuzz.Judge(Driver(impl, torch.device("cpu")))
    case = Case("x", 2, 37, (9, 0, 3, 14, 8), "fuzz", "planted", ratio=4, scale=8.0,
                pad_rows=3, pad_tokens=5, input_seed=99)
    result = judge(case)
    assert result.status == FAIL and "G2" in fuzz.signature(result)
    found = fuzz.shrink(case, result, judge, env)
    small = found.case
    assert found.result.status == FAIL and judge(small).status == FAIL
    assert small.tokens < case.tokens and small.d < case.d and len(small.lens) < len(case.lens)
    assert small.scale == 1.0 and small.pad_rows == 0 and small.pad_tokens == 0
    assert small.input_seed == fuzz.DEFAULT_SEEDS["input_seed"]
    assert any(0 < n < 4 for n in small.lens) and small.rows >= 1   # the fault's trigger
    assert (small.d, small.coff, sorted(small.lens)) == (1, 1, [1, 4])


def test_failures_that_shrink_alike_are_one(adapters):
    impl = _impl(adapters, "OddHeadDim")
    judge = fuzz.Judge(Driver(impl, torch.device("cpu")))
    env = fuzz.envelope(impl.supports)
    run = fuzz.fuzz(judge, env, seed=SEED, trials=1)
    assert run.failed == 1 and len(run.failures) == 1
    f = run.failures[0]
    assert f.shrunk.case.d == 1 and f.trials == [0]
    assert f.shrunk.case.name.startswith(f"fuzz/s{SEED}/t0/min/r4/")


# --- the command -------------------------------------------------------------------------------


def test_a_planted_fault_is_found_shrunk_written_and_replayed(adapters, tmp_path):
    out, report = tmp_path / "cases", tmp_path / "fuzz.json"
    result = invoke("fuzz", "--device", "cpu", "--impl", f"{adapters}:OddHeadDim", "--trials",
                    1, "--seed", SEED, "--out", out, "--json", report)
    assert result.exit_code == 1, result.output
    assert f"FUZZ FAIL 1/1 trials failed (seed {SEED})" in result.stdout
    doc = json.loads(report.read_text())
    assert doc["seed"] == SEED and doc["failed"] == 1 and doc["verdict"] == "FAIL"
    (failure,) = doc["failures"]
    files = sorted(out.glob("*.json"))
    assert [str(f) for f in files] == [failure["case_file"]]
    saved = load(files[0])
    original = saved.origin["case"]
    assert saved.origin["seed"] == SEED and saved.origin["trial"] == 0
    assert saved.implementation == f"{adapters}:OddHeadDim"
    assert saved.case.d < original["d"] and saved.case.d % 2
    assert saved.case.tokens < sum(original["lens"]) + original["pad_tokens"]
    assert set(saved.failing) >= {"G2 out"}
    replay = invoke("run", "--case-file", files[0], "--impl", f"{adapters}:OddHeadDim",
                    "--device", "cpu")
    assert replay.exit_code == 1, replay.output
    assert "GATE FAIL 0/1" in replay.stdout and "drift check not run on the CPU" in replay.stdout
    fixed = invoke("run", "--case-file", files[0], "--impl", f"{adapters}:Reference",
                   "--device", "cpu")
    assert fixed.exit_code == 0, fixed.output
    assert "GATE PASS 1/1" in fixed.stdout


def test_a_correct_adapter_passes(adapters, tmp_path):
    junit = tmp_path / "fuzz.xml"
    result = invoke("fuzz", "--device", "cpu", "--impl", f"{adapters}:Reference", "--trials", 2,
                    "--seed", SEED, "--out", tmp_path / "cases", "--junit-xml", junit)
    assert result.exit_code == 0, result.output
    assert "FUZZ PASS 2/2 trials" in result.stdout and "head dims" in result.stdout
    assert not (tmp_path / "cases").exists()          # nothing failed, nothing written
    assert 'tests="2"' in junit.read_text() and 'failures="0"' in junit.read_text()


def test_a_budget_runs_trials_until_it_is_spent(adapters, tmp_path):
    report = tmp_path / "f.json"
    result = invoke("fuzz", "--device", "cpu", "--impl", f"{adapters}:Reference", "--budget",
                    "0.01", "--seed", SEED, "--json", report)
    assert result.exit_code == 0, result.output
    doc = json.loads(report.read_text())
    assert doc["stopped"] == "budget" and doc["trials_run"] >= 1 and doc["budget"] == 0.01


@pytest.mark.parametrize("args, needle", [
    (["--trials", "3", "--budget", "5"], "exclusive"),
    (["--trials", "0"], "--trials"),
    (["--budget", "0"], "--budget"),
    (["--device", "gpu7"], "--device"),
    (["--json", ""], "--json"),
    (["--impl", "no-such-impl"], "unknown implementation"),
    (["--ratio", "3"], "--ratio"),
])
def test_usage_errors_exit_2_before_any_work(args, needle):
    result = invoke("fuzz", "--device", "cpu", *args)
    assert result.exit_code == 2, result.output
    assert needle in result.stderr


def test_out_must_be_a_folder(adapters, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("")
    result = invoke("fuzz", "--device", "cpu", "--impl", f"{adapters}:Reference", "--trials", 1,
                    "--out", afile)
    assert result.exit_code == 2 and "is a file" in result.stderr


def test_nothing_to_fuzz_is_a_usage_error(adapters):
    result = invoke("fuzz", "--device", "cpu", "--impl", f"{adapters}:Reference", "--ratio",
                    "128", "--trials", 1)
    assert result.exit_code == 2 and "nothing to fuzz" in result.stderr


def test_the_gates_own_kernels_on_the_cpu_exit_3_in_one_line(tmp_path):
    report = tmp_path / "f.json"
    result = invoke("fuzz", "--device", "cpu", "--trials", 1, "--json", report)
    assert result.exit_code == 3, result.output
    message = " ".join(result.stderr.split())
    assert message.startswith("csagate: csagate cannot run on the CPU: the gate's own kernels "
                              "need a CUDA GPU")
    assert json.loads(report.read_text())["verdict"] == "COULD NOT EVALUATE"


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA GPU")
def test_no_gpu_on_cuda_exits_3(adapters):
    result = invoke("fuzz", "--impl", f"{adapters}:Reference", "--trials", 1)
    assert result.exit_code == 3 and "no CUDA GPU visible" in result.stderr
