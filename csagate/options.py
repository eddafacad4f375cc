"""Option types shared by the commands. No torch at parse time.

``FiniteFloat``: a float option that refuses NaN and the infinities (``click.FloatRange``
lets NaN through every bound, since every comparison with it is false), with an optional
range; a bad value is click's one-line usage error (exit 2).
"""

from __future__ import annotations

import math

import click


class FiniteFloat(click.ParamType):
    """A finite float in [``low``, ``high``] (``low_open``: above ``low``)."""

    name = "float"

    def __init__(self, low: float | None = None, high: float | None = None, *,
                 low_open: bool = False):
        self.low, self.high, self.low_open = low, high, low_open

    def convert(self, value, param, ctx):
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        if self.low is not None and (number <= self.low if self.low_open else
                                     number < self.low):
            self.fail(f"{value!r} must be {'>' if self.low_open else '>='} {self.low:g}",
                      param, ctx)
        if self.high is not None and number > self.high:
            self.fail(f"{value!r} must be <= {self.high:g}", param, ctx)
        return number
