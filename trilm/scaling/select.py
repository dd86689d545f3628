"""Choose between size laws by how well each predicts points it did not see.

Each candidate is fitted without the points of the largest D and scored on them, the direction in which a
suite's law is asked to predict. An in-sample fit would favour the law with most freedom: in the cooldown
experiment Kaplan's fits had smaller residuals than the additive law's and predicted worse.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np

from trilm.config import Config, require
from trilm.scaling.errors import FitError
from trilm.scaling.fitter import HUBER_DELTA, fit
from trilm.scaling.laws import LAWS, SizeLaw


def nd_laws() -> list[str]:
    """The registered laws of the loss over (N, D) alone."""
    return [name for name, law in LAWS.items() if isinstance(law, SizeLaw) and law.inputs == ("N", "D")]


@dataclasses.dataclass
class SelectionConfig(Config):
    """Which laws compete and on which held-out points: ``largest_d`` scores each law, fitted without the
    points of the largest D, on those points."""

    laws: list[str] = dataclasses.field(default_factory=nd_laws)
    holdout: Literal["largest_d"] = "largest_d"
    starts: Literal["full", "coarse"] = "full"
    delta: float = HUBER_DELTA

    def validate(self) -> None:
        require(bool(self.laws), "laws: name at least one law")
        for name in self.laws:
            require(name in nd_laws(), f"laws: {name!r} is not one of {nd_laws()}")
        require(len(set(self.laws)) == len(self.laws), f"laws: {self.laws} names a law twice")
        require(self.delta > 0, f"delta: must be > 0, got {self.delta}")


@dataclasses.dataclass
class Selection:
    """Each candidate's error on the held-out points and the law chosen by it."""

    chosen: str | None
    scores: dict[str, dict[str, Any]]
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"chosen": self.chosen, "note": self.note, "validation": self.scores}


def select_law(cfg: SelectionConfig, data: Mapping[str, Any]) -> Selection:
    """Fit every law of ``cfg`` on ``data`` (``N``, ``D``, ``loss``) without the points of the largest D and
    score it there: the median and largest absolute error. The chosen law has the lowest median among the
    plausible fits; if none is plausible, the lowest median overall, and ``note`` says so."""
    n, d, loss = (np.asarray(data[k], float).ravel() for k in ("N", "D", "loss"))
    held = d >= d.max()
    scores: dict[str, dict[str, Any]] = {}
    for name in cfg.laws:
        try:
            result = fit(
                name,
                {"N": n[~held], "D": d[~held], "loss": loss[~held]},
                delta=cfg.delta,
                starts=cfg.starts,
                label=f"{name} without the largest D",
            )
        except FitError as exc:
            scores[name] = {"median_abs_error": float("inf"), "error": str(exc)}
            continue
        err = result.predict(N=n[held], D=d[held]).value - loss[held]
        scores[name] = {
            "median_abs_error": float(np.median(np.abs(err))),
            "max_abs_error": float(np.max(np.abs(err))),
            "held_out_points": int(held.sum()),
            "fit_points": int((~held).sum()),
            "plausible": result.identified,
            "not_plausible_because": list(result.reasons),
        }
    plausible = {k: v for k, v in scores.items() if v.get("plausible")}
    pool, note = plausible, ""
    if not plausible:
        pool = {k: v for k, v in scores.items() if np.isfinite(v["median_abs_error"])}
        note = "no candidate's fit without the largest D is plausible; chosen by held-out error alone"
    chosen = min(pool, key=lambda k: pool[k]["median_abs_error"]) if pool else None
    if chosen is None:
        note = "no candidate could be fitted without the largest D"
    return Selection(chosen, scores, note)


__all__ = ["Selection", "SelectionConfig", "nd_laws", "select_law"]
