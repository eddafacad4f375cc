"""``csagate_contract``: hold an implementation to the contract from your own test suite.

Registered with pytest's ``pytest11`` entry point, so the fixture is there wherever csagate is
installed::

    def test_my_kernel_meets_the_contract(csagate_contract):
        csagate_contract("my_pkg.adapter:Mine", ratio=4, cases=["r4/c1d128/overflow"],
                         fuzz_trials=20, fuzz_seed=7)

The fixture is a callable, :func:`check`. It judges the implementation with the family's
named cases (``csagate.gates.runner.run_gate``, as ``csagate run`` does), then, with
``fuzz_trials``, that many seeded fuzz trials of the same ratio (``csagate.gates.fuzz``, as
``csagate fuzz`` does). A failure fails the test with one line per failing gate and one per
shrunk fuzz failure; an implementation that cannot run on ``device`` (no GPU, its
``unavailable`` hook) skips it with the reason. On a GPU the drift check runs first; on the
CPU it is not run (it needs the production kernels), as with ``--device cpu``.

Nothing here imports torch until the fixture is called: the plugin loads in every pytest run
of an environment that has csagate.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

# How many verdict reasons and fuzz failures a failure message lists before "... N more".
SHOWN = 20


class ContractError(ValueError):
    """A bad argument to the check (an unknown case, ratio or implementation)."""


def _implementation(impl):
    """The implementation object of ``impl``: an ``--impl`` string, a class or a factory, or
    the object itself, checked as the CLI checks one (``ImplError``: one line)."""
    from csagate.gates.implementation import Found, load, resolve

    if isinstance(impl, str):
        return load(resolve(impl))
    where = getattr(impl, "__qualname__", None) or type(impl).__qualname__
    return load(Found(where, "object", lambda: impl))


def _device(device):
    from csagate.gates.judging import parse_device

    try:
        return parse_device(device)
    except ValueError as exc:
        raise ContractError(f"device {device!r}: expected cpu, cuda, cuda:N or N") from exc


def _contract(ratio: int):
    from csagate.gates.contracts import CONTRACTS

    if ratio not in CONTRACTS:
        raise ContractError(f"ratio {ratio!r}: no contract family; one of "
                            + ", ".join(str(r) for r in sorted(CONTRACTS)))
    return CONTRACTS[ratio]


def _cases(contract, cases) -> tuple:
    """The contract's cases ``cases`` names (names or ``Case`` objects), in contract order."""
    if cases is None:
        return contract.all_cases
    if isinstance(cases, str):
        cases = (cases,)
    import difflib

    from csagate.gates.contracts import CONTRACTS

    valid = [c.name for c in contract.all_cases]
    wanted = []
    for case in cases:
        name = getattr(case, "name", case)
        if name not in valid:
            text = f"unknown case {name!r} at ratio={contract.ratio}."
            other = [k.ratio for k in CONTRACTS.values() if name in {c.name for c in k.all_cases}]
            close = difflib.get_close_matches(str(name), valid, n=3)
            if other:
                text += f" It is a case of ratio={other[0]}: pass ratio={other[0]}."
            elif close:
                text += f" Did you mean {', '.join(repr(c) for c in close)}?"
            raise ContractError(text + " `csagate cases --ratio all` lists them.")
        wanted.append(name)
    return tuple(c for c in contract.all_cases if c.name in set(wanted))


def _listed(lines: Sequence[str], indent: str = "  ") -> list[str]:
    shown = [indent + line for line in lines[:SHOWN]]
    if len(lines) > SHOWN:
        shown.append(f"{indent}... {len(lines) - SHOWN} more")
    return shown


def _fuzz(driver, env, device, trials: int, seed: int) -> list[str]:
    """The message lines of the fuzz trials' failures (none when every trial passed)."""
    from csagate.gates import fuzz

    sizes = fuzz.CPU_SIZES if device.cpu else fuzz.CUDA_SIZES
    run = fuzz.fuzz(fuzz.Judge(driver), env, seed=seed, trials=trials, sizes=sizes)
    if run.ok:
        return []
    if not run.failed:
        return [f"FUZZ {run.state.upper()}: {run.inconclusive}/{len(run.trials)} trials judged "
                f"nothing (seed {seed})"]
    head = (f"FUZZ FAIL {run.failed}/{len(run.trials)} trials failed (seed {seed}); "
            f"{len(run.failures)} distinct failure(s), shrunk:")
    return [head, *_listed([f"{f.shrunk.case.name}: {', '.join(fuzz.failing(f.shrunk.result))}"
                            f" (trials {', '.join(map(str, f.trials))})" for f in run.failures])]


def check(impl: Any, *, ratio: int = 4, device: Any = "cpu",
          cases: Sequence[Any] | str | None = None, fuzz_trials: int = 0, fuzz_seed: int = 0):
    """Judge ``impl`` against the ratio's contract on ``device``; ``pytest.fail`` on a failure.

    ``impl``: an implementation object, its class (or a factory), or an ``--impl`` string
    (``name``, ``path/to/file.py:NAME``, ``module:NAME``). ``cases``: the family's case names
    (or ``Case`` objects) to run, default all of them (then schedule coverage is asserted
    when the implementation has the dispatch hooks); ``()``: none, the fuzz trials only.
    ``fuzz_trials``: that many fuzz trials of seed ``fuzz_seed`` at ``ratio`` after the cases,
    failures shrunk (on a GPU only once the drift check passed, as ``csagate fuzz``). Returns
    the verdict of the named cases (None when none ran).

    The questions before the first case are ``csagate.gates.judging``'s, as for ``csagate
    run``: a call that would judge nothing fails (no case and no trial, or only n/a cases); an
    implementation that cannot run on ``device`` skips the test with the reason; a failed
    self-test, a case too large for the device or a build failure fails it (could not
    evaluate).
    """
    __tracebackhide__ = True
    from csagate.gates import judging
    from csagate.gates.errors import CannotEvaluate, NothingToJudge, Unusable
    from csagate.gates.plugin import ImplError
    from csagate.gates.runner import run_gate

    problem = judged = None
    try:
        if fuzz_trials < 0:
            raise ContractError(f"fuzz_trials {fuzz_trials!r}: expected 0 or more")
        impl = _implementation(impl)
        dev = _device(device)
        contract = _contract(ratio)
        chosen = _cases(contract, cases)
        if not fuzz_trials:
            if not chosen:
                raise ContractError("nothing to judge: no case and no fuzz trial (give cases "
                                    "or fuzz_trials)")
            judging.applicable(impl, [(contract, chosen)], chosen=cases is not None)
        env = judging.envelope(impl, (ratio,)) if fuzz_trials else None
    except (ContractError, ImplError, NothingToJudge) as exc:
        problem = f"csagate: {exc}"
    if problem is not None:    # outside the except: no "During handling of ..." chain
        pytest.fail(problem, pytrace=False)
    try:
        judged = judging.judging(impl, dev)
    except (CannotEvaluate, Unusable) as exc:
        problem = f"csagate: {impl.name} cannot be judged on {dev}: {exc}"
    if problem is not None:
        pytest.skip(problem)
    lines: list[str] = []
    verdict = None
    try:
        judged.selftests()
        judged.memory(chosen)
        if chosen:
            judged.build([(contract, chosen)])
            verdict = run_gate(judged.driver, contract, cases=chosen,
                               drift_driver=judged.drift, drift_na=judged.drift_na)
            if not verdict.ok:
                lines += ["  " + verdict.headline, *_listed(verdict.reasons, "    ")]
            trusted = verdict.drift.ok or not verdict.drift_run
        else:
            drift = judged.drift_check(contract) if fuzz_trials else None
            trusted = drift is None or drift.ok
            if not trusted:
                lines += [f"  the reference drift check failed ({drift.status}"
                          f"{': ' + drift.error if drift.error else ''}): the fuzz trials "
                          "were not run", *_listed(drift.reasons, "    ")]
        if fuzz_trials and trusted:
            lines += ["  " + line for line in _fuzz(judged.driver, env, dev, fuzz_trials,
                                                    fuzz_seed)]
    except CannotEvaluate as exc:
        problem = (f"csagate: could not evaluate {impl.name} on {dev}: {exc} (nothing was "
                   "judged)")
    if problem is not None:
        pytest.fail(problem, pytrace=False)
    if lines:
        pytest.fail("\n".join([f"csagate: {impl.name} fails the ratio={ratio} contract on "
                               f"{dev}", *lines]), pytrace=False)
    return verdict


@pytest.fixture
def csagate_contract():
    """:func:`check`: judge an implementation against the contract (or a fuzz budget);
    the test fails with each failing gate, one a line."""
    return check
