"""How one implementation is judged on one device: the questions every verdict asks before its
first case, answered in one place for ``run``, ``fuzz``, ``compare``, ``reference --check`` and
the pytest plugin. Nothing here prints or exits; each stop is a typed error of
``csagate.gates.errors`` that the caller maps (the CLI to an exit code, the plugin to a failed
or skipped test): :class:`~csagate.gates.errors.Unusable` (nothing to judge, no such device, an
adapter that cannot load: usage) or :class:`~csagate.gates.errors.CannotEvaluate` (it cannot be
judged here: the implementation or the gate's kernels cannot run on the device, a build, the
memory a case needs, a failed self-test).

* :class:`Device` (``parse_device``): ``cpu`` or ``cuda:N``.
* :func:`judging`: the implementation resolved once with the drivers it is judged through: on
  the CPU its driver and no drift check (which needs the production kernels); on a GPU the
  device checked once (:func:`preflight`: it exists and the gate's own kernels run there), then
  the implementation's availability, and one driver for both when it is the gate's own kernels.
* :func:`applicable`, :func:`envelope`: what of a request applies to the implementation.
* :class:`Judging`: ``build``, ``drift_check``, ``selftests`` and ``memory`` before the cases.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from time import perf_counter
from typing import Any

from csagate.gates.errors import CannotEvaluate, NoSuchDevice, NothingToJudge

# The drift check's reason on the CPU (the verdict's headline: "drift check " + this).
DRIFT_NA = "not run on the CPU, where the production ratio=4 kernels it needs cannot run"


@dataclass(frozen=True)
class Device:
    """Where to judge: the CPU, or CUDA device ``index``."""

    type: str                 # "cpu" | "cuda"
    index: int = 0            # the CUDA device index (0 on the CPU)

    @property
    def cpu(self) -> bool:
        return self.type == "cpu"

    def __str__(self) -> str:
        return "cpu" if self.cpu else f"cuda:{self.index}"

    def torch(self):
        import torch

        return torch.device("cpu") if self.cpu else torch.device("cuda", self.index)


def parse_device(value) -> Device:
    """``cpu``, ``cuda``, ``cuda:N`` or ``N`` (a CUDA device index); ValueError otherwise."""
    if isinstance(value, Device):
        return value
    text = str(value).strip().lower()
    if text == "cpu":
        return Device("cpu")
    if text == "cuda":
        return Device("cuda", 0)
    index = text.removeprefix("cuda:")
    if index.isdigit():
        return Device("cuda", int(index))
    raise ValueError(f"{value!r}: expected cpu, cuda, cuda:N or N (a CUDA device index >= 0)")


def load_builtin():
    """The gate's own kernels as an implementation (the drift check's)."""
    from csagate.gates.implementation import DEFAULT, builtins, load

    return load(builtins()[DEFAULT])


def preflight(device: Device, kernels):
    """The CUDA device ``device`` names, checked once: it exists (else NoSuchDevice) and
    ``kernels`` (the gate's own, which the drift check needs) run there (else CannotEvaluate
    with their one-line reason). No GPU is found before cutlass is imported."""
    import torch
    from csagate.gates.plugin import unavailable

    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        if device.index >= count:
            raise NoSuchDevice(f"device {device.index} does not exist ({count} CUDA device(s) "
                               f"visible: 0..{count - 1})")
    where = torch.device("cuda", device.index)
    why = unavailable(kernels, where)
    if why:
        raise CannotEvaluate(why)
    return where


@dataclass(frozen=True)
class Judging:
    """One implementation on one device, and the drivers it is judged through."""

    impl: Any
    device: Device
    driver: Any                 # csagate.gates.driver.Driver
    drift: Any | None           # the drift check's driver (the gate's own kernels); None: CPU
    drift_na: str | None        # why the drift check is not run

    @property
    def where(self) -> int | str:
        """The CUDA device index, or "cpu" (the reports' ``device_index``)."""
        return "cpu" if self.device.cpu else self.device.index

    def selftests(self):
        """The known-answer self-tests on the judging device (``selftest.ensure``)."""
        from csagate.gates import selftest

        return selftest.ensure(self.driver.device)

    def memory(self, cases: Sequence) -> None:
        """CannotEvaluate, with both numbers, when a case needs more memory than the device
        has free (``gates.memory``)."""
        from csagate.gates.memory import too_large

        problem = too_large(cases, self.driver.device)
        if problem:
            raise CannotEvaluate(problem)

    def build(self, families, progress=None) -> dict:
        """Build every kernel the families' cases can reach (the drift check's with the
        gate's own kernels): the record of the build. BuildError on a failure."""
        from csagate.gates.runner import build_targets

        start = perf_counter()
        targets: list = []
        for contract, cases in families:
            targets += [t for t in build_targets(cases, contract.drift) if t not in targets]
        records: list = []
        if self.drift is self.driver:
            records += self.drift.build(tuple(targets), progress=progress)
        else:
            if self.drift is not None:
                drift_targets = list(dict.fromkeys(
                    t for contract, _ in families for t in build_targets((), contract.drift)))
                records += self.drift.build(tuple(drift_targets), progress=progress)
            cases_targets = list(dict.fromkeys(
                t for _, cases in families for t in build_targets(cases, None)))
            records += self.driver.build(tuple(cases_targets), progress=progress)
        hits = sum(1 for r in records if getattr(r, "hit", False))
        return {"targets": [list(t) for t in targets], "kernels": len(records),
                "cache_hits": hits, "seconds": perf_counter() - start, "records": records}

    def drift_check(self, contract, progress=None):
        """The drift check alone (what runs before fuzz trials on a GPU): its CaseResult, or
        None on the CPU."""
        from csagate.gates.runner import build_targets, run_drift

        if self.drift is None:
            return None
        self.drift.build(build_targets((), contract.drift), progress=progress)
        return run_drift(self.drift, contract.drift)


def judging(impl, device: Device) -> Judging:
    """How ``impl`` is judged on ``device``: the checks first (CannotEvaluate when it cannot
    run there; NoSuchDevice), then the drivers."""
    from csagate.gates.driver import Driver
    from csagate.gates.plugin import unavailable

    if device.cpu:
        import torch

        why = unavailable(impl, torch.device("cpu"))
        if why:
            raise CannotEvaluate(f"{impl.name} cannot run on the CPU: {why}")
        return Judging(impl, device, Driver(impl, torch.device("cpu")), None, DRIFT_NA)
    kernels = load_builtin()
    where = preflight(device, kernels)
    if type(impl) is type(kernels):          # the gate's own kernels: one driver for both
        driver = Driver(impl, where)
        return Judging(impl, device, driver, driver, None)
    why = unavailable(impl, where)
    if why:
        raise CannotEvaluate(f"{impl.name}: {why}")
    return Judging(impl, device, Driver(impl, where), Driver(kernels, where), None)


def applicable(impl, families, *, chosen: bool) -> tuple[list, list]:
    """(the families with a case that applies to ``impl``, the others); NothingToJudge when
    none is left. ``chosen``: the cases were picked by name or file (the hint says so)."""
    from csagate.gates.plugin import applies_of

    applies = applies_of(impl)
    kept, left = [], []
    for contract, cases in families:
        (kept if any(applies.covers(c) for c in cases) else left).append((contract, cases))
    if not kept:
        contract, cases = left[0] if left else (None, ())
        if not cases:
            raise NothingToJudge("nothing to judge: no case was selected")
        what = (f"{cases[0].name} is n/a" if len(cases) == 1 else
                f"all {len(cases)} selected cases of ratio={contract.ratio} are n/a")
        hint = " (pick cases that apply, or leave out --case)" if chosen else \
            " (pick a --ratio the implementation supports)"
        raise NothingToJudge(f"nothing to judge: {what} for {impl.name}: "
                             f"{applies.why_not(cases[0]).removeprefix('n/a: ')}{hint}")
    return kept, left


def why_not(impl, case) -> str:
    """Why ``case`` is n/a for ``impl`` (one line, without the ``n/a:``)."""
    from csagate.gates.plugin import applies_of

    return applies_of(impl).why_not(case).removeprefix("n/a: ")


def envelope(impl, ratios: tuple[int, ...] | None):
    """What fuzz trials draw from: ``impl``'s envelope at ``ratios`` (None: every family);
    NothingToJudge when it shares no config with the kernels' host API."""
    from csagate.gates import fuzz
    from csagate.gates.plugin import applies_of

    applies = applies_of(impl)
    env = fuzz.envelope(impl.supports, ratios=ratios,
                        deterministic=applies.deterministic and applies.backward)
    if not env.dims:
        where = "any ratio" if ratios is None else \
            "ratio " + "/".join(map(str, ratios))
        raise NothingToJudge(f"nothing to fuzz: {impl.name} ({impl.supports.text()}) and the "
                             f"kernels' envelope share no config at {where}")
    return env
