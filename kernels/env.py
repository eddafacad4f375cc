"""The environment variables csagate reads, parsed strictly in one place.

A boolean accepts 1/0, true/false, yes/no, on/off (any case, surrounding spaces ignored);
unset or empty is the default. Anything else raises :class:`EnvError` (a ``ValueError``)
naming the variable; the CLI checks every variable of :data:`KNOWN` before a command starts
and turns the error into one usage line (exit 2). Stdlib only; it lives beside the kernels,
the lowest layer that reads one (the disk-cache switch), so no layer reaches up for it.
"""

from __future__ import annotations

import os

TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")


class EnvError(ValueError):
    """An environment variable holds a value csagate does not accept."""


def flag(name: str, default: bool = False) -> bool:
    """The boolean ``name``: ``default`` when unset or empty, else one of TRUE/FALSE."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    value = raw.strip().lower()
    if value in TRUE:
        return True
    if value in FALSE:
        return False
    raise EnvError(f"{name}={raw!r} is not one of {'/'.join(TRUE + FALSE)}")


def integer(name: str, minimum: int | None = None) -> int | None:
    """The integer ``name`` (None when unset or empty)."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return None
    try:
        value = int(raw.strip(), 10)
    except ValueError:
        raise EnvError(f"{name}={raw!r} is not an integer") from None
    if minimum is not None and value < minimum:
        raise EnvError(f"{name}={raw!r} must be >= {minimum}")
    return value


def debug() -> bool:
    """``CSAGATE_DEBUG``: show tracebacks (the exit code stays what it would be)."""
    return flag("CSAGATE_DEBUG")


def disk_cache() -> bool:
    """``CSAGATE_DISK_CACHE``: keep compiled kernels on disk (default on)."""
    return flag("CSAGATE_DISK_CACHE", default=True)


def cudnn_min_cc() -> int | None:
    """``CSAGATE_MEASURE_CUDNN_MIN_CC``: the measurement-only compute-capability major."""
    return integer("CSAGATE_MEASURE_CUDNN_MIN_CC", minimum=0)


# Every variable the CLI validates up front: name -> its reader.
KNOWN = {"CSAGATE_DEBUG": debug, "CSAGATE_DISK_CACHE": disk_cache,
         "CSAGATE_MEASURE_CUDNN_MIN_CC": cudnn_min_cc}


def check_all() -> None:
    """Raise EnvError for the first known variable with a bad value."""
    for read in KNOWN.values():
        read()
