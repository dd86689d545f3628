"""Predicted against measured: how well the suite's laws foretold the final losses that are now known.

Why: a forecast or a fitted law is only worth reading if it predicts what it did not see, and a finished
suite can check that on itself. Two predictions are checked, each on data its fit left out:

- **the curve law** (:mod:`trilm.suite.forecast`, what ``trilm suite status`` shows while a run trains):
  every finished run's checkpoints up to ``fraction`` of its steps, fitted at once and extrapolated to each
  run's last step, against the loss it measured there. The interval is the percentile interval of the joint
  fit's bootstrap refits;
- **the scaling law** L(x) per family (:mod:`trilm.scaling.analyze`'s leave-one-size-out refits): the law
  refitted without a size, at that size, against the size's final loss. The refits have no bootstrap, so
  these rows have no interval.

A run whose forecast is impossible is listed with why ("too early", "no fit"), never dropped; runs that have
not finished are named, since their measured loss does not exist yet.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from trilm.families import display_name
from trilm.model.flops import parameter_counts
from trilm.scaling.curves import LossCurve
from trilm.scaling.forecast import ModelCurves, forecast_models
from trilm.schedule import Schedule
from trilm.suite.forecast import snapshot_curve
from trilm.suite.text import table

if TYPE_CHECKING:
    from trilm.scaling.forecast import ForecastConfig
    from trilm.scaling.report_types import Report
    from trilm.suite.config import SuiteRun

FORECAST_FROM = 0.5
"""Default share of a finished run whose checkpoints the curve-law forecast sees: the status column's
situation half way through a run (the quickstart's runs then have 5 checkpoints past step 128, the law's
minimum)."""
PLOT_STEM = "predicted_vs_measured"
MARKERS = {"floatlm": "o", "trilm": "s", "bilm": "^"}
SPARE_MARKERS = ("D", "v", "P", "X", "<", ">")


@dataclasses.dataclass
class Predicted:
    """One run's (or, for the scaling law, one size's) predicted and measured final loss.

    ``source``: ``curve`` or ``law``; ``kind``: ``forecast``, ``held out``, ``too early`` or ``no fit``."""

    run: str
    family: str
    size: str
    source: str
    basis: str
    kind: str
    measured: float
    predicted: float | None = None
    low: float | None = None
    high: float | None = None
    n_points: int = 0
    note: str = ""

    @property
    def error(self) -> float | None:
        return None if self.predicted is None else self.predicted - self.measured

    @property
    def inside(self) -> bool | None:
        if self.low is None or self.high is None:
            return None
        return bool(self.low <= self.measured <= self.high)


@dataclasses.dataclass
class Predictions:
    fraction: float
    rows: list[Predicted]
    unfinished: list[str] = dataclasses.field(default_factory=list)
    no_law: list[str] = dataclasses.field(default_factory=list)
    """Per family without held-out rows, why (``TriLM: L(N) not identified``)."""
    plot: Path | None = None

    def shown(self) -> list[Predicted]:
        """The rows with a predicted value (what the plot draws)."""
        return [r for r in self.rows if r.predicted is not None]


def curve_predictions(
    runs: list[SuiteRun], report: Report, fraction: float = FORECAST_FROM, cfg: ForecastConfig | None = None
) -> tuple[list[Predicted], list[str]]:
    """Per finished run (its last checkpoint in the table is at its last step): the curve law fitted on
    every finished run's checkpoints up to ``fraction`` of its steps at once (as ``trilm suite status``
    fits a suite at that point), against its measured final loss; and the unfinished runs. The checkpoints
    are those ``trilm suite status`` reads (:func:`trilm.suite.forecast.snapshot_curve`: snapshots and the
    periodic evaluations of the run's metrics log), or the table's where the run directory is gone."""

    if not 0 < fraction < 1:
        raise ValueError(f"forecast_from: the share of a run the forecast sees is in (0, 1), got {fraction}")
    unfinished: list[str] = []
    models: dict[str, ModelCurves] = {}
    finished: list[tuple[SuiteRun, float, int]] = []
    for run in runs:
        rows = report.runs.get(run.name)
        if not rows:
            continue
        if rows[-1].step != run.cfg.steps:
            unfinished.append(f"{run.name} (last checkpoint at step {rows[-1].step:,} of {run.cfg.steps:,})")
            continue
        cut = int(fraction * run.cfg.steps)
        points = dict(zip(*snapshot_curve(run.run_dir), strict=True)) or {r.step: r.loss for r in rows}
        seen = sorted((s, v) for s, v in points.items() if 1 <= s <= cut)
        schedule = Schedule.for_optimizer(run.cfg.optim, run.cfg.schedule, run.cfg.steps)
        lr = np.array([schedule.lr(i) for i in range(schedule.total)], float)
        curve = LossCurve(run.name, lr, [s for s, _ in seen], [v for _, v in seen])
        size = float(parameter_counts(run.cfg.model).nonembedding)
        models[run.name] = ModelCurves([curve], LossCurve(run.name, lr, [lr.size], [1.0]), size)
        finished.append((run, rows[-1].loss, cut))
    forecasts = forecast_models(models, cfg) if models else {}
    out = []
    for run, measured, cut in finished:
        fc = forecasts[run.name]
        out.append(
            Predicted(
                run.name,
                run.family,
                run.size,
                "curve",
                f"curve, steps ≤ {cut:,} ({100 * fraction:g} %)",
                fc.kind,
                measured=measured,
                predicted=fc.loss,
                low=fc.low,
                high=fc.high,
                n_points=fc.n_points,
                note=fc.note,
            )
        )
    return out, unfinished


def law_predictions(report: Report) -> tuple[list[Predicted], list[str]]:
    """Per family and size: the leave-one-size-out prediction of its L(x) law, and per family without one,
    why not."""
    axis = "N" if report.config.x == "params" else "N_nonemb"
    out, none = [], []
    for fam, fa in report.families.items():
        law = fa.law_x
        if law is None:
            continue
        if law.loso is None:
            if not law.identified:
                why = "not identified"
            elif not report.config.loso:
                why = "held-out refits turned off"
            else:
                why = "has fewer than 4 sizes to leave one out"
            none.append(f"{display_name(fam)}: L({axis}) {why}")
            continue
        for entry in law.loso:
            size = str(entry["group"])
            runs = ", ".join(r.run for r in fa.finals if r.size == size)
            basis = f"L({axis}) without {size}"
            if "skipped" in entry:
                measured = float(np.mean([r.loss for r in fa.finals if r.size == size]))
                why = entry["skipped"]
                out.append(Predicted(runs, fam, size, "law", basis, "no fit", measured, note=why))
                continue
            note = "extrapolated beyond the other sizes" if entry["extrapolation"] else ""
            if entry["n_points"] > 1:
                note = "; ".join(filter(None, [f"mean of {entry['n_points']} runs", note]))
            seen = len(fa.finals) - entry["n_points"]
            measured, guess = entry["observed"], entry["predicted"]
            out.append(
                Predicted(
                    runs, fam, size, "law", basis, "held out", measured, guess, n_points=seen, note=note
                )
            )
    return out, none


def predictions(
    runs: list[SuiteRun], report: Report, fraction: float = FORECAST_FROM, cfg: ForecastConfig | None = None
) -> Predictions:
    rows, unfinished = curve_predictions(runs, report, fraction, cfg)
    held, no_law = law_predictions(report)
    return Predictions(fraction, rows + held, unfinished, no_law)


# ---- how it is shown ---------------------------------------------------------------------------------------
HEADERS = ["run", "family", "predicted from", "points", "predicted [interval]", "measured", "error", "inside"]


def _cells(r: Predicted) -> list[str]:
    if r.predicted is None:
        guess, error = r.kind, "–"
    else:
        guess = f"{r.predicted:.4f}"
        if r.low is not None:
            guess += f" [{r.low:.4f}, {r.high:.4f}]"
        error = f"{r.error:+.4f}"
    inside = {True: "yes", False: "no", None: "–"}[r.inside]
    family, measured = display_name(r.family), f"{r.measured:.4f}"
    return [r.run, family, r.basis, str(r.n_points), guess, measured, error, inside]


def summary(p: Predictions) -> list[str]:
    """Per source: how many runs were predicted, the median and largest |error|, how many fell inside."""
    lines = []
    for source, what in (("curve", "curve-law forecasts"), ("law", "held-out sizes")):
        rows = [r for r in p.rows if r.source == source]
        if not rows:
            continue
        done = [r for r in rows if r.predicted is not None]
        text = f"{what}: {len(done)} of {len(rows)} made"
        if done:
            errors = np.abs([r.error for r in done])
            text += f"; median |error| {np.median(errors):.4f}, largest {errors.max():.4f} nats"
            boxed = [r.inside for r in done if r.inside is not None]
            if boxed:
                text += f"; measured inside the interval in {sum(boxed)} of {len(boxed)}"
        lines.append(text)
    return lines


def _notes(p: Predictions) -> list[str]:
    lines = [
        f"{r.run}: {r.kind}: {r.note}" if r.predicted is None else f"{r.run} ({r.basis}): {r.note}"
        for r in p.rows
        if r.note
    ]
    lines += [f"no held-out sizes for {why}" for why in p.no_law]
    if p.unfinished:
        lines.append(f"not finished, so not checked: {', '.join(p.unfinished)}")
    return lines


EXPLAIN = (
    "Each finished run's final loss as the curve law foretold it from the run's checkpoints up to {pct:g} %"
    " of its steps (`trilm suite status`'s forecast), and as each family's L(x) refitted without the run's"
    " size predicts it; error = predicted − measured. The curve law's [interval] is its residual scatter"
    " (95 %), a lower bound on the uncertainty, not the extrapolation error; the held-out sizes have none."
)


def text_lines(p: Predictions) -> list[str]:
    """The terminal block: heading, table, summary and notes."""
    if not p.rows and not p.unfinished:
        return []
    pct = 100 * p.fraction
    lines = [
        f"predicted vs measured final loss (curve law from {pct:g} % of each run; L(x) without the size):"
    ]
    if p.rows:
        lines.append(table(HEADERS, [_cells(r) for r in p.rows], left=3))
    lines += [f"  {line}" for line in summary(p) + _notes(p)]
    return lines


def markdown_lines(p: Predictions) -> list[str]:
    if not p.rows and not p.unfinished:
        return []
    lines = ["## Predicted vs measured final loss", "", EXPLAIN.format(pct=100 * p.fraction), ""]
    if p.rows:
        lines += [table(HEADERS, [_cells(r) for r in p.rows], markdown=True), ""]
    lines += [f"- {line}" for line in summary(p) + _notes(p)]
    if p.plot is not None:
        lines += ["", f"![predicted vs measured]({p.plot.name})"]
    return [*lines, ""]


def figure(p: Predictions):
    """Predicted against measured, one colour and marker per family; curve forecasts filled with their
    interval as error bars, held-out sizes hollow; the line y = x is a perfect prediction. None when no
    row has a prediction."""
    # deferred for start-up time: loads matplotlib only when called
    from matplotlib.figure import Figure

    from trilm.scaling.plots import family_colors, legend_outside, lin_limits

    rows = p.shown()
    if not rows:
        return None
    families = list(dict.fromkeys(r.family for r in rows))
    colors = family_colors(families)
    spare = iter(SPARE_MARKERS * 4)
    markers = {f: MARKERS.get(f) or next(spare) for f in families}
    fig = Figure(figsize=(6.4, 4.8))
    ax = fig.subplots()
    values = [v for r in rows for v in (r.measured, r.predicted, r.low, r.high) if v is not None]
    lo, hi = lin_limits(values)
    ax.plot([lo, hi], [lo, hi], color="0.5", linestyle="--", linewidth=1, label="predicted = measured")
    for fam in families:
        for source, label in (
            ("curve", f"curve law, {100 * p.fraction:g} % seen"),
            ("law", "scaling law, size held out"),
        ):
            mine = [r for r in rows if r.family == fam and r.source == source]
            if not mine:
                continue
            x = np.array([r.measured for r in mine])
            y = np.array([r.predicted for r in mine])
            err = None
            spans = [(r.predicted, r.low, r.high) for r in mine]
            bounded = [(m, a, b) for m, a, b in spans if m is not None and a is not None and b is not None]
            if len(bounded) == len(mine):  # an interval has both ends and a prediction
                err = np.array([[m - a, b - m] for m, a, b in bounded]).T
            face = colors[fam] if source == "curve" else "none"
            ax.errorbar(
                x,
                y,
                yerr=err,
                fmt=markers[fam],
                color=colors[fam],
                capsize=3,
                markerfacecolor=face,
                label=f"{display_name(fam)}: {label}",
            )
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_aspect("equal")
    ax.set_xlabel("measured final loss (nats)")
    ax.set_ylabel("predicted final loss (nats)")
    ax.set_title("predicted vs measured final loss", fontsize=10)
    ax.grid(True, alpha=0.3)
    legend_outside(ax)
    fig.tight_layout()
    return fig


def write_plot(p: Predictions, out_dir: Path) -> dict[str, str]:
    """Write ``predicted_vs_measured.png`` and ``.svg`` into ``out_dir`` (nothing without a prediction)."""
    # deferred for start-up time: loads matplotlib only when called
    from trilm.scaling.plots import save

    fig = figure(p)
    if fig is None:
        return {}
    files = save(fig, Path(out_dir), PLOT_STEM)
    p.plot = Path(files[f"{PLOT_STEM}.png"])
    return files


__all__ = [
    "FORECAST_FROM",
    "Predicted",
    "Predictions",
    "curve_predictions",
    "law_predictions",
    "markdown_lines",
    "predictions",
    "text_lines",
    "write_plot",
]
