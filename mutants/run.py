"""The mutation self-test: plant each catalogued bug in a copy of the tree and prove the gate
catches it.

    python mutants/run.py check [--arch sm_90a] [--jobs N] [--sample] [NAME ...]  # CPU: builds
    python mutants/run.py gate  [--jobs N] [--report FILE] [NAME ...]     # GPU: the gate must fail
    python mutants/run.py cpu   [--jobs N] [--report FILE] [NAME ...]  # CPU: gate-logic mutants

``check``: every mutant's find-text occurs exactly once in its file, the mutated file still
parses, and the mutated tree cross-compiles for ``--arch`` the kernels of the mutant's ratio
that the file reaches (its family's, for a kernel module; all of the ratio's otherwise). With
``--sample`` (the CPU tests) only the first mutant of each kernel source file is built; the
others apply and parse.
``gate`` (on a GPU): runs ``csagate run --ratio R --json`` on every mutated tree, each with
its own fresh compile cache, ``--jobs`` at a time (the builds are CPU work; the gates share the
GPU); an out-of-contract mutant must exit 1 with its expected gate among the failed ones, an
in-contract mutant must exit 0. Prints one row per mutant and writes a Markdown table with
``--report``. The gate-logic mutants (``Mutant.cpu_test``) are left out: on correct kernels
the weakened gate still passes.
``cpu``: the gate-logic mutants, each in its copy of the tree: its ``cpu_test`` (a pytest node
that plants a fault the expected gate must catch, on the reference-backed CPU backends) must
fail there, and ``csagate run`` there (a quick CPU case) must stop before its verdict with
exit 3, naming the mutant's ``selftest`` among the failed known-answer self-tests: the fault
is caught where the gate runs, not only in this repository's tests. No GPU, no kernel build.

Each mutated tree is a copy of the tracked files; ``csagate`` is imported from it through a
symlink tree first on PYTHONPATH (``csagate.kernels`` -> ``<copy>/kernels`` ...), so the
installed package is never touched.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from catalog import MUTANTS, Mutant  # noqa: E402

PACKAGES = ("kernels", "gates", "reference", "perf")


@dataclass
class Outcome:
    mutant: Mutant
    ok: bool
    detail: str
    exit_code: int | None = None
    failed: tuple[str, ...] = ()


SKIP = {".git", ".venv", ".dsl", ".whl", "out", ".devrun", ".csagate-cache", "build", "dist",
        "__pycache__", ".pytest_cache", ".ruff_cache"}


def tracked_files() -> list[str]:
    """The tree's source files: every regular file outside the ignored build and cache
    folders (symlinked folders are not entered). Not git's list: a copy of the tree on a GPU
    machine may carry a stale or no .git."""
    files = []
    for top, dirs, names in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIP and not d.endswith(".egg-info")]
        for name in names:
            path = Path(top) / name
            if path.is_file() and not path.is_symlink():
                files.append(str(path.relative_to(ROOT)))
    return files


def apply(mutant: Mutant, text: str) -> str:
    """The mutated text; ValueError unless the find-text occurs exactly once."""
    n = text.count(mutant.find)
    if n != 1:
        raise ValueError(f"{mutant.name}: the find-text occurs {n} times in {mutant.file} "
                         "(must be exactly once: the catalogue no longer matches the source)")
    return text.replace(mutant.find, mutant.replace)


def make_tree(mutant: Mutant, base: Path) -> Path:
    """A copy of the tracked tree with the mutant applied, plus its import root ``ns/``."""
    tree = base / mutant.name / "tree"
    for rel in tracked_files():
        src = ROOT / rel
        if not src.is_file():
            continue
        dst = tree / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
    target = tree / mutant.file
    target.write_text(apply(mutant, target.read_text()))
    ns = base / mutant.name / "ns" / "csagate"
    ns.mkdir(parents=True)
    for item in (tree / "csagate").iterdir():
        (ns / item.name).symlink_to(item)
    for pkg in PACKAGES:
        if (tree / pkg).is_dir():
            (ns / pkg).symlink_to(tree / pkg)
    return tree


def env_for(mutant: Mutant, base: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(base / mutant.name / "ns"), env.get("PYTHONPATH", "")) if p)
    env["CSAGATE_CACHE_DIR"] = str(base / mutant.name / "cache")  # a fresh cache each
    env.pop("CUTE_DSL_DUMP_DIR", None)
    return env


def _run(args: list[str], mutant: Mutant, base: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "csagate", *args], cwd=base / mutant.name,
                          env=env_for(mutant, base), capture_output=True, text=True)


# Run in a mutated tree: compile the kernels of a ratio on an arch that one source reaches (its
# family's kernels when it is a family's module, else all of the ratio's); prints their count.
_BUILD = """
import sys
from csagate.kernels import registry
from csagate.kernels.cache import CACHE
ratio, arch, module = int(sys.argv[1]), sys.argv[2], sys.argv[3]
keys = registry.keys_for(ratio, arch)
modules = {f.module for f in registry.FAMILIES.values()}
keys = [k for k in keys if module not in modules or k.family.module == module]
CACHE.build(keys)
print(len(keys))
"""


def parses(mutant: Mutant) -> None:
    """SyntaxError unless the mutated file is still valid Python."""
    path = ROOT / mutant.file
    compile(apply(mutant, path.read_text()), str(path), "exec")


def build(mutant: Mutant, base: Path, arch: str, compile_kernels: bool = True) -> Outcome:
    try:
        parses(mutant)
        if not compile_kernels:
            return Outcome(mutant, True, "applies once; parses")
        make_tree(mutant, base)
    except (ValueError, SyntaxError) as exc:
        return Outcome(mutant, False, str(exc))
    module = "csagate." + mutant.file.removesuffix(".py").replace("/", ".")
    proc = subprocess.run([sys.executable, "-c", _BUILD, str(mutant.ratio), arch, module],
                          cwd=base / mutant.name, env=env_for(mutant, base),
                          capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["?"]
        return Outcome(mutant, False, f"build exit {proc.returncode}: {tail[0]}",
                       proc.returncode)
    return Outcome(mutant, True, f"applies once; {proc.stdout.strip()} kernel(s) build")


def sampled(mutants: list[Mutant]) -> set[str]:
    """One mutant of each kernel source file (kernels/*.py other than the pure-Python schedule
    tables), the first of the smallest ratio (the quickest builds): the ones ``check --sample``
    builds."""
    firsts: dict[str, Mutant] = {}
    for m in mutants:
        if m.file.startswith("kernels/") and m.file != "kernels/schedule.py":
            if m.file not in firsts or m.ratio < firsts[m.file].ratio:
                firsts[m.file] = m
    return {m.name for m in firsts.values()}


def failed_gates(report: dict) -> tuple[str, ...]:
    """Every gate name that failed anywhere in a ``csagate run --json`` report."""
    found: set[str] = set()

    def walk(node):
        if isinstance(node, dict):
            status = str(node.get("status", "")).lower()
            if status in ("fail", "error") and isinstance(node.get("gate"), str):
                found.add(node["gate"])
            if status in ("fail", "error") and isinstance(node.get("check"), str):
                found.add(node["check"])
            if status == "error" and "name" in node:
                found.add("error")
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(report)
    cov = report.get("coverage") or {}
    if any((cov.get(d) or {}).get("missing") or (cov.get(d) or {}).get("unexpected")
           for d in ("fwd", "bwd")):
        found.add("coverage")  # a table entry no case reaches (or a kernel outside the tables)
    if isinstance(cov.get("edges"), dict) and cov["edges"].get("ok") is False:
        found.add("edges")     # a bucket edge moved
    return tuple(sorted(found))


def judge(mutant: Mutant, base: Path) -> Outcome:
    path = base / mutant.name / "verdict.json"
    proc = _run(["run", "--ratio", str(mutant.ratio), "--json", str(path)], mutant, base)
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError):
        report = {}
    failed = failed_gates(report)
    if mutant.in_contract:
        ok = proc.returncode == 0
        detail = "passes (in contract)" if ok else f"exit {proc.returncode}: {failed}"
    else:
        ok = proc.returncode == 1 and mutant.expect in failed
        detail = (f"caught by {mutant.expect}" if ok else
                  f"exit {proc.returncode}, failed gates {list(failed)} (expected "
                  f"{mutant.expect})")
    if not ok and proc.returncode not in (0, 1):
        detail += ": " + ((proc.stderr or "").strip().splitlines() or ["?"])[-1]
    return Outcome(mutant, ok, detail, proc.returncode, failed)


# What the run-time proof judges in a mutated tree: a quick CPU run of a CPU-capable built-in
# (the self-tests run before it, whatever is judged).
RUNTIME_ARGS = ("run", "--impl", "decode", "--device", "cpu", "--ratio", "4", "--case",
                "r4/c1d128/overflow")


def judge_cpu(mutant: Mutant, base: Path) -> Outcome:
    """Run the mutant's ``cpu_test`` in its mutated tree: caught when the test fails (pytest
    exit 1); a passing test means the weakened gate went unnoticed. Then, for a mutant that
    names its ``selftest``, ``csagate run`` in the tree must stop before its verdict: exit 3
    with that self-test named among the failed ones."""
    tree = base / mutant.name / "tree"
    test_file, _, test = mutant.cpu_test.partition("::")
    node = str(tree / test_file) + (f"::{test}" if test else "")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                           node], cwd=base / mutant.name, env=env_for(mutant, base),
                          capture_output=True, text=True)
    if proc.returncode == 0:
        return Outcome(mutant, False, f"MISSED: {mutant.cpu_test} passes in the mutated tree",
                       0)
    if proc.returncode != 1:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or ["?"]
        return Outcome(mutant, False, f"pytest exit {proc.returncode}: {tail[0]}",
                       proc.returncode)
    detail = f"caught: {mutant.cpu_test} fails"
    if not mutant.selftest:
        return Outcome(mutant, True, detail, 1, (mutant.expect,))
    run = _run(list(RUNTIME_ARGS), mutant, base)
    said = " ".join(run.stderr.split())
    stopped = run.returncode == 3 and "self-test failed" in said and mutant.selftest in said
    if not stopped:
        return Outcome(mutant, False, f"{detail}; but at run time `csagate run` exit "
                       f"{run.returncode}, self-test {mutant.selftest!r} not named: "
                       f"{said[-200:]}", run.returncode)
    return Outcome(mutant, True, f"{detail}; at run time the self-test stops the verdict "
                   "(exit 3)", 3, (mutant.expect, "self-test"))


def select(names: list[str]) -> list[Mutant]:
    if not names:
        return list(MUTANTS)
    known = {m.name: m for m in MUTANTS}
    missing = [n for n in names if n not in known]
    if missing:
        raise SystemExit(f"unknown mutant(s) {missing}; known: {sorted(known)}")
    return [known[n] for n in names]


HEADER = """# Mutation self-test: the gate against planted bugs

Each row is one bug from `mutants/catalog.py` planted in a copy of the tree, built with a fresh
compile cache and judged by `csagate run --ratio R` (`make mutants`, or
`python mutants/run.py gate`). An out-of-contract mutant must exit 1 with the expected gate among
the failed ones; the in-contract one must pass. The CPU tests check that every mutant still
applies exactly once and builds.

"""


def report_md(outcomes: list[Outcome]) -> str:
    caught = sum(o.ok for o in outcomes)
    lines = [HEADER.rstrip() + f"\n\nThis run: {caught}/{len(outcomes)} as expected.\n",
             "| # | mutant | file | planted bug | expected | exit | failed gates | result |",
             "|---|---|---|---|---|---|---|---|"]
    for i, o in enumerate(outcomes, 1):
        m = o.mutant
        expect = f"in contract: {m.in_contract}" if m.in_contract else m.expect
        if not o.ok:
            result = "MISSED: " + o.detail
        else:
            result = "passes" if m.in_contract else "caught"
        code = "-" if o.exit_code is None else o.exit_code
        lines.append(f"| {i} | {m.name} | `{m.file}` | {m.why} | {expect} | {code} | "
                     f"{', '.join(o.failed) or '-'} | {result} |")
    return "\n".join(lines) + "\n"


CPU_HEADER = """## The gate's own logic (judged on the CPU)

A bug in the gate itself does not make `csagate run` fail on correct kernels by their cases
alone. So each gate-logic mutant is judged twice on the CPU, each time in its own copy of the
tree (a fresh process importing `csagate` from the copy; no GPU, no kernel build): the CPU test
that plants a fault the expected gate must catch (`tests/gate_backends.py`, reference-backed
backends) must fail there, and `csagate run` there (`{args}`) must stop before its
verdict with exit 3, naming the known-answer self-test (`gates/selftest.py`) that caught the
weakened machinery where it runs. `python mutants/run.py cpu --report FILE` writes this table;
`tests/test_mutants.py` runs every row in the CPU suite. `mutants/run.py gate` leaves them out.
"""


def report_cpu_md(outcomes: list[Outcome]) -> str:
    caught = sum(o.ok for o in outcomes)
    lines = [CPU_HEADER.format(args="csagate " + " ".join(RUNTIME_ARGS)),
             f"This run: {caught}/{len(outcomes)} caught both ways.\n",
             "| # | mutant | file | planted bug | expected | the CPU test that must fail | "
             "the self-test that stops the verdict | result |",
             "|---|---|---|---|---|---|---|---|"]
    for i, o in enumerate(outcomes, 1):
        m = o.mutant
        test = m.cpu_test.removeprefix("tests/")
        result = "caught both ways" if o.ok else "MISSED: " + o.detail
        lines.append(f"| {i} | {m.name} | `{m.file}` | {m.why} | {m.expect} | `{test}` | "
                     f"{m.selftest or '-'} | {result} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("check", "gate", "cpu"))
    ap.add_argument("names", nargs="*")
    ap.add_argument("--arch", default=None, help="check: cross-compile target (default sm_90a)")
    ap.add_argument("--jobs", type=int, default=max(1, min(4, (os.cpu_count() or 2) // 2)))
    ap.add_argument("--report", type=Path, help="gate, cpu: write the Markdown table here")
    ap.add_argument("--keep", action="store_true", help="keep the mutated trees")
    ap.add_argument("--sample", action="store_true",
                    help="check: build one mutant per kernel source file (the rest parse)")
    args = ap.parse_intermixed_args(argv)
    mutants = select(args.names)
    if args.mode in ("gate", "cpu"):
        judged = "gpu" if args.mode == "gate" else "cpu"
        mutants = [m for m in mutants if m.judge == judged]
        if not mutants:
            print(f"no mutant judged by `{args.mode}` among those named", file=sys.stderr)
            return 1
    base = Path(tempfile.mkdtemp(prefix="csagate-mutants-"))
    try:
        if args.mode == "check":   # the gate-logic mutants apply and parse (no kernel of theirs)
            chosen = sampled(mutants) if args.sample else {m.name for m in mutants}
            with ThreadPoolExecutor(args.jobs) as pool:
                outcomes = list(pool.map(
                    lambda m: build(m, base, args.arch or "sm_90a",
                                    m.name in chosen and m.judge == "gpu"), mutants))
        elif args.mode == "cpu":
            def one_cpu(m: Mutant) -> Outcome:
                try:
                    make_tree(m, base)
                except ValueError as exc:
                    return Outcome(m, False, str(exc))
                return judge_cpu(m, base)

            with ThreadPoolExecutor(args.jobs) as pool:
                outcomes = list(pool.map(one_cpu, mutants))
        else:  # each `csagate run` builds its own tree's kernels in its fresh cache
            def one(m: Mutant) -> Outcome:
                try:
                    make_tree(m, base)
                except ValueError as exc:
                    return Outcome(m, False, str(exc))
                outcome = judge(m, base)
                print(f"{m.name}: {outcome.detail}", file=sys.stderr, flush=True)
                return outcome

            with ThreadPoolExecutor(args.jobs) as pool:
                outcomes = list(pool.map(one, mutants))
        width = max(len(o.mutant.name) for o in outcomes)
        for o in outcomes:
            print(f"{'ok  ' if o.ok else 'FAIL'} {o.mutant.name:<{width}}  {o.detail}")
        bad = sum(not o.ok for o in outcomes)
        what = {"check": "checked", "gate": "as expected", "cpu": "caught on the CPU"}[
            args.mode]
        print(f"{len(outcomes) - bad}/{len(outcomes)} mutants {what}")
        if args.report is not None:
            write = report_cpu_md if args.mode == "cpu" else report_md
            args.report.write_text(write(outcomes))
        return 1 if bad else 0
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
