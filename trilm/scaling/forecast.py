"""Where runs will end: a curve law fitted on every model of a suite at once, sharing what runs share.

A suite's runs are models (a run with its cooldown branches is one model: same weights up to each branch
point). Each model's checkpoints so far are loss curves under its own schedule; the law is fitted on all
models together, each with its own floor, scale and exponent, and with the annealing parameters shared
(:mod:`trilm.scaling.joint`). A run still in its stable phase then gets a forecast of its end — the
annealing it has not yet seen is what the suite's cooldown branches and decayed runs showed — and its
interval comes from bootstrap refits of the joint fit over stretches of every model's curve, so it counts
how much the forecast depends on which checkpoints were seen.

The default is Tissue et al.'s law with C shared. ``ForecastConfig(law="tissue_lambda", shared=["C", "h"],
size_trend=["C"])`` fits the momentum λ too, shared, with C a power of the model's size: on suites with
cooldown branches of several lengths it forecasts far better (``docs/results/cooldown/forecasts.md``: WSD
from 25 %, median error 0.47 → 0.055 nats; ``docs/results/forecast-untuned/``: 0.47–0.91 → 0.11–0.20),
but where no branch shows the cooldown's shape (the quickstart: Spectra and cosine runs cut at half) λ is
not identified, and there its forecasts erred further than the default's, so it is not the default.

A model with fewer than :attr:`ForecastConfig.points_needed` checkpoints past :attr:`ForecastConfig.min_step`,
or less than :attr:`ForecastConfig.min_fraction` of its run seen, is "too early" and stays out of the fit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from trilm.config import Config, require
from trilm.scaling.curves import LossCurve
from trilm.scaling.errors import FitError
from trilm.scaling.joint import fit_jointly
from trilm.scaling.laws import CurveLaw, get_law, laws_of_kind


@dataclasses.dataclass
class ForecastConfig(Config):
    """``law``: the curve law; ``shared``: its natural parameters tied across models (the annealing ones);
    ``size_trend``: those of them tied through a power of model size instead of one value (needs every model's
    :attr:`ModelCurves.size`); ``min_step``: checkpoints before it are left out (the first steps are not yet
    on a power law); ``min_points`` and ``min_fraction``: how much of a run must be seen; ``bootstrap``:
    refits for the intervals, at ``level``."""

    law: str = "tissue"
    shared: list[str] = dataclasses.field(default_factory=lambda: ["C"])
    size_trend: list[str] = dataclasses.field(default_factory=list)
    min_step: int = 128
    min_points: int = 0
    min_fraction: float = 0.2
    bootstrap: int = 30
    level: float = 0.95
    seed: int = 0

    def validate(self) -> None:
        require(self.law in laws_of_kind("curve"), f"law: {self.law!r} is not one of {laws_of_kind('curve')}")
        law = get_law(self.law)
        names = [t[3:] if t.startswith("ln ") else t for t in law.theta_names]
        for name in self.shared:
            require(name in names, f"shared: {name!r} is not a parameter of {self.law} ({names})")
        for name in self.size_trend:
            require(name in self.shared, f"size_trend: {name!r} is not shared ({self.shared})")
        require(self.min_step >= 1, f"min_step: must be ≥ 1, got {self.min_step}")
        require(self.min_points >= 0, f"min_points: must be ≥ 0, got {self.min_points}")
        require(
            self.min_points == 0 or self.min_points > law.n_params - len(self.shared),
            f"min_points: {self.law} has {law.n_params - len(self.shared)} parameters of a model's own,"
            f" need more points than that, got {self.min_points}",
        )
        require(0 < self.min_fraction <= 1, f"min_fraction: must be in (0, 1], got {self.min_fraction}")
        require(self.bootstrap >= 0, f"bootstrap: must be ≥ 0, got {self.bootstrap}")
        require(0 < self.level < 1, f"level: must be in (0, 1), got {self.level}")

    @property
    def points_needed(self) -> int:
        """``min_points``, or where it is 0: five, and more than the parameters a model fits of its own."""
        own = get_law(self.law).n_params - len(self.shared)
        return self.min_points or max(5, own + 1)


@dataclasses.dataclass
class Forecast:
    """``kind``: ``final`` (measured, the run finished), ``forecast``, ``too early`` or ``no fit``."""

    kind: str
    loss: float | None = None
    low: float | None = None
    high: float | None = None
    n_points: int = 0
    note: str = ""

    def text(self) -> str:
        if self.kind == "final":
            return f"{self.loss:.4f} (final)"
        if self.kind == "forecast":
            band = "" if self.low is None else f" [{self.low:.3f}, {self.high:.3f}]"
            return f"{self.loss:.3f}{band}{'*' if self.note else ''}"
        return self.kind


@dataclasses.dataclass
class ModelCurves:
    """One model of a suite: its curves so far (the run's own, its branches'), where to forecast — a curve
    over the run's whole schedule whose one step is the run's last — and its size (non-embedding
    parameters), which a size trend of the shared parameters needs."""

    seen: list[LossCurve]
    target: LossCurve
    size: float | None = None

    @property
    def fraction_seen(self) -> float:
        mine = [c for c in self.seen if c.lr.size == self.target.lr.size]
        last = max((int(c.steps.max()) for c in mine if c.steps.size), default=0)
        return last / self.target.total


def _usable(model: ModelCurves, cfg: ForecastConfig) -> tuple[list[LossCurve], int]:
    curves = [c.after(cfg.min_step) for c in model.seen]
    curves = [c for c in curves if c.steps.size]
    return curves, sum(c.steps.size for c in curves)


def forecast_models(
    models: Mapping[str, ModelCurves], cfg: ForecastConfig | None = None
) -> dict[str, Forecast]:
    """The forecast of every model's run end; models seen too little are "too early", and when the joint
    fit fails every fitted model is "no fit" with the reason."""
    cfg = cfg or ForecastConfig()
    cfg.validate()
    out: dict[str, Forecast] = {}
    data: dict[str, list[LossCurve]] = {}
    for name, model in models.items():
        curves, count = _usable(model, cfg)
        seen = model.fraction_seen
        if count < cfg.points_needed or seen < cfg.min_fraction:
            out[name] = Forecast(
                "too early", n_points=count, note=f"{count} checkpoints, {100 * seen:.0f}% of the run"
            )
        else:
            data[name] = curves
    if not data:
        return out
    law = get_law(cfg.law)
    assert isinstance(law, CurveLaw)
    try:
        sizes = {name: size for name in data if (size := models[name].size) is not None}
        fits = fit_jointly(
            cfg.law,
            data,
            cfg.shared,
            sizes=sizes,
            trended=cfg.size_trend,
            bootstrap=cfg.bootstrap,
            seed=cfg.seed,
            level=cfg.level,
        )
    except FitError as exc:
        return out | {
            name: Forecast("no fit", n_points=sum(c.steps.size for c in data[name]), note=str(exc))
            for name in data
        }
    for name, result in fits.items():
        pred = result.predict(models[name].target)
        value = float(pred.value.ravel()[-1])
        n = int(result.n_points)
        if not np.isfinite(value):
            out[name] = Forecast("no fit", n_points=n, note="the law is not positive at the last step")
            continue
        low = None if pred.low is None else float(pred.low.ravel()[-1])
        high = None if pred.high is None else float(pred.high.ravel()[-1])
        out[name] = Forecast("forecast", value, low, high, n, "; ".join(result.reasons))
    return {name: out[name] for name in models}


__all__ = ["Forecast", "ForecastConfig", "ModelCurves", "forecast_models"]
