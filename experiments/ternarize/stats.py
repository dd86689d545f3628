"""Means with Student's t intervals over seeds, shared by the experiment's two reports."""

from __future__ import annotations

import math

T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}
"""Student's t 97.5 % quantiles by degrees of freedom (two-sided 95 % intervals)."""


def mean_interval(values: list[float]) -> tuple[float, float | None]:
    """(mean, half-width of the 95 % t interval); no interval from a single value."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, None
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, T_975.get(n - 1, 1.96) * sd / math.sqrt(n)
