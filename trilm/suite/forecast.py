"""Where a running run will end: Tissue et al.'s loss-curve law fitted on the run's own checkpoints so far.

Why: ``trilm suite status`` already says where a run *is*; a user deciding whether to let a run finish, or
to plan the next size, wants where it will *end*. The law (:mod:`trilm.scaling.curve`) is fitted on the
run's complete snapshots with a validation loss (from :attr:`CurveConfig.min_step` on), with ``S1``, ``S2``
from the run's own schedule, and evaluated at the last step.

The interval is the fit's residual scatter carried to the final step (``exp(±z·rms)`` of the log-residuals
of the fitted points): it says how noisy the curve was, *not* how wrong the extrapolation can be. Before the
schedule's decay starts ``C`` is not seen and the forecast assumes no annealing gain, so it errs high for
decaying schedules; the status table marks such forecasts. (The fit leaves C wherever its start put it
when every seen S2 is 0 — no gradient — so C is set to 0 here rather than to an arbitrary start value.)
Below ``min_points`` checkpoints or ``min_fraction`` of the run the answer is "too early"; a pending run
has no forecast at all.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from trilm.config import Config, require
from trilm.scaling.curve import CurveConfig, fit_curve, schedule_areas
from trilm.scaling.fit import FitError
from trilm.schedule import Schedule
from trilm.store.integrity import complete_steps
from trilm.store.snapshot import read_snapshot_config

Z_95 = 1.96


@dataclasses.dataclass
class ForecastConfig(Config):
    """``min_fraction``: of the run's steps that must be seen before forecasting; ``z``: the interval's
    width in residual standard deviations."""

    curve: CurveConfig = dataclasses.field(default_factory=CurveConfig)
    min_fraction: float = 0.2
    z: float = Z_95

    def validate(self) -> None:
        self.curve.validate()
        require(0 < self.min_fraction <= 1, f"min_fraction: must be in (0, 1], got {self.min_fraction}")
        require(self.z > 0, f"z: must be > 0, got {self.z}")


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
            mark = "*" if self.note else ""
            return f"{self.loss:.3f} [{self.low:.3f}, {self.high:.3f}]{mark}"
        return self.kind


def forecast_curve(steps, losses, schedule, cfg: ForecastConfig | None = None) -> Forecast:
    """Forecast the loss at ``schedule.total`` from checkpoints ``(steps, losses)`` of one run."""
    cfg = cfg or ForecastConfig()
    cfg.validate()
    steps = np.asarray(steps, int)
    losses = np.asarray(losses, float)
    if steps.shape != losses.shape:
        raise ValueError(f"forecast: {steps.size} steps and {losses.size} losses")
    total = schedule.total
    if steps.size and steps.max() > total:
        raise ValueError(f"forecast: checkpoint at step {steps.max()} beyond the schedule's {total} steps")
    keep = steps >= cfg.curve.min_step
    steps, losses = steps[keep], losses[keep]
    seen = (steps.max() / total) if steps.size else 0.0
    if steps.size < cfg.curve.min_points or seen < cfg.min_fraction:
        note = f"{steps.size} checkpoints, {100 * seen:.0f}% of the run"
        return Forecast("too early", n_points=int(steps.size), note=note)
    s1, s2 = schedule_areas(schedule, cfg.curve.momentum)
    try:
        fit = fit_curve(cfg.curve, s1[steps - 1], s2[steps - 1], losses)
    except FitError as exc:
        return Forecast("no fit", n_points=int(steps.size), note=str(exc))
    if float(s2[steps - 1].max()) == 0.0:
        fit = dataclasses.replace(fit, theta=np.concatenate([fit.theta[:3], [-np.inf]]))
    final = float(fit.predict(s1[-1], s2[-1])[0])
    if not np.isfinite(final):
        return Forecast("no fit", n_points=fit.n_points, note="the law is not positive at the last step")
    spread = float(np.exp(cfg.z * fit.log_residual_rms))
    return Forecast("forecast", final, final / spread, final * spread, fit.n_points, "; ".join(fit.reasons))


def snapshot_curve(run_dir: Path) -> tuple[list[int], list[float]]:
    """(steps, val losses) of a run directory's complete snapshots that carry a validation loss."""

    steps, losses = [], []
    for step, path in complete_steps(Path(run_dir) / "snapshots"):
        val = read_snapshot_config(path)[1].val_loss
        if val is not None:
            steps.append(step)
            losses.append(float(val))
    return steps, losses


def run_forecast(run, state: str, cfg: ForecastConfig | None = None) -> Forecast | None:
    """The forecast column of ``trilm suite status`` for one suite run in ``state``."""

    steps, losses = snapshot_curve(run.run_dir)
    if state == "finished":
        if steps and steps[-1] == run.cfg.steps:
            return Forecast("final", losses[-1], n_points=len(steps))
        return Forecast("no fit", note="finished without a final snapshot loss")
    if state == "pending":
        return None
    if getattr(run, "converts_from", ""):
        # a conversion branch is fitted as a run of its own: its checkpoints and schedule from the branch
        # point on (the float run's steps before it are another model's curve)
        start, c = run.branch_step, run.cfg
        phase = Schedule.for_optimizer(c.optim, c.schedule, c.steps - start, lr_scale=c.convert.lr_scale)
        kept = [(s - start, v) for s, v in zip(steps, losses, strict=True) if s > start]
        return forecast_curve([s for s, _ in kept], [v for _, v in kept], phase, cfg)
    schedule = Schedule.for_optimizer(run.cfg.optim, run.cfg.schedule, run.cfg.steps)
    return forecast_curve(steps, losses, schedule, cfg)


__all__ = ["Forecast", "ForecastConfig", "forecast_curve", "run_forecast", "snapshot_curve"]
