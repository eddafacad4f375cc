"""How the gate and the CLI name a failure: the build error, and any exception in one line.

Pure Python (no torch): the CLI's console imports it.
"""

from __future__ import annotations

import re


class BuildError(RuntimeError):
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
