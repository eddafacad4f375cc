"""Which of csagate's modules one call walks through (issue: one host path per call).

:func:`walk` runs a call under ``sys.setprofile`` and records, for the Python functions of
``csagate.*`` it enters, each module in first-entry order and every re-entry: a module entered
again after the call had left it (no frame of it on the stack any more). A module's own helpers,
called while one of its frames is still on the stack, are not re-entries. Only the calling
thread is traced (autograd runs a CUDA backward on a thread of its own: call the Function's
``backward`` directly to walk it).

:data:`HOST_PATH` names the modules of the launch path (the op, the api, the launch, the
validation, the dispatch); the rest a call reaches are the kernels' own (registry, schedules,
compile cache, the kernel modules' launchers). Nothing here prints.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field

HOST_PATH = tuple(f"csagate.kernels.{m}" for m in ("ops", "api", "launch", "validate",
                                                    "dispatch"))


@dataclass
class Walk:
    entered: list[str] = field(default_factory=list)    # modules, first-entry order
    reentered: list[str] = field(default_factory=list)  # modules entered again after leaving

    def on(self, modules) -> Walk:
        """The same walk seen through ``modules`` only."""
        keep = set(modules)
        return Walk([m for m in self.entered if m in keep],
                    [m for m in self.reentered if m in keep])


def walk(call: Callable[[], object], prefix: str = "csagate.") -> Walk:
    """Run ``call`` and return the modules under ``prefix`` it walked (see the module doc)."""
    seen = Walk()
    stack: list[str] = []   # the module of each traced frame, innermost last
    left: set[str] = set()  # modules with no frame on the stack since one was

    def profile(frame, event, arg):
        if event not in ("call", "return"):
            return
        module = frame.f_globals.get("__name__", "")
        if not module.startswith(prefix):
            return
        if event == "call":
            if module in left:
                seen.reentered.append(module)
                left.discard(module)
            elif module not in seen.entered:
                seen.entered.append(module)
            stack.append(module)
        elif stack:
            done = stack.pop()
            if done not in stack:
                left.add(done)

    old = sys.getprofile()
    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(old)
    return seen
