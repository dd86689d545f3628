"""Why L(N, D) = E + A/N^α + B/D^β misses the cooldown experiment's held-out runs, and what was tried.

The additive (Chinchilla) form says that the loss gap between two sizes is the same at every D: the N term
does not depend on D. :func:`size_gaps` measures that gap on the cooldown branches and the runs' ends, so the
report can show whether it holds. Two alternatives are then fitted on the same points (the branches that end
at ≤ ½ of the budget) and asked for the same held-out predictions:

- the additive form on a later window (:data:`LATE_WINDOW`: the branches from ¼ of the budget on), in case
  the earliest branch, 128 steps past warm-up, is not yet in the power-law regime;
- Kaplan et al. (2020)'s interacting form with an irreducible loss (the ``kaplan_e`` law of
  :mod:`trilm.scaling.laws`), ``L = E + ((N_c/N)^(α_N/α_D) + D_c/D)^α_D``, in which a model is data-limited
  (all sizes alike) at small D and size-limited at large D, so the gap between sizes grows with D.

Both were chosen after the additive form's misses were seen; the report says so. Every fit is
:func:`trilm.scaling.fitter.fit` with the main fit's objective and bootstrap by lineage; the held-out rows
and the main fit are :mod:`experiments.cooldown.heldout`. :func:`markdown` and :func:`rerun_markdown` are
the report's sections on both.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from experiments.cooldown.heldout import bound, finals, fit_rows, predict_row, prediction_row
from trilm.scaling.analyse import branch_parent
from trilm.scaling.errors import FitError

LATE_WINDOW = 0.25
"""The later window's first branch, as a fraction of the budget."""
KAPLAN = "kaplan_e"
"""Kaplan's interacting form with an irreducible loss, in :mod:`trilm.scaling.laws`."""


def size_gaps(rows: list, budget: float, order: tuple[str, ...]) -> list[dict[str, Any]]:
    """Per family and D (branch ends and run ends): the loss of every size and the smallest size's loss minus
    the largest's. Under the additive law this gap is one number for every D."""
    table: dict[tuple[str, int], dict[int, float]] = defaultdict(dict)
    for r in finals(rows).values():
        table[(r.family, int(r.tokens))][int(r.nonembedding_params)] = r.loss
    out = []
    for family in order:
        keys = sorted(d for f, d in table if f == family)
        sizes = sorted({n for d in keys for n in table[(family, d)]})
        for d in keys:
            by_n = table[(family, d)]
            gap = by_n[sizes[0]] - by_n[sizes[-1]] if sizes[0] in by_n and sizes[-1] in by_n else None
            out.append(
                {
                    "family": family,
                    "D": d,
                    "fraction": d / budget,
                    "loss_by_N": {str(n): by_n.get(n) for n in sizes},
                    "gap_smallest_largest": gap,
                }
            )
    return out


def alternatives(
    rows: list,
    budget: float,
    fit_up_to: float,
    order: tuple[str, ...],
    bootstrap: int,
    separate: tuple = (),
) -> dict[str, Any]:
    """The additive form on the later window and Kaplan's form on the main fit's points, each predicting the
    same held-out rows as the main fit (``rows``' held-out ends and the ``separate`` runs' finals): per
    family the parameters and per held-out row the prediction."""

    last = finals(rows)
    out: dict[str, Any] = {"late_window": {}, "kaplan": {}}
    for family in order:
        fam = [r for r in last.values() if r.family == family]
        points = [r for r in fam if branch_parent(r) and r.tokens <= fit_up_to * budget + 1]
        held = sorted((r for r in fam if r not in points), key=lambda r: (r.nonembedding_params, r.tokens))
        held += [r for r in separate if r.family == family]
        if len(points) < 6:
            continue
        late = [r for r in points if r.tokens >= LATE_WINDOW * budget - 1]
        entry: dict[str, Any] = {"points": len(late)}
        try:
            label = f"{family} L(N, D) from {LATE_WINDOW:g} of the budget"
            law = fit_rows("additive", late, bootstrap, label)
            entry["params"] = law.params
            entry["identified"] = law.identified
            entry["not_identified_because"] = list(law.reasons)
            entry["predictions"] = [prediction_row(r, *predict_row(law, r)) for r in held]
        except FitError as exc:
            entry["error"] = str(exc)
        out["late_window"][family] = entry
        try:
            kap = fit_rows(KAPLAN, points, bootstrap, f"{family} Kaplan's form")
        except FitError as exc:
            out["kaplan"][family] = {"error": str(exc)}
            continue
        resid = kap.log_residuals
        out["kaplan"][family] = {
            "law": KAPLAN,
            "points": len(points),
            "params": kap.params,
            "param_intervals": kap.param_intervals(),
            "rms_log_residual": float(np.sqrt(np.mean(resid * resid))),
            "resamples": int(kap.bootstrap.get("n_accepted", 0)),
            "identified": kap.identified,
            "not_identified_because": list(kap.reasons),
            "predictions": [prediction_row(r, *predict_row(kap, r)) for r in held],
        }
    return out


def _score(preds: list[dict[str, Any]], target: float) -> str:
    within = sum(abs(p["error"]) <= target for p in preds)
    inside = sum(bool(p["inside_interval"]) for p in preds)
    worst = max((abs(p["error"]) for p in preds), default=float("nan"))
    return f"{within} of {len(preds)} within {target} nats, {inside} inside their interval, worst {worst:.4f}"


def _plausible(entry: dict[str, Any]) -> str:
    """Why the plausibility rules reject a fit, for the end of its table row (empty for a fit they accept)."""
    if entry.get("identified", True):
        return ""
    return "; not plausible: " + "; ".join(entry.get("not_identified_because", []))


def markdown(result: dict[str, Any], names: dict[str, str]) -> list[str]:
    """The report's section on why the additive law misses and what the two alternatives predict."""
    target, budget = result["target_nats"], result["budget"]
    lines = [
        "## Why the predictions miss: the gap between sizes grows with D",
        "",
        "E + A/N^α + B/D^β adds an N term that does not depend on D, so it says the loss gap between two"
        " sizes is the same at every D. Measured on the branches and the runs' ends (cooled models):",
        "",
        "| family | D (fraction of budget) | loss by size, smallest to largest | smallest − largest |",
        "|---|---|---|---|",
    ]
    for g in result["size_gaps"]:
        losses = ", ".join("–" if v is None else f"{v:.4f}" for v in g["loss_by_N"].values())
        gap = "–" if g["gap_smallest_largest"] is None else f"{g['gap_smallest_largest']:.4f}"
        lines.append(f"| {names[g['family']]} | {g['D']:,} ({g['fraction']:.3g}) | {losses} | {gap} |")
    lines += [
        "",
        "The larger models keep pulling away as D grows: at these budgets (about 1 to 60 tokens per"
        " non-embedding parameter) every model is far from converged, and a larger one gains more from each"
        " further token. Fitted on D ≤ ½ of the budget, the additive law takes the gap it saw there and"
        " carries it unchanged to the full budget, so it over-predicts the larger models' losses there.",
        "",
        f"## What was tried (both chosen after the misses above were seen; the budget is {budget:,} tokens)",
        "",
        f"1. The same law on a later window: the branches from {LATE_WINDOW:g} of the budget on (dropping the"
        " earliest branch, whose constant phase is only ~128 steps past warm-up).",
        "2. Kaplan et al. (2020)'s interacting form with an irreducible loss, L = E + ((N_c/N)^(α_N/α_D) +"
        " D_c/D)^α_D (the `kaplan_e` law), on the main fit's points: data-limited (sizes alike) at small D,"
        " size-limited at large D, so the gap between sizes grows with D.",
        "",
        "| family | main fit (additive, D ≤ ½) | later window (additive) | Kaplan's form |",
        "|---|---|---|---|",
    ]
    alt = result["alternatives"]
    for family in names:
        main = [p for p in result["predictions"] if p["family"] == family]
        if not main:
            continue
        cells = [_score(main, target)]
        for key in ("late_window", "kaplan"):
            entry = alt.get(key, {}).get(family, {})
            scored = _score(entry["predictions"], target) if "predictions" in entry else None
            cells.append(scored or entry.get("error", "–"))
        lines.append(f"| {names[family]} | " + " | ".join(cells) + " |")
    lines += ["", "Kaplan's form per held-out run:", ""]
    lines += ["| run | D | predicted [95 % CI] | measured | error |", "|---|---|---|---|---|"]
    for family in names:
        entry = alt.get("kaplan", {}).get(family, {})
        if "params" in entry:
            p = entry["params"]
            lines.append(
                f"| **{names[family]}**: E = {p['E']:.3f}, N_c = {p['N_c']:.3g}, D_c = {p['D_c']:.3g},"
                f" α_N = {p['alpha_N']:.3f}, α_D = {p['alpha_D']:.3f}; RMS log residual on its"
                f" {entry['points']} points {entry['rms_log_residual']:.4f}{_plausible(entry)} |||||"
            )
        for q in entry.get("predictions", []):
            ci = "" if not q["interval"] else f" [{bound(q['interval'][0])}, {bound(q['interval'][1])}]"
            lines.append(
                f"| {q['run']} | {q['D']:,} | {q['predicted']:.4f}{ci} | {q['measured']:.4f} |"
                f" {q['error']:+.4f} |"
            )
    return lines


def rerun_differences(predictions: list[dict[str, Any]], earlier: dict[str, Any]) -> list[dict[str, Any]]:
    """The same held-out runs measured in an earlier session's run of this experiment (same configs and seeds;
    another machine of the same kind, so other summation orders): how far a loss moves when nothing but the
    floating-point path changes. The 0.03-nat target is meaningful only above that."""
    before = {p["run"]: p["measured"] for p in earlier.get("predictions", [])}
    return [
        {"run": p["run"], "family": p["family"], "now": p["measured"], "earlier": before[p["run"]],
         "difference": p["measured"] - before[p["run"]]}
        for p in predictions
        if p["run"] in before
    ]  # fmt: skip


def rerun_markdown(diffs: list[dict[str, Any]], earlier: dict[str, Any]) -> list[str]:
    if not diffs:
        return []
    worst = max(diffs, key=lambda d: abs(d["difference"]))
    rms = float(np.sqrt(np.mean([d["difference"] ** 2 for d in diffs])))
    lines = [
        "## The same runs, trained again",
        "",
        "An earlier session ran this experiment with the same code, configs and seeds on another machine of"
        f" the same kind ({earlier.get('date', '?')[:10]}; its report: `earlier-session-predictions.json`)."
        f" Over the {len(diffs)} held-out runs both measured, the losses differ by {rms:.4f} nats RMS, at"
        f" most {worst['difference']:+.4f} ({worst['run']}). Nothing but the machine changed, so that much"
        " is the noise of the floating-point path (summation order), and no law can predict one run closer.",
        "",
        "| run | this session | earlier session | difference |",
        "|---|---|---|---|",
    ]
    for d in diffs:
        lines.append(f"| {d['run']} | {d['now']:.4f} | {d['earlier']:.4f} | {d['difference']:+.4f} |")
    return lines
