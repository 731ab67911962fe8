"""Click parameter types the command lines of all three roles share."""
from __future__ import annotations

import math
from typing import Any

import click


class FiniteFloatRange(click.FloatRange):
    """click.FloatRange that also refuses `nan` and `inf`: nan passes every range comparison,
    and an infinite timeout or delay is a wait that never ends."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


__all__ = ["FiniteFloatRange"]
