"""Numbers as the verdict rule and every report print them: one place, so that a verdict's
reason, a table and a figure say the same number the same way."""

from __future__ import annotations

import math


def fmt(x: float | int | None, digits: int = 3) -> str:
    """3 significant digits for small values, thousands separators for large ones."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if isinstance(x, (int,)) or (abs(x) >= 1000 and float(x).is_integer()):
        return f"{int(x):,}"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{digits}g}" if x != 0 else "0"


def fmt_signed(x: float) -> str:
    """A difference with its sign: '+0.0653', '-0.0653', '0'."""
    return ("+" if x > 0 else "") + fmt(x)


def level_text(level: float) -> str:
    """A confidence level as a percentage with the digits its alpha needs: 95%, 97.5%, 99.997%."""
    for digits in range(8):
        text = f"{level * 100:.{digits}f}"
        if abs(float(text) - level * 100) <= 0.05 * (1 - level) * 100:
            return f"{text}%"
    return f"{level:.10%}"
