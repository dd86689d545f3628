"""Plain-text tables and number formats for the terminal (plan, status) and markdown (reports)."""

from __future__ import annotations

import math


def table(headers: list[str], rows: list[list[str]], *, left: int = 1, markdown: bool = False) -> str:
    """Columns padded to their widest cell; the first ``left`` columns left-aligned, the rest right."""
    if markdown:
        lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(["---"] * len(headers)) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(lines)
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows)]

    def line(cells: list[str]) -> str:
        return "  ".join(
            str(c).ljust(w) if i < left else str(c).rjust(w) for i, (c, w) in enumerate(zip(cells, widths))
        ).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *[line(r) for r in rows]])


def si(value: float, digits: int = 3) -> str:
    """99_762_688 → ``99.8M``, 3e11 → ``300B``, 1.2e21 → ``1.2e21`` (beyond T, scientific)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            if abs(value) >= 1e15:
                return f"{value:.{digits - 1}e}"
            return f"{value / scale:.{digits}g}{unit}"
    return f"{value:.{digits}g}"


def nbytes(value: float) -> str:
    for unit, scale in (("PB", 1e15), ("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.0f} B"


def duration(seconds: float | None) -> str:
    """Seconds → ``45s``, ``12m``, ``3.4h``, ``12.5d``; None → ``–``."""
    if seconds is None or not math.isfinite(seconds):
        return "–"
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f}m"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def hours(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"
