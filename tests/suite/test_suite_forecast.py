"""``trilm suite status`` forecasts: committed cooldown curves cut at 25 % and 50 % of their runs, written as
snapshots of a fake suite; the printed forecast must be what the curve law gives for exactly those points."""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path

import numpy as np
import pytest

from trilm.cli import main
from trilm.model.snapshot import SnapshotMeta
from trilm.scaling.curve import CurveConfig, fit_curve, schedule_areas
from trilm.schedule import Schedule
from trilm.store.layout import COMPLETE
from trilm.store.snapshot import write_snapshot_config
from trilm.suite.config import load_suite
from trilm.suite.forecast import ForecastConfig, forecast_curve, run_forecast
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


def _expected(run, steps, losses) -> tuple[float, float, float]:
    cfg = CurveConfig()
    s1, s2 = schedule_areas(_schedule(run), cfg.momentum)
    steps, losses = np.asarray(steps), np.asarray(losses)
    keep = steps >= cfg.min_step
    fit = fit_curve(cfg, s1[steps[keep] - 1], s2[steps[keep] - 1], losses[keep])
    l0, a, alpha, c = fit.params["L0"], fit.params["A"], fit.params["alpha"], fit.params["C"]
    if s2[steps[keep] - 1].max() == 0:
        c = 0.0  # C unseen before the decay: the forecast takes no annealing gain
    final = l0 + a * s1[-1] ** -alpha - c * s2[-1]
    spread = float(np.exp(1.96 * fit.log_residual_rms))
    return final, final / spread, final * spread


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


@pytest.mark.parametrize("name", ["trilm-64x2", "floatlm-64x2"])
def test_status_prints_what_the_law_gives_for_the_seen_points(faked, name, capsys):
    suite, runs, seen = faked
    final, low, high = _expected(runs[name], *seen[name])
    status = add_forecasts(suite_status(suite))
    by_name = {s.run.name: s for s in status}
    fc = by_name[name].forecast
    assert fc.kind == "forecast"
    assert fc.loss == pytest.approx(final, rel=1e-6)
    assert (fc.low, fc.high) == pytest.approx((low, high), rel=1e-6)
    assert fc.low < fc.loss < fc.high
    assert main(["suite", "status", "cooldown", "--run-dir", str(suite.root)]) == 0
    text = capsys.readouterr().out
    assert text == render_status(suite, status) + "\n" or "cooldown branches" in text
    row = next(line for line in text.splitlines() if line.strip().startswith(name + " "))
    assert f"{final:.3f} [{low:.3f}, {high:.3f}]" in row


def test_a_quarter_of_a_committed_run_has_too_few_checkpoints_for_four_parameters(faked):
    """The committed runs snapshot at 205, 256, 410, 512 of 2048 steps past ``min_step``: four points, and
    the law has four parameters, so a quarter of the run is honestly too early."""
    suite, _, seen = faked
    assert len([s for s in seen["floatlm-32x2"][0] if s >= CurveConfig().min_step]) == 4
    fc = {s.run.name: s for s in add_forecasts(suite_status(suite))}["floatlm-32x2"].forecast
    assert fc.kind == "too early" and fc.note.startswith("4 checkpoints")


def test_a_run_cut_very_early_is_too_early_and_a_finished_run_shows_its_measured_loss(faked):
    suite, _, seen = faked
    by_name = {s.run.name: s for s in add_forecasts(suite_status(suite))}
    assert by_name["bilm-64x2"].forecast.kind == "too early"
    assert "too early" in render_status(suite, list(by_name.values()))
    done = by_name["trilm-32x2"]
    assert done.state == "finished" and done.forecast.kind == "final"
    assert done.forecast.loss == pytest.approx(seen["trilm-32x2"][1][-1])
    assert by_name["trilm-128x4"].forecast is None  # pending: no run directory, nothing to forecast


def test_forecast_before_the_decay_is_the_law_without_its_annealing_gain():
    """Checkpoints drawn from the law (no noise) over the first half of a WSD run: the power part is
    recovered, but no checkpoint has seen a rate decrease (S2 = 0), so C is not identified; the forecast
    is L0 + A·S1^(−α) at the end, high by exactly the annealing gain C·S2, and says why."""
    run = load_suite("cooldown").runs[0]
    sched = _schedule(run)
    s1, s2 = schedule_areas(sched)
    truth = lambda i: 2.0 + 3.0 * s1[i - 1] ** -0.4 - 2e-4 * s2[i - 1]  # noqa: E731
    steps = [s for s in range(128, sched.total // 2 + 1, max(1, sched.total // 40))]
    fc = forecast_curve(steps, [truth(s) for s in steps], sched, ForecastConfig())
    assert fc.kind == "forecast" and "C (what annealing buys) is not seen" in fc.note
    assert fc.loss == pytest.approx(2.0 + 3.0 * s1[-1] ** -0.4, abs=2e-3)
    assert fc.loss - truth(sched.total) == pytest.approx(2e-4 * s2[-1], abs=2e-3)


def test_bad_checkpoints_name_the_problem():
    sched = _schedule(load_suite("cooldown").runs[0])
    with pytest.raises(ValueError, match="beyond the schedule"):
        forecast_curve([sched.total + 1], [3.0], sched)
    with pytest.raises(ValueError, match="2 steps and 1 losses"):
        forecast_curve([1, 2], [3.0], sched)
    assert run_forecast(load_suite("cooldown").runs[0], "pending") is None
