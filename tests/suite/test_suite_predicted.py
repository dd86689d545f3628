"""Predicted against measured in ``trilm suite analyse``'s report and the quickstart's printout, on the CPU
ladder's committed curves of TriLM at the quickstart's four sizes (the quickstart's runs: same sizes, budget,
schedule and rates), renamed to the quickstart's run names. TriLM 32x2 keeps only its early checkpoints and
its last (too few for a forecast); FloatLM 32x2 stops half way (not finished). Every number must be what
the joint curve-law fit gives on the cut curves and what the leave-one-size-out refits give."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from trilm.cli import main
from trilm.model.flops import parameter_counts
from trilm.quickstart import analysis_text
from trilm.scaling.curves import LossCurve
from trilm.scaling.forecast import ModelCurves, forecast_models
from trilm.schedule import Schedule
from trilm.suite.analyse import analyse_table
from trilm.suite.config import load_suite
from trilm.suite.predicted import PLOT_STEM, curve_predictions, figure

REPO = Path(__file__).resolve().parents[2]
LADDER = REPO / "docs/results/ladder/analysis/results.csv"
RUNS = {  # the ladder's run → the quickstart's
    "trilm-32x2-lr0.004": "trilm-32x2",
    "trilm-64x2-lr0.004": "trilm-64x2",
    "trilm-96x3-lr0.008": "trilm-96x3",
    "trilm-128x4-lr0.004": "trilm-128x4",
    "floatlm-32x2-lr0.004": "floatlm-32x2",
}


def _keep(run: str, step: int) -> bool:
    if run == "trilm-32x2":
        return step <= 128 or step == 2048
    if run == "floatlm-32x2":
        return step <= 1024
    return True


@pytest.fixture(scope="module")
def analysed(tmp_path_factory):
    root = tmp_path_factory.mktemp("predicted")
    with LADDER.open() as fh:
        reader = csv.DictReader(fh)
        fields, rows = reader.fieldnames, [r for r in reader if r["run"] in RUNS and r["eval"] == "val_loss"]
    for r in rows:
        r["run"] = RUNS[r["run"]]
    rows = [r for r in rows if _keep(r["run"], int(r["step"]))]
    table = root / "results.csv"
    with table.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    suite = load_suite("quickstart", root=root)
    with (
        pytest.MonkeyPatch.context() as mp
    ):  # the scaling plots are tested elsewhere and take most of the time
        mp.setattr("trilm.scaling.plots.write_all", lambda report, out_dir: {})
        result = analyse_table(suite, table, bootstrap=0, seed=0)
    curves = {}
    for r in rows:
        curves.setdefault(r["run"], []).append((int(r["step"]), float(r["loss"])))
    return suite, result, {k: sorted(v) for k, v in curves.items()}


def _direct(suite, curves, name):
    """The joint forecast of every finished run from the checkpoints of its first half, made here directly
    (as the report makes it: one fit over the finished runs, in the suite's order)."""
    models = {}
    for run in suite.runs:
        curve = curves.get(run.name)
        if not curve or curve[-1][0] != run.cfg.steps:
            continue
        seen = [(s, v) for s, v in curve if 1 <= s <= run.cfg.steps // 2]
        schedule = Schedule.for_optimizer(run.cfg.optim, run.cfg.schedule, run.cfg.steps)
        lr = np.array([schedule.lr(i) for i in range(schedule.total)])
        points = LossCurve(run.name, lr, [s for s, _ in seen], [v for _, v in seen])
        size = float(parameter_counts(run.cfg.model).nonembedding)
        models[run.name] = ModelCurves([points], LossCurve(run.name, lr, [lr.size], [1.0]), size)
    return forecast_models(models)[name]


def _row(markdown: str, run: str, basis: str) -> list[str]:
    rows = [line.split(" | ") for line in markdown.splitlines() if line.startswith(f"| {run} | ")]
    return next(cells for cells in rows if cells[2].startswith(basis))


@pytest.mark.parametrize("name", ["trilm-64x2", "trilm-96x3", "trilm-128x4"])
def test_every_finished_run_has_the_forecast_of_its_first_half_against_its_final_loss(analysed, name):
    suite, result, curves = analysed
    expected = _direct(suite, curves, name)
    assert expected.kind == "forecast"
    row = next(r for r in result.predictions.rows if r.run == name and r.source == "curve")
    assert (row.predicted, row.low, row.high) == pytest.approx((expected.loss, expected.low, expected.high))
    assert row.measured == curves[name][-1][1] and curves[name][-1][0] == 2048
    assert row.error == pytest.approx(expected.loss - curves[name][-1][1])
    cells = _row(result.summary_file.read_text(), name, "curve, steps ≤ 1,024 (50 %)")
    assert cells[3] == str(expected.n_points) == "5"
    assert cells[4] == f"{expected.loss:.4f} [{expected.low:.4f}, {expected.high:.4f}]"
    assert cells[5] == f"{curves[name][-1][1]:.4f}"
    assert cells[6] == f"{expected.loss - curves[name][-1][1]:+.4f}"
    inside = expected.low <= curves[name][-1][1] <= expected.high
    assert cells[7].rstrip(" |") == ("yes" if inside else "no")


def test_a_run_with_too_few_checkpoints_is_listed_as_too_early(analysed):
    suite, result, curves = analysed
    expected = _direct(suite, curves, "trilm-32x2")
    assert expected.kind == "too early"
    row = next(r for r in result.predictions.rows if r.run == "trilm-32x2" and r.source == "curve")
    assert row.kind == "too early" and row.predicted is None and row.note == expected.note
    text = result.summary_file.read_text()
    cells = _row(text, "trilm-32x2", "curve")
    assert cells[4:7] == ["too early", f"{curves['trilm-32x2'][-1][1]:.4f}", "–"]
    assert f"trilm-32x2: too early: {expected.note}" in text
    assert "curve-law forecasts: 3 of 4 made" in text


def test_the_law_rows_are_the_leave_one_size_out_refits_and_a_run_that_has_not_finished_is_named(analysed):
    _, result, _ = analysed
    loso = result.report.families["trilm"].law_x.loso
    held = [r for r in result.predictions.rows if r.source == "law"]
    assert [r.size for r in held] == ["32x2", "64x2", "96x3", "128x4"] == [e["group"] for e in loso]
    for r, e in zip(held, loso, strict=True):
        assert (r.predicted, r.measured) == (e["predicted"], e["observed"]) and r.low is None
        cells = _row(result.summary_file.read_text(), f"trilm-{r.size}", f"L(N_nonemb) without {r.size}")
        assert cells[4:7] == [f"{e['predicted']:.4f}", f"{e['observed']:.4f}", f"{r.error:+.4f}"]
    assert result.predictions.unfinished == ["floatlm-32x2 (last checkpoint at step 1,024 of 2,048)"]
    assert "not finished, so not checked: floatlm-32x2" in result.summary_file.read_text()


def test_the_plot_is_written_beside_the_report_and_draws_each_prediction(analysed):
    _, result, _ = analysed
    assert result.predictions.plot == result.out_dir / f"{PLOT_STEM}.png"
    assert result.predictions.plot.stat().st_size > 10_000
    assert (result.out_dir / f"{PLOT_STEM}.svg").is_file()
    assert f"![predicted vs measured]({PLOT_STEM}.png)" in result.summary_file.read_text()
    ax = figure(result.predictions).axes[0]
    drawn = {line.get_label(): line for line in ax.get_lines()}
    diagonal = drawn["predicted = measured"]
    assert list(diagonal.get_xdata()) == list(diagonal.get_ydata())
    by_label = {c.get_label(): c for c in ax.containers}
    curve = by_label["TriLM: curve law, 50 % seen"]
    shown = [r for r in result.predictions.shown() if r.source == "curve"]
    assert list(curve.lines[0].get_xdata()) == [r.measured for r in shown]
    assert list(curve.lines[0].get_ydata()) == [r.predicted for r in shown]
    bars = curve.lines[2][0].get_segments()  # the error bars span each forecast's interval
    assert [v for s in bars for v in (s[0][1], s[1][1])] == pytest.approx(
        [v for r in shown for v in (r.low, r.high)]
    )
    law = by_label["TriLM: scaling law, size held out"]
    assert len(law.lines[0].get_xdata()) == 4


def test_the_quickstart_prints_the_same_table(analysed):
    _, result, _ = analysed
    text = analysis_text(result)
    assert "predicted vs measured final loss (curve law from 50 % of each run" in text
    row = next(r for r in result.predictions.rows if r.run == "trilm-128x4" and r.source == "curve")
    line = next(x for x in text.splitlines() if x.startswith("trilm-128x4") and "curve" in x)
    assert f"{row.predicted:.4f} [{row.low:.4f}, {row.high:.4f}]" in line and f"{row.measured:.4f}" in line


def test_forecast_from_outside_zero_to_one_is_refused_by_name(tmp_path, capsys):
    for value in ("1.5", "0"):
        argv = ["suite", "analyse", "quickstart", "--run-dir", str(tmp_path), "--forecast-from", value]
        assert main(argv) == 2
        assert f"--forecast-from: a share of the run in (0, 1), got {float(value)}" in capsys.readouterr().err


def test_the_forecast_reads_the_periodic_evaluations_of_a_runs_metrics_log(analysed, tmp_path):
    """``trilm suite status`` forecasts from snapshots and the metrics log's ``val_loss`` alike; the
    predicted-against-measured check must see the same points, or it tests another forecast."""
    suite, result, curves = analysed
    suite = load_suite("quickstart", root=tmp_path)
    run = next(r for r in suite.runs if r.name == "trilm-64x2")
    extra = [(s, float(np.interp(s, *zip(*curves[run.name], strict=True))) + 0.001) for s in (192, 320, 448)]
    (run.run_dir / "logs").mkdir(parents=True)
    (run.run_dir / "logs" / "metrics.jsonl").write_text(
        "".join(f'{{"step": {s}, "val_loss": {v}}}\n' for s, v in extra) + '{"step": 5, "loss": 7.0}\n'
    )
    rows, _ = curve_predictions(suite.runs, result.report)
    row = next(r for r in rows if r.run == run.name)
    assert row.n_points == 3  # the run directory's points replace the table's: only the log's three
    others = next(r for r in rows if r.run == "trilm-96x3")
    assert others.n_points == 5 and others.kind == "forecast"  # no run directory: the table's checkpoints
