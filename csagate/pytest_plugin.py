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
    from csagate.device_choice import Device, DeviceType

    if isinstance(device, Device):
        return device
    import click

    try:
        return DeviceType().convert(str(device), None, None)
    except click.BadParameter as exc:
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


def _unavailable_here(impl, device) -> str | None:
    """Why ``impl`` cannot be judged on ``device`` (the test is skipped), or None: the same
    checks as ``csagate run`` (the gate's own kernels' preflight, the implementation's own)."""
    import torch

    from csagate.gates.builtin_impls import kernels_unavailable
    from csagate.gates.implementation import load_builtin, unavailable

    own = type(impl) is type(load_builtin())
    if device.cpu:
        if own:
            return f"the gate's own kernels ({impl.name}) need a CUDA GPU"
        return unavailable(impl, torch.device("cpu"))
    if torch.cuda.is_available() and device.index >= torch.cuda.device_count():
        return f"cuda:{device.index} does not exist ({torch.cuda.device_count()} visible)"
    why = kernels_unavailable(device.torch())
    if why:
        return f"{why} (the drift check needs the gate's kernels)"
    return None if own else unavailable(impl, device.torch())


def _backends(impl, device):
    """(the driver judged, the drift check's driver or None, the drift check's n/a reason):
    the route ``csagate run`` takes (``impl_choice.route``), without its exits."""
    from csagate.impl_choice import route

    judged = route(impl, device)
    return judged.driver, judged.drift, judged.drift_na


def _build(backend, drift_backend, contract, cases) -> None:
    """Build what the drift check and ``cases`` reach (the drift check's with the gate's own
    kernels), as ``csagate run`` does before the gate."""
    from csagate.gates.runner import build_targets

    if backend is drift_backend:
        backend.build(build_targets(cases, contract.drift))
        return
    if drift_backend is not None:
        drift_backend.build(build_targets((), contract.drift))
    backend.build(build_targets(cases, None))


def _drift(drift_backend, contract) -> list[str]:
    """The drift check alone (fuzz trials without named cases, on a GPU): its failure lines."""
    from csagate.gates.runner import build_targets, run_drift

    drift_backend.build(build_targets((), contract.drift))
    result = run_drift(drift_backend, contract.drift)
    if result.ok:
        return []
    return [f"the reference drift check failed ({result.status}"
            f"{': ' + result.error if result.error else ''}): the fuzz trials were not run",
            *_listed(result.reasons, "  ")]


def _listed(lines: Sequence[str], indent: str = "  ") -> list[str]:
    shown = [indent + line for line in lines[:SHOWN]]
    if len(lines) > SHOWN:
        shown.append(f"{indent}... {len(lines) - SHOWN} more")
    return shown


def _envelope(impl, ratio: int):
    """What the fuzz trials draw from: ``impl``'s envelope at ``ratio``."""
    from csagate.gates import fuzz
    from csagate.gates.implementation import applies_of

    applies = applies_of(impl)
    env = fuzz.envelope(impl.supports, ratios=(ratio,),
                        deterministic=applies.deterministic and applies.backward)
    if not env.dims:
        raise ContractError(f"nothing to fuzz: {impl.name} ({impl.supports.text()}) and the "
                            f"kernels' envelope share no config at ratio {ratio}")
    return env


def _fuzz(backend, env, device, trials: int, seed: int) -> list[str]:
    """The message lines of the fuzz trials' failures (none when every trial passed)."""
    from csagate.gates import fuzz

    sizes = fuzz.CPU_SIZES if device.cpu else fuzz.CUDA_SIZES
    run = fuzz.fuzz(fuzz.Judge(backend), env, seed=seed, trials=trials, sizes=sizes)
    if run.ok:
        return []
    if not run.failed:
        return [f"FUZZ {run.state.upper()}: {run.inconclusive}/{len(run.trials)} trials judged "
                f"nothing (seed {seed})"]
    head = (f"FUZZ FAIL {run.failed}/{len(run.trials)} trials failed (seed {seed}); "
            f"{len(run.failures)} distinct failure(s), shrunk:")
    return [head, *_listed([f"{f.shrunk.case.name}: {', '.join(fuzz.failing(f.shrunk.result))}"
                            f" (trials {', '.join(map(str, f.trials))})" for f in run.failures])]


def _something_to_judge(impl, contract, chosen, fuzz_trials: int) -> None:
    """ContractError when the call could judge nothing: no case and no fuzz trial, or only
    cases that are n/a for ``impl`` (never a green test that judged nothing)."""
    from csagate.gates.plugin import applies_of

    if fuzz_trials:
        return
    if not chosen:
        raise ContractError("nothing to judge: no case and no fuzz trial (give cases or "
                            "fuzz_trials)")
    applies = applies_of(impl)
    if not any(applies.covers(c) for c in chosen):
        raise ContractError(f"nothing to judge at ratio={contract.ratio}: every chosen case is "
                            f"n/a for {impl.name} "
                            f"({applies.why_not(chosen[0]).removeprefix('n/a: ')})")


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
    """
    __tracebackhide__ = True
    from csagate.gates import selftest
    from csagate.gates.backend import BuildError
    from csagate.gates.implementation import ImplError
    from csagate.gates.runner import run_gate

    try:
        if fuzz_trials < 0:
            raise ContractError(f"fuzz_trials {fuzz_trials!r}: expected 0 or more")
        impl = _implementation(impl)
        dev = _device(device)
        contract = _contract(ratio)
        chosen = _cases(contract, cases)
        _something_to_judge(impl, contract, chosen, fuzz_trials)
        env = _envelope(impl, ratio) if fuzz_trials else None
        why = _unavailable_here(impl, dev)
    except (ContractError, ImplError) as exc:
        pytest.fail(f"csagate: {exc}", pytrace=False)
    if why:
        pytest.skip(f"csagate: {impl.name} cannot be judged on {dev}: {why}")
    backend, drift_backend, drift_na = _backends(impl, dev)
    try:
        selftest.ensure(backend.device)
    except selftest.SelfTestFailed as exc:
        pytest.fail(f"csagate: could not evaluate {impl.name} on {dev}: {exc}", pytrace=False)
    from csagate.gates.memory import too_large

    problem = too_large(chosen, backend.device)
    if problem:
        pytest.fail(f"csagate: could not evaluate {impl.name} on {dev}: {problem}",
                    pytrace=False)
    lines: list[str] = []
    verdict = None
    try:
        if chosen:
            _build(backend, drift_backend, contract, chosen)
            verdict = run_gate(backend, contract, cases=chosen, drift_backend=drift_backend,
                               drift_na=drift_na)
            if not verdict.ok:
                lines += ["  " + verdict.headline, *_listed(verdict.reasons, "    ")]
        if verdict is not None:
            trusted = verdict.drift.ok or not verdict.drift_run
        else:
            drift_lines = _drift(drift_backend, contract) if fuzz_trials and drift_backend \
                else []
            lines += ["  " + line for line in drift_lines]
            trusted = not drift_lines
        if fuzz_trials and trusted:
            lines += ["  " + line for line in _fuzz(backend, env, dev, fuzz_trials, fuzz_seed)]
    except BuildError as exc:
        pytest.fail(f"csagate: could not evaluate {impl.name} on {dev}: {exc} (nothing was "
                    "judged)", pytrace=False)
    if lines:
        pytest.fail("\n".join([f"csagate: {impl.name} fails the ratio={ratio} contract on "
                               f"{dev}", *lines]), pytrace=False)
    return verdict


@pytest.fixture
def csagate_contract():
    """:func:`check`: judge an implementation against the contract (or a fuzz budget);
    the test fails with each failing gate, one a line."""
    return check
