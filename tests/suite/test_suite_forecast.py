"""``trilm suite status`` forecasts: committed cooldown curves cut at 25 % and 50 % of their runs, written as
snapshots of a fake suite; the printed forecast must be what the joint curve-law fit gives for exactly those
points. A run before its decay borrows the annealing the suite's other runs showed."""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path

import numpy as np
import pytest

from trilm.cli import main
from trilm.config import ConfigError
from trilm.model.flops import parameter_counts
from trilm.model.snapshot import SnapshotMeta
from trilm.scaling.curves import LossCurve
from trilm.scaling.forecast import ForecastConfig, ModelCurves, forecast_models
from trilm.scaling.laws import get_law
from trilm.schedule import Schedule
from trilm.store.layout import COMPLETE
from trilm.store.snapshot import write_snapshot_config
from trilm.suite.config import load_suite
from trilm.suite.forecast import forecast_curve, run_forecast
from trilm.suite.status import add_forecasts, render_status, suite_status

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "docs/results/cooldown/results.csv"


def _curve(run: str) -> tuple[list[int], list[float]]:
    with RESULTS.open() as fh:
        rows = [r for r in csv.DictReader(fh) if r["run"] == run and r["eval"] == "val_loss"]
    rows = [r for r in rows if not r["parent"]]
    rows.sort(key=lambda r: int(r["step"]))
    return [int(r["step"]) for r in rows], [float(r["loss"]) for r in rows]


def _schedule(run) -> Schedule:
    return Schedule.for_optimizer(run.cfg.optim, run.cfg.schedule, run.cfg.steps)


def _write(run, steps, losses, finished: bool = False) -> None:
    for step, loss in zip(steps, losses, strict=True):
        snap = run.run_dir / "snapshots" / f"step-{step}"
        snap.mkdir(parents=True)
        write_snapshot_config(snap, run.cfg.model, SnapshotMeta(val_loss=loss))
        (snap / COMPLETE).write_text("{}")
    if finished:
        state = run.run_dir / "state" / f"step-{run.cfg.steps}"
        state.mkdir(parents=True)
        (state / COMPLETE).write_text("{}")
    logs = run.run_dir / "logs"
    logs.mkdir(parents=True)
    record = {"time": time.time(), "step": int(steps[-1]), "loss": float(losses[-1])}
    (logs / "metrics.jsonl").write_text(json.dumps(record) + "\n")


def _lr(run) -> np.ndarray:
    sched = _schedule(run)
    return np.array([sched.lr(i) for i in range(sched.total)])


def _expected(runs, seen) -> dict:
    """What the joint fit gives for exactly the faked runs' checkpoints (every run with one is a model)."""
    models = {}
    for name in (n for n in runs if n in seen):  # the suite's order, as status fits them
        steps, losses = seen[name]
        lr = _lr(runs[name])
        kept = [(s, v) for s, v in zip(steps, losses, strict=True) if s >= 1]
        curve = LossCurve(name, lr, [s for s, _ in kept], [v for _, v in kept])
        size = float(parameter_counts(runs[name].cfg.model).nonembedding)
        models[name] = ModelCurves([curve], LossCurve(name, lr, [lr.size], [1.0]), size)
    return forecast_models(models, ForecastConfig())


@pytest.fixture(scope="module")
def faked(tmp_path_factory):
    """Five runs of the cooldown suite: two cut at 50 %, one at 25 %, one very early, one finished."""
    suite = load_suite("cooldown", root=tmp_path_factory.mktemp("forecast-suite"))
    runs = {r.name: r for r in suite.runs}
    cuts = {"trilm-64x2": 0.5, "floatlm-64x2": 0.5, "floatlm-32x2": 0.25}
    cuts |= {"bilm-64x2": 0.05, "trilm-32x2": 1.0}
    seen = {}
    for name, cut in cuts.items():
        run = runs[name]
        steps, losses = _curve(name)
        assert steps[-1] == run.cfg.steps, f"{RESULTS}: {name} does not reach its last step"
        kept = [(s, v) for s, v in zip(steps, losses, strict=True) if s <= cut * run.cfg.steps]
        seen[name] = ([s for s, _ in kept], [v for _, v in kept])
        _write(run, *seen[name], finished=cut == 1.0)
    return suite, runs, seen


@pytest.fixture(scope="module")
def statuses(faked):
    suite, _, _ = faked
    return {s.run.name: s for s in add_forecasts(suite_status(suite))}


@pytest.mark.parametrize("name", ["trilm-64x2", "floatlm-64x2"])
def test_status_prints_what_the_joint_law_gives_for_the_seen_points(faked, statuses, name):
    suite, runs, seen = faked
    expected = _expected(runs, seen)[name]
    fc = statuses[name].forecast
    assert fc.kind == "forecast" == expected.kind
    assert (fc.loss, fc.low, fc.high) == pytest.approx((expected.loss, expected.low, expected.high), rel=1e-9)
    assert fc.low <= fc.loss <= fc.high
    row = next(
        line
        for line in render_status(suite, list(statuses.values())).splitlines()
        if line.strip().startswith(name + " ")
    )
    assert f"{fc.loss:.3f} [{fc.low:.3f}, {fc.high:.3f}]" in row


def test_the_status_command_prints_the_table(faked, capsys):
    suite, _, _ = faked
    assert main(["suite", "status", "cooldown", "--run-dir", str(suite.root)]) == 0
    text = capsys.readouterr().out
    assert "bootstrap refits" in text and "trilm-64x2" in text


def test_a_quarter_of_a_committed_run_has_too_few_checkpoints(faked, statuses):
    """The committed runs snapshot at 205, 256, 410, 512 of 2048 steps past ``min_step``: four points, fewer
    than the five a model needs, so a quarter of the run is honestly too early."""
    _, _, seen = faked
    assert len([s for s in seen["floatlm-32x2"][0] if s >= ForecastConfig().min_step]) == 4
    fc = statuses["floatlm-32x2"].forecast
    assert fc.kind == "too early" and fc.note.startswith("4 checkpoints")


def test_a_run_cut_very_early_is_too_early_and_a_finished_run_shows_its_measured_loss(faked, statuses):
    suite, _, seen = faked
    assert statuses["bilm-64x2"].forecast.kind == "too early"
    assert "too early" in render_status(suite, list(statuses.values()))
    done = statuses["trilm-32x2"]
    assert done.state == "finished" and done.forecast.kind == "final"
    assert done.forecast.loss == pytest.approx(seen["trilm-32x2"][1][-1])
    assert statuses["trilm-128x4"].forecast is None  # pending: no run directory, nothing to forecast


def _tissue(lr: np.ndarray, steps, params) -> np.ndarray:
    law = get_law("tissue")
    return np.exp(
        law.log_predict(law.theta(params), law.design([LossCurve("t", lr, steps, np.ones(len(steps)))]))[0]
    )


def test_a_run_before_its_decay_borrows_the_annealing_the_other_runs_showed():
    """Three models drawn from Tissue's law with one C: two finished WSD runs and one seen only in its
    stable phase. Alone, the stable run's C is not seen (its forecast says so and misses the annealing
    gain); fitted with the others, its end is forecast within 0.01 nats, inside the interval."""
    run = load_suite("cooldown").runs[0]
    lr = _lr(run)
    total = lr.size
    steps = list(range(128, total + 1, 32))
    cut = int(0.5 * total)
    truth = {
        "small": {"L0": 3.4, "A": 30.0, "alpha": 0.6, "C": 3e-4},
        "medium": {"L0": 3.1, "A": 40.0, "alpha": 0.6, "C": 3e-4},
        "large": {"L0": 2.9, "A": 50.0, "alpha": 0.6, "C": 3e-4},
    }
    rng = np.random.default_rng(0)
    models = {}
    for name, params in truth.items():
        seen = [s for s in steps if name != "large" or s <= cut]
        loss = _tissue(lr, seen, params) * np.exp(rng.normal(0, 1e-3, len(seen)))
        models[name] = ModelCurves([LossCurve(name, lr, seen, loss)], LossCurve(name, lr, [total], [1.0]))
    end = float(_tissue(lr, [total], truth["large"])[0])
    alone = forecast_models({"large": models["large"]}, ForecastConfig(shared=[], bootstrap=0))["large"]
    assert "annealing" in alone.note and alone.loss - end > 0.05
    joint = forecast_models(models, ForecastConfig(bootstrap=40))["large"]
    assert joint.kind == "forecast" and not joint.note
    assert abs(joint.loss - end) < 0.01
    assert joint.low <= end <= joint.high


def _curve_law(lr: np.ndarray, steps, params) -> np.ndarray:
    law = get_law("tissue_lambda")
    return np.exp(
        law.log_predict(law.theta(params), law.design([LossCurve("t", lr, steps, np.ones(len(steps)))]))[0]
    )


def test_with_lambda_fitted_a_run_borrows_the_annealing_scaled_to_its_size():
    """Four models of the cooldown suite's sizes drawn from `tissue_lambda` (Tissue's law with λ = 0.975 for
    all, C growing as size^0.2, as that suite's runs show): three finished WSD runs and the largest seen only
    in its stable phase. Alone, the stable run's C is not seen (its forecast says so and misses the annealing
    gain); fitted with the others, λ shared and C a power of size, its end is forecast within 0.01 nats,
    inside the interval."""
    run = load_suite("cooldown").runs[0]
    lr = _lr(run)
    total = lr.size
    steps = list(range(128, total + 1, 32))
    cut = int(0.5 * total)
    sizes = {"small": 3.3e4, "medium": 1.1e5, "big": 3.3e5, "large": 8.5e5}
    truth = {
        "small": {"L0": 3.4, "A": 30.0, "alpha": 0.6},
        "medium": {"L0": 3.1, "A": 40.0, "alpha": 0.6},
        "big": {"L0": 3.0, "A": 45.0, "alpha": 0.6},
        "large": {"L0": 2.9, "A": 50.0, "alpha": 0.6},
    }
    rng = np.random.default_rng(0)
    models = {}
    for name, params in truth.items():
        params |= {"C": 3e-3 * (sizes[name] / 1e5) ** 0.2, "h": 40.0}
        seen = [s for s in steps if name != "large" or s <= cut]
        loss = _curve_law(lr, seen, params) * np.exp(rng.normal(0, 1e-3, len(seen)))
        curve = LossCurve(name, lr, seen, loss)
        models[name] = ModelCurves([curve], LossCurve(name, lr, [total], [1.0]), sizes[name])
    end = float(_curve_law(lr, [total], truth["large"])[0])
    alone_cfg = ForecastConfig(shared=[], size_trend=[], bootstrap=0)
    alone = forecast_models({"large": models["large"]}, alone_cfg)["large"]
    assert "annealing" in alone.note and alone.loss - end > 0.05
    cfg = ForecastConfig(law="tissue_lambda", shared=["C", "h"], size_trend=["C"], bootstrap=40)
    joint = forecast_models(models, cfg)["large"]
    assert joint.kind == "forecast" and not joint.note
    assert abs(joint.loss - end) < 0.01
    assert joint.low <= end <= joint.high


def test_bad_checkpoints_and_configs_name_the_problem():
    sched = _schedule(load_suite("cooldown").runs[0])
    with pytest.raises(ValueError, match="outside the schedule"):
        forecast_curve([sched.total + 1], [3.0], sched)
    with pytest.raises(ValueError, match="2 steps and 1 losses"):
        forecast_curve([1, 2], [3.0], sched)
    assert run_forecast(load_suite("cooldown").runs[0], "pending") is None
    with pytest.raises(ConfigError, match="shared: 'gamma' is not a parameter of tissue"):
        ForecastConfig(shared=["gamma"])
    with pytest.raises(ConfigError, match="law: 'additive' is not one of"):
        ForecastConfig(law="additive")
