"""Which kernels ``csagate build`` and ``csagate probe`` work on: ``--ratio`` (the kernel
families), ``--arch`` (the build target, this machine's GPU's by default), the DSL check both
make first, and the one JSON shape both print (``--json``)."""

from __future__ import annotations

import json

import click

from csagate import console
from csagate.exitcodes import ExitCode
from csagate.kernels.registry import RATIOS, SMALL_RATIOS, TABLE_RATIO
from csagate.kernels.schedule import ARCHES

RATIO_CHOICES = (*(str(r) for r in RATIOS), "all")
ARCH_CHOICES = ARCHES
FALLBACK_ARCH = "sm_100a"
ARCH_HELP = ("Build target [default: this machine's GPU (sm_90a on an H200, sm_100a on a B200); "
             f"with no supported GPU, {FALLBACK_ARCH}]. No GPU is needed to cross-compile.")
KERNELS_SCHEMA = "csagate.kernels/1"


def ratios_of(choice: str) -> tuple[int, ...]:
    return RATIOS if choice == "all" else (int(choice),)


def keys_of(ratio: str, arch: str) -> list:
    """Every kernel key of the families ``--ratio`` names, for ``arch``, in build order."""
    from csagate.kernels.cache import keys_for

    return [key for r in ratios_of(ratio) for key in keys_for(r, arch)]


def require_dsl() -> None:
    """Exit 3 with one line when nvidia-cutlass-dsl does not import."""
    from csagate.kernels._dsl import dsl_available

    ok, why = dsl_available()
    if not ok:
        console.abort(why, ExitCode.COULD_NOT_EVALUATE)


def gpu_arch() -> str | None:
    """The build target of the current GPU; None without one (or one we do not build for)."""
    import torch

    if not torch.cuda.is_available():
        return None
    from csagate.kernels._dsl import device_arch

    arch = device_arch()
    return arch if arch in ARCHES else None


def resolve_arch(arch: str | None) -> str:
    """``--arch`` of `build` and `probe`: as given, else this machine's GPU's, else sm_100a
    (said on stderr, so a cross-compile is never silent)."""
    if arch is not None:
        return arch
    found = gpu_arch()
    if found is not None:
        return found
    console.err().print(f"no supported GPU here: cross-compiling for {FALLBACK_ARCH} "
                        "(--arch sm_90a for the H200)")
    return FALLBACK_ARCH


def ratio_option(fn):
    """``--ratio R|all``: the kernel families to build or probe (build and probe alike)."""
    return click.option("--ratio", type=click.Choice(RATIO_CHOICES), default="all",
                        show_default=True,
                        help=f"the small ratios ({', '.join(map(str, SMALL_RATIOS))}): the "
                             "coff 1/2 x d 65/128/512 they serve (vec=1, vec=2, drift d); "
                             f"ratio={TABLE_RATIO}: the kernels of the dispatch tables.")(fn)


def arch_option(fn):
    return click.option("--arch", type=click.Choice(ARCH_CHOICES), default=None,
                        help=ARCH_HELP)(fn)


def kernel_json(key) -> dict:
    """The fields `build --json` and `probe --json` share for one kernel."""
    import dataclasses

    sched = key.schedule
    schedule = {"tag": getattr(sched, "tag", str(sched))}
    if dataclasses.is_dataclass(sched):
        schedule |= dataclasses.asdict(sched)
    return {"tag": key.tag, "kind": key.kind, "direction": key.direction, "ratio": key.ratio,
            "config": key.config, "coff": key.coff, "d": key.d, "arch": key.arch,
            "deterministic": key.deterministic, "schedule": schedule}


def kernels_doc(command: str, ratio: str, arch: str, kernels: list[dict], **extra) -> str:
    """The one JSON shape of `build --json` and `probe --json`."""
    return json.dumps({"schema": KERNELS_SCHEMA, "command": command, "ratio": ratio,
                       "arch": arch, **extra, "kernels": kernels})
