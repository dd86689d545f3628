"""L(N, D) fitted on cooldown branches and tested on runs it has not seen: the cooldown experiment's numbers.

The ``cooldown`` suite trains TriLM, FloatLM and BiLM at four sizes on warmup-stable-decay schedules, with
cooldown branches (:mod:`trilm.suite.cooldown`) at fractions of the budget. :func:`fit_and_predict` fits
L(N, D) = E + A/N^α + B/D^β (the ``additive`` law of :mod:`trilm.scaling.laws`, bootstrapped over lineages)
per family on the branches that end at no more than :data:`FIT_UP_TO` of the budget and predicts what it
never saw: each WSD run's own end and the later branches; :func:`predict_separate` predicts the CPU ladder's
runs of the same budget and rate, trained separately on each family's own decaying schedule. Held-out means
held out of the fit: the runs' ends share their training up to the last branch point with the fitted
branches, which is what the method sells (one run per size gives the whole grid); the ladder's runs share
nothing with them.

:func:`fresh_comparison` sets, at equal compute, a branch (or a run's end) against a fresh run of the same
length on the family's own schedule (Hägele et al. 2024 report that they match); :func:`decay_stage` and
:func:`rate_drop` measure what a cooldown and Spectra's mid-run rate drop buy (MiniCPM's appendix D). Rows
are :class:`trilm.scaling.table.ResultRow`; ``python -m experiments.cooldown report`` writes the report
(docs/results/cooldown/) from these (:mod:`experiments.cooldown.run`), and
:mod:`experiments.cooldown.diagnosis` says why the additive law misses.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from trilm.families import display_name
from trilm.scaling.analyse import branch_parent, lineage
from trilm.scaling.errors import FitError
from trilm.scaling.fitter import Fit, fit

FIT_UP_TO = 0.5
"""The branches that end at no more than this fraction of the budget are the fit's data."""
TARGET = 0.03
"""The experiment's target: every prediction within this many nats."""
LAW = "additive"
"""The law of the main fit (:mod:`trilm.scaling.laws`)."""
SEED = 0
"""The bootstrap's seed: the report is the same on every rerun."""
LADDER_RATE = "lr0.004"
"""The ladder's runs at the cooldown suite's peak rate."""
ORDER = ("floatlm", "trilm", "bilm")
"""The families, in the order the report lists them."""
NAMES = {family: display_name(family) for family in ORDER}
"""Each family as the report names it."""


def finals(rows: list) -> dict[str, Any]:
    """The last checkpoint of every run in ``rows``."""
    last: dict[str, Any] = {}
    for r in rows:
        if r.run not in last or r.step > last[r.run].step:
            last[r.run] = r
    return last


def prediction_row(r, predicted: float, interval: list[float] | None) -> dict[str, Any]:
    """A prediction for run ``r`` beside its measured loss: the error, and whether the interval holds it."""
    inside = None if interval is None else bool(interval[0] <= r.loss <= interval[1])
    return {
        "run": r.run,
        "N": r.nonembedding_params,
        "D": int(r.tokens),
        "predicted": predicted,
        "interval": interval,
        "measured": r.loss,
        "error": predicted - r.loss,
        "inside_interval": inside,
    }


def points_data(points: list) -> dict[str, Any]:
    """Rows as a size law's data: N non-embedding parameters, D tokens, the loss, and each row's lineage as
    its bootstrap unit (a run with its cooldown branches, which share their training before each branch
    point)."""
    return {
        "N": np.array([r.nonembedding_params for r in points], float),
        "D": np.array([r.tokens for r in points], float),
        "loss": np.array([r.loss for r in points], float),
        "unit": [lineage(r) for r in points],
    }


def fit_rows(law: str, points: list, bootstrap: int, label: str) -> Fit:
    """``law`` fitted on ``points`` and bootstrapped over their lineages (``bootstrap`` resamples, seed
    :data:`SEED`). Raises :class:`FitError` when it cannot be fitted."""
    return fit(law, points_data(points), bootstrap=bootstrap, seed=SEED, label=label)


def predict_row(law: Fit, r) -> tuple[float, list[float] | None]:
    """The fitted law's loss at run ``r``'s (N, D) and its bootstrap interval ([lo, hi], or None without
    enough refits)."""
    p = law.predict(N=r.nonembedding_params, D=r.tokens)
    value = float(p.value)
    if p.low is None or p.high is None:
        return value, None
    return value, [float(p.low), float(p.high)]


def bound(value: float) -> str:
    """An interval bound: a resample whose fit ran off shows as 1.52e+11, not twelve digits."""
    return f"{value:.4f}" if abs(value) < 100 else f"{value:.2e}"


def _loss_at(rows: list, run: str, step: int) -> float | None:
    """The loss of ``run`` at ``step`` in ``rows``, if that checkpoint was measured."""
    for r in rows:
        if r.run == run and r.step == step:
            return r.loss
    return None


def fit_and_predict(rows: list, bootstrap: int) -> tuple[dict[str, Any], list[dict[str, Any]], dict]:
    """Per family, L(N, D) fitted on the branches that end at ≤ :data:`FIT_UP_TO` of the budget (bootstrapped
    over lineages), and its predictions for the rest of ``rows``' finals: (the laws as the report states
    them, one prediction row per held-out run, the fits by family as (law, fitted rows, held-out rows))."""

    last = finals(rows)
    parents = {n: r for n, r in last.items() if not branch_parent(r)}
    budget = max(r.tokens for r in parents.values())
    laws: dict[str, dict[str, Any]] = {}
    predictions: list[dict[str, Any]] = []
    fitted: dict[str, tuple[Any, list, list]] = {}
    for family in ORDER:
        fam = [r for r in last.values() if r.family == family]
        points = [r for r in fam if branch_parent(r) and r.tokens <= FIT_UP_TO * budget + 1]
        held = [r for r in fam if r not in points]
        if len(points) < 5:
            continue
        try:
            law = fit_rows(LAW, points, bootstrap, f"{NAMES[family]} L(N, D)")
        except FitError as exc:
            laws[family] = {"error": str(exc)}
            continue
        fitted[family] = (law, points, held)
        laws[family] = {
            "law": LAW,
            "params": law.params,
            "param_intervals": law.param_intervals(),
            "points": len(points),
            "bootstrap": law.bootstrap,
            "identified": law.identified,
            "not_identified_because": list(law.reasons),
        }
        for r in sorted(held, key=lambda r: (r.nonembedding_params, r.tokens)):
            kind = "run end (full budget)" if not branch_parent(r) else "branch"
            predictions.append(_prediction(r, kind, *predict_row(law, r)))
    return laws, predictions, fitted


def _prediction(r, kind: str, predicted: float, interval: list[float] | None) -> dict[str, Any]:
    """One held-out row of the report: what the law said for run ``r`` and what was measured."""
    return {"family": r.family, "size": r.size, "kind": kind, **prediction_row(r, predicted, interval)}


def ladder_finals(ladder_rows: list, budget: float) -> list:
    """The final checkpoints of the CPU ladder's runs at the suite's rate and budget, by family and size."""
    last = [r for n, r in finals(ladder_rows).items() if n.endswith(f"-{LADDER_RATE}")]
    return sorted(
        (r for r in last if abs(r.tokens - budget) <= 1), key=lambda r: (r.family, r.nonembedding_params)
    )


def predict_separate(fitted: dict, ladder_rows: list, budget: float) -> list[dict[str, Any]]:
    """The CPU ladder's runs at the suite's rate and budget, trained separately on each family's own decaying
    schedule (docs/results/ladder/): what the law fitted on WSD branches predicts for them."""

    out = []
    for r in ladder_finals(ladder_rows, budget):
        if r.family not in fitted:
            continue
        predicted, ci = predict_row(fitted[r.family][0], r)
        out.append(_prediction(r, "separate run (CPU ladder, own schedule)", predicted, ci))
    return out


def fresh_comparison(rows: list, fresh_rows: list, ladder_rows: list) -> list[dict[str, Any]]:
    """Branch (or WSD run end) against a fresh run of the same length: the same compute, two schedules."""

    last, out = finals(rows), []
    by_key = defaultdict(list)
    for r in last.values():
        by_key[(r.family, r.size, int(r.tokens))].append(r)
    ladder = {n: r for n, r in finals(ladder_rows).items() if n.endswith(f"-{LADDER_RATE}")}
    sources = (("fresh (cooldown-fresh suite)", finals(fresh_rows)), ("ladder fresh run", ladder))
    for source, table in sources:
        for name, fresh in sorted(table.items()):
            for wsd in by_key.get((fresh.family, fresh.size, int(fresh.tokens)), []):
                out.append(
                    {
                        "family": fresh.family,
                        "size": fresh.size,
                        "D": int(fresh.tokens),
                        "wsd": wsd.run,
                        "wsd_kind": "branch" if branch_parent(wsd) else "run end",
                        "wsd_loss": wsd.loss,
                        "fresh": f"{source}: {name}",
                        "fresh_loss": fresh.loss,
                        "difference": wsd.loss - fresh.loss,
                    }
                )
    return out


def decay_stage(rows: list, suite) -> list[dict[str, Any]]:
    """Per WSD run: the loss at the last snapshot before its cooldown, at its end, and (for scale) what the
    same number of steps at the constant rate bought just before."""

    out = []
    for run in suite.runs:
        mine = sorted((r for r in rows if r.run == run.name and not branch_parent(r)), key=lambda r: r.step)
        if not mine or mine[-1].step < run.cfg.steps:
            continue
        start = int(run.cfg.steps * (1 - run.cfg.schedule.cooldown))
        before = [r for r in mine if r.step <= start]
        if len(before) < 2:
            continue
        pre, end = before[-1], mine[-1]
        span = end.step - pre.step
        earlier = [r for r in before if r.step <= pre.step - span]
        trend = (earlier[-1].loss - pre.loss) if earlier else None
        out.append(
            {
                "run": run.name,
                "family": run.family,
                "size": run.size,
                "cooldown_from_step": start,
                "loss_before": pre.loss,
                "before_step": pre.step,
                "loss_end": end.loss,
                "gain": pre.loss - end.loss,
                "gain_at_constant_rate_before": trend,
                "constant_from_step": earlier[-1].step if earlier else None,
                "share_of_final": (pre.loss - end.loss) / end.loss,
            }
        )
    return out


def rate_drop(ladder_rows: list) -> list[dict[str, Any]]:
    """The ladder's fresh runs around the middle of the run, where TriLM and BiLM halve their rate (Spectra's
    rate drop at ½; FloatLM's cosine has no event there): the loss fallen in the 256 steps after the middle
    against the 256 steps before it. Their difference is what the event buys beyond the run's own trend."""
    out = []
    for name, last in sorted(finals(ladder_rows).items()):
        if not name.endswith(f"-{LADDER_RATE}"):
            continue
        mid = last.step // 2
        before, at, after = (_loss_at(ladder_rows, name, s) for s in (mid - 256, mid, mid + 256))
        if before is None or at is None or after is None:
            continue
        out.append(
            {
                "run": name,
                "family": last.family,
                "size": last.size,
                "middle_step": mid,
                "gain_before": before - at,
                "gain_after": at - after,
                "excess": (at - after) - (before - at),
            }
        )
    return out
