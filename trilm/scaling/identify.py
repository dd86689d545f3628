"""Whether fitted laws are *identified*: the rule across several fits, and the losses that show why not.

A fit always returns numbers; whether the data pin down a law is decided where the fit is made. Each law's
rules (:meth:`trilm.scaling.laws.base.Law.plausibility`: exponents in (0, 2] and off the top of the box, a
floor below the lowest loss and not collapsed, new lows at 3 or more sizes, more sizes than parameters,
terms the data see) and the bootstrap's (:func:`trilm.scaling.fitter.interval_reasons`: exponent intervals
finite, with width and above 0, a floor interval clear of the lowest loss) fill
:attr:`trilm.scaling.fitter.Fit.reasons`. What is left here needs several fits at once: along the runs of
one family, L(D) fits whose E rises with N (:func:`implausible_family`).

What is not identified is reported as such, with the reasons and the loss by size that show them
(:func:`loss_by_point`); it is not drawn, not printed as a law, and not used to match sizes between
families.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from trilm.scaling.report_types import FittedPoints

SYMBOLS = {"alpha": "α", "beta": "β"}


def implausible_family(
    fits: dict[str, FittedPoints], sizes: dict[str, float], tol: float = 0.0
) -> dict[str, str]:
    """Runs of one family whose L(D) fits are not physical together: E along a run is the loss that run's
    model would reach with unlimited data, so it cannot rise with model size. Every run of a pair where it
    does is named, with the pair (``{run: reason}``); ``sizes`` gives each run's N."""
    ordered = sorted((sizes[r], r) for r in fits)
    out: dict[str, str] = {}
    for i, (n_a, a) in enumerate(ordered):
        for n_b, b in ordered[i + 1 :]:
            e_a, e_b = fits[a].fit.params["E"], fits[b].fit.params["E"]
            if n_b > n_a and e_b > e_a + tol:
                why = (
                    f"E rises with N in the family ({a}: E = {e_a:.4g} → the larger {b}: E = {e_b:.4g}; a"
                    " larger model cannot have a higher loss at unlimited data)"
                )
                out.setdefault(a, why)
                out.setdefault(b, why)
    return out


def loss_by_point(law: FittedPoints) -> str:
    """``nano 4.894, mini 5.095, tiny 5.085``: the losses that show why (lowest per label, by x)."""
    first = next(iter(law.inputs.values()))
    order = np.argsort(first, kind="stable")
    seen: dict[str, float] = {}
    for i in order:
        label = law.labels[i]
        seen[label] = min(float(law.loss[i]), seen.get(label, np.inf))
    return ", ".join(f"{label} {loss:.4f}" for label, loss in seen.items())


__all__ = ["SYMBOLS", "implausible_family", "loss_by_point"]
