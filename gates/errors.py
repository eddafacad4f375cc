"""How the gate names what stops it, and any exception in one line.

Two kinds of stop, each a type the CLI and the pytest plugin map (to an exit code, a failed or
skipped test) and never decide themselves:

* :class:`Unusable` (a ``ValueError``): the request itself judges nothing or names nothing
  that exists: :class:`NothingToJudge`, :class:`NoSuchDevice` (usage, exit 2);
* :class:`CannotEvaluate` (a ``RuntimeError``): the request is fine, but nothing can be judged
  here: the implementation or the gate's kernels cannot run on the device, a build failed
  (:class:`BuildError`), a case needs more memory than the device has, a self-test gave a
  wrong answer (``selftest.SelfTestFailed``) (exit 3).

Pure Python (no torch): the CLI's console imports it.
"""

from __future__ import annotations

import re


class Unusable(ValueError):
    """The request judges nothing or names nothing that exists (a usage error)."""


class NothingToJudge(Unusable):
    """Every selected case is ``n/a`` for the implementation, or nothing was selected."""


class NoSuchDevice(Unusable):
    """``cuda:N`` names a device that does not exist."""


class CannotEvaluate(RuntimeError):
    """Nothing can be judged here (exit 3, not a contract failure)."""


class BuildError(CannotEvaluate):
    """A kernel failed to build: nothing can be judged (exit 3, not a contract failure)."""


_OOM = re.compile(r"CUDA out of memory\.")
_OOM_SIZES = (re.compile(r"Tried to allocate [\d.]+ \w+"),
              re.compile(r"GPU \d+ has a total capacity of [\d.]+ \w+ of which [\d.]+ \w+ is "
                         r"free"))


def short_error(text: str) -> str:
    """An error message as a row or a line shows it: torch's many-sentence CUDA out-of-memory
    message keeps its first sentence and the sizes; anything else is unchanged."""
    found = _OOM.search(text)
    if not found:
        return text
    sizes = [m.group(0) for pattern in _OOM_SIZES if (m := pattern.search(text))]
    return text[:found.end()] + "".join(f" {size}." for size in sizes)


def one_line(exc: BaseException) -> str:
    """``Type: first line of the message`` (what a FAIL row or an exit-3 line shows)."""
    text = str(exc).strip().splitlines()
    return short_error(f"{type(exc).__name__}: {text[0]}") if text else type(exc).__name__
