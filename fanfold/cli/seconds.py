"""A click type for seconds and other real numbers given on the command line."""

from __future__ import annotations

import math
from typing import Any

import click


class FiniteFloatRange(click.FloatRange):
    """``click.FloatRange`` that also refuses NaN and the infinities: every comparison
    with NaN is false, so a range alone lets ``nan`` through (a timer of NaN seconds),
    and a range with no upper bound lets ``inf`` through."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"must be a finite number of seconds, got {value}", param, ctx)
        return number
