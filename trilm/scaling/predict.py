"""What a saved fit predicts: a loss curve along a schedule, or losses at sizes and budgets, with intervals.

``trilm scaling predict DIR/fit.json`` reads a :class:`trilm.scaling.fitter.Fit` and writes
``{"law": …, "predictions": [{"step" or "params"/"tokens"(/"bits"), "loss", "low", "high"}, …]}``; ``low``
and ``high`` are the percentile interval of the fit's bootstrap refits (``null`` for a fit without them).
A schedule table may carry measured losses; they are kept beside the prediction (``measured``) and drawn.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from trilm.scaling.curves import LossCurve
from trilm.scaling.errors import FitError
from trilm.scaling.fitter import Fit
from trilm.scaling.laws import get_law


def _cell(values: np.ndarray | None, i: int) -> float | None:
    return None if values is None else float(values.ravel()[i])


def along_schedule(fit: Fit, schedule: LossCurve, measured: LossCurve | None = None) -> list[dict[str, Any]]:
    """The curve law's loss at every step of ``schedule.steps`` (with ``measured`` losses where given)."""
    if get_law(fit.law).kind != "curve":
        raise FitError(
            f"a {fit.law} fit is a size law: predict it with --params and --tokens, not --schedule"
        )
    pred = fit.predict(schedule)
    known = {} if measured is None else dict(zip(measured.steps.tolist(), measured.loss.tolist()))
    rows = []
    for i, step in enumerate(schedule.steps.tolist()):
        row = {
            "step": int(step),
            "loss": float(pred.value[i]),
            "low": _cell(pred.low, i),
            "high": _cell(pred.high, i),
        }
        if step in known:
            row["measured"] = known[step]
        rows.append(row)
    return rows


def at_sizes(
    fit: Fit, params: Sequence[float], tokens: Sequence[float], bits: Sequence[float] = ()
) -> list[dict[str, Any]]:
    """The size law at every combination of ``params`` × ``tokens`` (× ``bits`` for the precision law)."""
    law = get_law(fit.law)
    if law.kind == "curve":
        raise FitError(f"a {fit.law} fit is a curve law: predict it along a schedule with --schedule TABLE")
    inputs = getattr(law, "inputs", ())
    given = {"N": list(params), "D": list(tokens), "P": list(bits)}
    names = {"N": "--params", "D": "--tokens", "P": "--bits"}
    for key in inputs:
        if not given[key]:
            raise FitError(f"{law.formula} needs {names[key]}")
    for key in ("N", "D", "P"):
        if given[key] and key not in inputs:
            raise FitError(f"{law.formula} has no {key}: drop {names[key]}")
    combos = list(itertools.product(*[given[k] for k in inputs]))
    columns = {k: np.array([c[i] for c in combos], float) for i, k in enumerate(inputs)}
    pred = fit.predict(**columns)
    label = {"N": "params", "D": "tokens", "P": "bits"}
    rows = []
    for i, combo in enumerate(combos):
        row: dict[str, Any] = {label[k]: float(v) for k, v in zip(inputs, combo)}
        row |= {"loss": float(pred.value.ravel()[i]), "low": _cell(pred.low, i), "high": _cell(pred.high, i)}
        rows.append(row)
    return rows


def write_predictions(path: str | Path, fit: Fit, rows: list[dict[str, Any]]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"law": fit.law, "formula": fit.formula, "level": fit.level, "predictions": rows}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def plot_predictions(path: str | Path, fit: Fit, rows: list[dict[str, Any]]) -> Path:
    """The predicted loss with its interval band against step (a curve law) or tokens, one line per size."""
    # deferred for start-up time: matplotlib loads only when a plot is drawn
    import matplotlib

    # deferred for start-up time: the backend is chosen before pyplot loads
    import matplotlib.pyplot as plt

    matplotlib.use("Agg")

    path = Path(path)
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    if rows and "step" in rows[0]:
        groups = {"": rows}
        x_key, x_label = "step", "step"
    else:
        groups = {}
        for r in rows:
            key = f"N = {r['params']:.3g}" + (f", P = {r['bits']:.3g}" if "bits" in r else "")
            groups.setdefault(key, []).append(r)
        x_key, x_label = "tokens", "tokens D"
        ax.set_xscale("log")
    for label, group in groups.items():
        x = np.array([r[x_key] for r in group], float)
        y = np.array([r["loss"] for r in group], float)
        order = np.argsort(x)
        (line,) = ax.plot(x[order], y[order], lw=1.4, label=label or f"{fit.law} prediction")
        if group[0]["low"] is not None:
            lo = np.array([r["low"] for r in group], float)[order]
            hi = np.array([r["high"] for r in group], float)[order]
            ax.fill_between(x[order], lo, hi, color=line.get_color(), alpha=0.2, lw=0)
        seen = [(r[x_key], r["measured"]) for r in group if "measured" in r]
        if seen:
            ax.plot(*zip(*seen), ".", ms=3, color="k", label="measured")
    if x_key == "step":
        late = [r for r in rows if r["step"] >= 0.05 * rows[-1]["step"]]
        values = [
            v for r in late for v in (r["loss"], r["low"], r["high"], r.get("measured")) if v is not None
        ]
        if values:
            pad = 0.05 * (max(values) - min(values) or 1.0)
            ax.set_ylim(min(values) - pad, max(values) + pad)
    ax.set_xlabel(x_label)
    ax.set_ylabel("loss")
    ax.set_title(
        f"{fit.law}: {fit.formula}\nband: {round(fit.level * 100)} % interval of bootstrap refits", fontsize=8
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


__all__ = ["along_schedule", "at_sizes", "plot_predictions", "write_predictions"]
