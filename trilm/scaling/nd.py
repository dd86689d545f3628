"""L(N, D) on chosen points and its predictions with bootstrap intervals: the test of a scaling law is whether
it predicts runs it has not seen.

:func:`fit_nd` fits E + A/N^α + B/D^β (Chinchilla approach 3, the Huber objective in log space of
:mod:`trilm.scaling.fit`) to the given checkpoints, bootstraps it by resampling *units* with replacement —
lineages (a run with its cooldown branches, which share their training before each branch point), so the
interval counts how much the law depends on which sizes were measured — and checks whether the data
identify it (:mod:`trilm.scaling.identify`). :func:`predict` gives the fitted loss at any (N, D) with the
percentile interval of the refitted laws there.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from trilm.scaling.bootstrap import bootstrap_many, point_weights, unit_counts
from trilm.scaling.fit import FitError, FitResult, fit_many
from trilm.scaling.identify import identify
from trilm.scaling.results import LawFit
from trilm.scaling.table import ResultRow


def fit_nd(
    points: list[ResultRow],
    *,
    x: str = "params",
    units: list[str] | None = None,
    bootstrap: int = 1000,
    seed: int = 0,
    level: float = 0.95,
    label: str = "L(N, D)",
) -> LawFit:
    """Fit L(N, D) to ``points`` (N = the column ``x``, D = tokens), bootstrap it over ``units`` (one per
    point; default: each point's run) and identify it. Raises :class:`FitError` when it cannot be fitted."""
    inputs = {
        "N": np.array([getattr(r, x) for r in points], float),
        "D": np.array([r.tokens for r in points], float),
    }
    loss = np.array([r.loss for r in points], float)
    result = fit_many("ND", [(inputs, loss)], labels=[label])[0]
    assert isinstance(result, FitResult)  # errors="raise": a failed fit raised
    law = LawFit(
        label=label, fit=result, inputs=inputs, loss=loss, labels=[f"{r.run}@{r.step}" for r in points]
    )
    if bootstrap:
        units = list(units) if units is not None else [r.run for r in points]
        counts, unit_list = unit_counts(units, bootstrap, seed)
        weights = point_weights(units, counts, unit_list)
        boot = bootstrap_many([result], [(inputs, loss)], [weights], seed=seed, level=level, labels=[label])[
            0
        ]
        if isinstance(boot, FitError):
            law.identification = None
        else:
            law.bootstrap = boot
    law.identification = identify(law, "sizes")
    return law


@dataclasses.dataclass(frozen=True)
class Prediction:
    n: float
    d: float
    predicted: float
    lo: float | None
    hi: float | None

    def contains(self, value: float) -> bool | None:
        return None if self.lo is None or self.hi is None else bool(self.lo <= value <= self.hi)

    def to_dict(self) -> dict[str, Any]:
        return {
            "N": self.n,
            "D": self.d,
            "predicted": self.predicted,
            "interval": None if self.lo is None else [self.lo, self.hi],
        }


def predict(law: LawFit, n: float, d: float, level: float | None = None) -> Prediction:
    """The law's loss at (n, d) and the percentile interval of its bootstrap refits there (at the bootstrap's
    level unless ``level`` is given)."""
    value = float(law.fit.predict(N=n, D=d))
    boot = law.bootstrap
    if boot is None or boot.n_ok < 10:
        return Prediction(n, d, value, None, None)
    samples = boot.predict(N=np.array([n]), D=np.array([d]))[:, 0]
    tail = 100 * (1 - (level if level is not None else boot.level)) / 2
    lo, hi = np.percentile(samples, [tail, 100 - tail])
    return Prediction(n, d, value, float(lo), float(hi))
