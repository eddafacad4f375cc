"""The environment variables csagate reads, parsed strictly. A boolean is 1/0, true/false, yes/no
or on/off (any case); unset or empty means the default; any other value raises EnvError."""

from __future__ import annotations

import os

TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")


class EnvError(ValueError):
    """A bad value, named with its variable; the CLI runs check_all first (usage line, exit 2)."""


def flag(name: str, default: bool = False) -> bool:
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


KNOWN = {"CSAGATE_DEBUG": debug, "CSAGATE_DISK_CACHE": disk_cache,
         "CSAGATE_MEASURE_CUDNN_MIN_CC": cudnn_min_cc}


def check_all() -> None:
    for read in KNOWN.values():
        read()
