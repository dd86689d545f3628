"""Where a suite's running runs will end: every run's checkpoints so far, fitted together.

Why: ``trilm suite status`` already says where a run *is*; a user deciding whether to let a run finish, or to
plan the next size, wants where it will *end*. Each run with its cooldown branches is one model; all of a
suite's models are fitted at once (:func:`trilm.scaling.forecast.forecast_models`: Tissue et al.'s law, each
model its own floor, scale and exponent, the annealing parameter shared), so a run in its stable phase borrows
the annealing that finished runs and cooldown branches showed. Each model carries its non-embedding parameter
count, which a size trend of the shared parameters needs. Checkpoints are the validation losses of complete
snapshots and of the run's periodic evaluations (``val_loss`` in ``logs/metrics.jsonl``). The interval is the
percentile interval of bootstrap refits of the joint fit.

A conversion branch (a FloatLM continued as a TriLM) is another model: its curve starts at the branch
point, under the branch's own schedule. A pending run has no forecast; a finished one shows its measured
final loss (and still lends its curve to the others).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from trilm.model.flops import parameter_counts
from trilm.scaling.curves import LossCurve
from trilm.scaling.forecast import Forecast, ForecastConfig, ModelCurves, forecast_models
from trilm.schedule import Schedule
from trilm.store.integrity import complete_steps
from trilm.store.snapshot import read_snapshot_config


def snapshot_curve(run_dir: Path) -> tuple[list[int], list[float]]:
    """(steps, val losses) of a run directory's complete snapshots that carry a validation loss, with the
    periodic evaluations its metrics log holds (a snapshot's value wins at a step both have)."""
    found: dict[int, float] = {}
    metrics = Path(run_dir) / "logs" / "metrics.jsonl"
    if metrics.is_file():
        for line in metrics.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if (
                isinstance(record, dict)
                and isinstance(record.get("val_loss"), int | float)
                and isinstance(record.get("step"), int)
                and np.isfinite(record["val_loss"])
            ):
                found[record["step"]] = float(record["val_loss"])
    for step, path in complete_steps(Path(run_dir) / "snapshots"):
        val = read_snapshot_config(path)[1].val_loss
        if val is not None:
            found[step] = float(val)
    steps = sorted(s for s in found if s >= 1)
    return steps, [found[s] for s in steps]


def _rates(schedule: Schedule) -> np.ndarray:
    return np.array([schedule.lr(i) for i in range(schedule.total)], float)


def _curve(run: Any) -> tuple[LossCurve, LossCurve] | None:
    """(the run's checkpoints, its end) as loss curves under its own schedule; None without a checkpoint."""
    steps, losses = snapshot_curve(run.run_dir)
    c = run.cfg
    if getattr(run, "converts_from", ""):
        start = run.branch_step
        schedule = Schedule.for_optimizer(c.optim, c.schedule, c.steps - start, lr_scale=c.convert.lr_scale)
        kept = [(s - start, v) for s, v in zip(steps, losses, strict=True) if s > start]
        steps, losses = [s for s, _ in kept], [v for _, v in kept]
    else:
        schedule = Schedule.for_optimizer(c.optim, c.schedule, c.steps)
    lr = _rates(schedule)
    keep = [(s, v) for s, v in zip(steps, losses, strict=True) if s <= lr.size]
    seen = LossCurve(run.name, lr, [s for s, _ in keep], [v for _, v in keep])
    return seen, LossCurve(run.name, lr, [lr.size], [1.0])


def suite_forecasts(
    runs: Sequence[tuple[Any, str]], branches: Iterable[Any] = (), cfg: ForecastConfig | None = None
) -> dict[str, Forecast | None]:
    """The forecast column for every ``(run, state)``: measured for finished runs, none for pending ones,
    otherwise the joint fit's forecast of the run's end. ``branches`` (suite runs with a ``parent``) lend
    their checkpoints to their parent's model."""
    out: dict[str, Forecast | None] = {}
    models: dict[str, ModelCurves] = {}
    for run, state in runs:
        curves = _curve(run)
        seen = curves[0] if curves else None
        if state == "pending":
            out[run.name] = None
            continue
        if state == "finished":
            last = None if seen is None or not seen.steps.size else int(seen.steps[-1])
            if seen is not None and last == seen.total:
                out[run.name] = Forecast("final", float(seen.loss[-1]), n_points=int(seen.steps.size))
            else:
                out[run.name] = Forecast("no fit", note="finished without a final snapshot loss")
        if curves is not None:
            size = float(parameter_counts(run.cfg.model).nonembedding)
            models[run.name] = ModelCurves([curves[0]], curves[1], size)
    for branch in branches:
        parent = getattr(branch, "parent", "")
        if parent in models and not getattr(branch, "converts_from", ""):
            curves = _curve(branch)
            if curves is not None and curves[0].steps.size:
                models[parent].seen.append(curves[0])
    if models:
        fitted = forecast_models(models, cfg)
        for name, forecast in fitted.items():
            out.setdefault(name, forecast)
    for run, _ in runs:
        out.setdefault(run.name, Forecast("too early", note="no checkpoint with a validation loss yet"))
    return out


def run_forecast(run: Any, state: str, cfg: ForecastConfig | None = None) -> Forecast | None:
    """One run's forecast, fitted on its own checkpoints alone (a conversion branch's status row)."""
    return suite_forecasts([(run, state)], cfg=cfg)[run.name]


def forecast_curve(steps, losses, schedule: Schedule, cfg: ForecastConfig | None = None) -> Forecast:
    """The forecast of the loss at ``schedule.total`` from checkpoints ``(steps, losses)`` of one run."""
    steps, losses = np.asarray(steps, int), np.asarray(losses, float)
    if steps.shape != losses.shape:
        raise ValueError(f"forecast: {steps.size} steps and {losses.size} losses")
    if steps.size and (steps.max() > schedule.total or steps.min() < 1):
        raise ValueError(
            f"forecast: a checkpoint at step {steps.max()} lies outside the schedule's 1…{schedule.total}"
        )
    lr = _rates(schedule)
    model = ModelCurves([LossCurve("run", lr, steps, losses)], LossCurve("run", lr, [lr.size], [1.0]))
    return forecast_models({"run": model}, cfg)["run"]


__all__ = [
    "Forecast",
    "ForecastConfig",
    "forecast_curve",
    "run_forecast",
    "snapshot_curve",
    "suite_forecasts",
]
