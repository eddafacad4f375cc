"""Process exit codes: what a CI job can branch on."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    PASS = 0                 # every gate passed
    CONTRACT_FAILURE = 1     # something was evaluated and failed
    USAGE = 2                # bad arguments (click's own usage errors exit 2 too), an --impl
    #                          adapter that cannot be loaded (whatever it raised, exits included)
    COULD_NOT_EVALUATE = 3   # no GPU, no DSL, build failure, a failed self-test, nothing
    #                          judged (every case n/a or inconclusive): no verdict
    INTERRUPTED = 130        # Ctrl-C (SIGINT): stopped before a verdict (128 + SIGINT, as shells)

    @classmethod
    def help_text(cls) -> str:
        return ("Exit codes: 0 pass, 1 contract failure, 2 usage error (nothing to judge "
                "included), 3 could not evaluate (no GPU, missing DSL, build failure, a failed "
                "self-test, nothing judged, an internal error), 130 interrupted (Ctrl-C).")

    @classmethod
    def listing(cls, **codes: str) -> str:
        """A command's own ``Exit codes: 0 ..., 2 ...`` epilog (what each code means there;
        130 is always Ctrl-C)."""
        parts = [f"{int(cls[name.rstrip('_').upper()])} {what}" for name, what in codes.items()]
        return "Exit codes: " + ", ".join(parts) + ", 130 interrupted (Ctrl-C)."

    @classmethod
    def worse(cls, a: ExitCode, b: ExitCode) -> ExitCode:
        """The code of two verdicts together (``--ratio all``): a contract failure outranks
        a verdict that could not be reached, which outranks a pass."""
        order = (cls.PASS, cls.COULD_NOT_EVALUATE, cls.CONTRACT_FAILURE)
        return max(a, b, key=order.index)
