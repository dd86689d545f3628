"""Where will a run end? Curve-law forecasts of every committed run's final loss from its first 25 % and 50 %,
each model alone and with the suite's models fitted jointly (annealing shared), on the committed curves.

Launch (reads only committed tables and the suites' configs, trains nothing)::

    python -m experiments.cooldown.forecasts     # docs/results/cooldown/forecasts.json and forecasts.md

Runs: the cooldown suite's WSD runs (``docs/results/cooldown/results.csv``; with each, the checkpoints of its
cooldown branches that ended before the cut, as a user running ``trilm suite cooldown`` has them) and the
CPU ladder's runs at the peak rate 4e-3 (``docs/results/ladder/analysis/results.csv``: Spectra's schedule for
TriLM and BiLM, the rate halved at ½; cosine for FloatLM). Each suite is one joint fit, as ``trilm suite
status`` makes it: every run cut at the same fraction. The targets (issue 56): from 50 % within 0.02 nats,
from 25 % within 0.04, and the measured loss inside the 95 % interval in ≥ 90 % of forecasts.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import CHECKOUT, write_result
from trilm.scaling.curves import LossCurve
from trilm.scaling.fitter import fit
from trilm.scaling.forecast import ForecastConfig, ModelCurves, forecast_models
from trilm.scaling.table import ResultRow, read_table
from trilm.schedule import Schedule
from trilm.suite.config import load_suite
from trilm.suite.cooldown import cooldown_branches

OUT = CHECKOUT / "docs" / "results" / "cooldown"
LADDER_TABLE = CHECKOUT / "docs" / "results" / "ladder" / "analysis" / "results.csv"
LADDER_RATE = "lr0.004"
CUTS = {0.25: 0.04, 0.5: 0.02}
"""Fraction of the run seen → the target |error| of the forecast final loss (nats)."""
INSIDE_TARGET = 0.9
VARIANTS: dict[str, dict[str, Any]] = {
    "alone": {"law": "tissue", "shared": [], "joint": False},
    "joint, C shared": {"law": "tissue", "shared": ["C"], "joint": True},
    "joint, C and α shared": {"law": "tissue", "shared": ["C", "alpha"], "joint": True},
    "λ fitted, alone": {"law": "tissue_lambda", "shared": [], "joint": False},
    "λ fitted, joint, C and λ shared": {"law": "tissue_lambda", "shared": ["C", "h"], "joint": True},
    "λ fitted, joint, λ shared, C ∝ N^k": {
        "law": "tissue_lambda",
        "shared": ["C", "h"],
        "size_trend": ["C"],
        "joint": True,
    },
    "λ fitted, joint, λ shared": {"law": "tissue_lambda", "shared": ["h"], "joint": True},
    "multi-power, joint, drop shared": {
        "law": "multipower",
        "shared": ["B", "C", "beta", "gamma"],
        "joint": True,
    },
}
"""Each model fitted alone (no borrowing), and the suite's models fitted at once sharing the annealing
parameter C (or C and the exponent α); the same with Tissue's momentum λ fitted, shared with C, alone, or
with C a power of the non-embedding parameter count (``size_trend``: ``trilm suite status``'s default)."""


@dataclasses.dataclass
class Model:
    name: str
    suite: str
    family: str
    schedule_kind: str
    schedule: Schedule
    rows: list[ResultRow]
    branches: list[tuple[Schedule, list[ResultRow]]]


def _lr(schedule: Schedule) -> np.ndarray:
    return np.array([schedule.lr(i) for i in range(schedule.total)], float)


def _schedule(cfg) -> Schedule:
    return Schedule.for_optimizer(cfg.optim, cfg.schedule, cfg.steps)


def models(rows: list[ResultRow], ladder_rows: list[ResultRow]) -> list[Model]:
    by_run: dict[str, list[ResultRow]] = {}
    for r in rows + ladder_rows:
        if r.eval == "val_loss":
            by_run.setdefault(r.run, []).append(r)
    for v in by_run.values():
        v.sort(key=lambda r: r.step)
    suite = load_suite("cooldown")
    branches: dict[str, list] = {}
    for b in cooldown_branches(suite):
        if b.itself or b.run.name not in by_run:
            continue
        branches.setdefault(b.parent.name, []).append((_schedule(b.run.cfg), by_run[b.run.name]))
    out = [
        Model(
            run.name,
            "cooldown",
            run.family,
            "WSD",
            _schedule(run.cfg),
            by_run[run.name],
            branches.get(run.name, []),
        )
        for run in suite.runs
        if run.name in by_run
    ]
    for run in load_suite("ladder").runs:
        name = f"{run.name}-{LADDER_RATE}"
        if name in by_run:
            kind = "cosine" if run.family == "floatlm" else "Spectra (drop at ½)"
            out.append(Model(name, "ladder", run.family, kind, _schedule(run.cfg), by_run[name], []))
    return out


def seen_curves(model: Model, cut: float) -> ModelCurves:
    """What a user has of ``model`` when its run is at ``cut``: its checkpoints so far and those of its
    branches that ended by then (a branch's steps count from the run's start)."""
    limit = cut * model.schedule.total
    lr = _lr(model.schedule)
    own = [r for r in model.rows if 1 <= r.step <= limit]
    seen = [LossCurve(model.name, lr, [r.step for r in own], [r.loss for r in own])]
    for sched, brows in model.branches:
        if sched.total <= limit:
            done = [r for r in brows if r.step >= 1]
            seen.append(
                LossCurve(
                    f"{model.name} branch {sched.total}",
                    _lr(sched),
                    [r.step for r in done],
                    [r.loss for r in done],
                )
            )
    target = LossCurve(model.name, lr, [model.schedule.total], [1.0])
    return ModelCurves(seen, target, float(model.rows[0].nonembedding_params))


def run_variant(
    all_models: list[Model], cut: float, variant: dict[str, Any], bootstrap: int
) -> list[dict[str, Any]]:
    cfg = ForecastConfig(
        law=variant["law"],
        shared=list(variant["shared"]),
        size_trend=list(variant.get("size_trend", [])),
        bootstrap=bootstrap,
    )
    out = []
    for suite in dict.fromkeys(m.suite for m in all_models):
        mine = [m for m in all_models if m.suite == suite]
        groups = [[m] for m in mine] if not variant["joint"] else [mine]
        for group in groups:
            result = forecast_models({m.name: seen_curves(m, cut) for m in group}, cfg)
            for m in group:
                fc, final = result[m.name], m.rows[-1]
                entry = {
                    "run": m.name,
                    "suite": suite,
                    "family": m.family,
                    "schedule": m.schedule_kind,
                    "cut": cut,
                    "kind": fc.kind,
                    "points": fc.n_points,
                    "measured": final.loss,
                    "note": fc.note,
                }
                if fc.kind == "forecast":
                    inside = None if fc.low is None else bool(fc.low <= final.loss <= fc.high)
                    entry |= {
                        "predicted": fc.loss,
                        "low": fc.low,
                        "high": fc.high,
                        "error": fc.loss - final.loss,
                        "inside": inside,
                    }
                out.append(entry)
    return out


def summary(entries: list[dict[str, Any]], target: float) -> dict[str, Any]:
    made = [e for e in entries if "error" in e]
    err = np.array([abs(e["error"]) for e in made])
    inside = [e["inside"] for e in made if e["inside"] is not None]
    return {
        "runs": len(entries),
        "forecast": len(made),
        "median_abs_error": float(np.median(err)) if err.size else None,
        "max_abs_error": float(err.max()) if err.size else None,
        "within_target": int((err <= target).sum()),
        "inside_interval": int(sum(inside)),
        "with_interval": len(inside),
        "mean_error": float(np.mean([e["error"] for e in made])) if made else None,
        "target": target,
    }


def _num(v: float | None, digits: int = 4) -> str:
    return "–" if v is None else f"{v:.{digits}f}"


def summary_cells(s: dict[str, Any]) -> str:
    """A summary's cells from forecasts made to inside the interval, as a table row ends."""
    return (
        f"{s['forecast']} / {s['runs']} | {_num(s['median_abs_error'])} | {_num(s['max_abs_error'])} |"
        f" {_num(s['mean_error'])} | {s['within_target']} of {s['forecast']} (≤ {s['target']}) |"
        f" {s['inside_interval']} of {s['with_interval']} |"
    )


def forecast_cells(e: dict[str, Any]) -> str:
    """One forecast's cells, from the forecast and its interval (or why there is none) to the note."""
    if "error" not in e:
        return f"{e['kind']} | {e['measured']:.4f} | – | {e['note']} |"
    band = "" if e["low"] is None else f" [{e['low']:.4f}, {e['high']:.4f}]"
    return f"{e['predicted']:.4f}{band} | {e['measured']:.4f} | {e['error']:+.4f} | {e['note']} |"


LAW_TEXT = {
    "tissue": "`tissue`: Tissue et al.'s L(s) = L0 + A·S1^(−α) − C·S2",
    "multipower": "`multipower`: Luo et al.'s L0 + A·S1^(−α) minus a drop that saturates with the cooldown",
    "tissue_lambda": "`tissue_lambda`: the same with S2's momentum λ fitted (h = 1/(1 − λ) steps)",
}


def finished_fits(all_models: list[Model]) -> list[dict[str, Any]]:
    """Each cooldown-suite run's own ``tissue_lambda`` fit on its whole curve and its branches: what the
    annealing looks like where it is seen, size by size (the evidence for sharing λ and letting C grow
    with size)."""
    out = []
    for m in all_models:
        if m.suite != "cooldown":
            continue
        curves = [c.after(ForecastConfig().min_step) for c in seen_curves(m, 1.0).seen]
        result = fit("tissue_lambda", [c for c in curves if c.steps.size])
        entry = {"run": m.name, "nonembedding_params": int(m.rows[0].nonembedding_params)}
        out.append(entry | {k: result.params[k] for k in ("C", "h")} | {"reasons": list(result.reasons)})
    return out


def finished_lines(finished: list[dict[str, Any]]) -> list[str]:
    lines = [
        "## The annealing each finished run shows",
        "",
        "Each cooldown-suite run's own `tissue_lambda` fit on its whole curve and its branches: C and the"
        " memory h = 1/(1 − λ) in steps (Tissue et al.'s fixed λ = 0.999 is h = 1,000).",
        "",
        "| run | non-embedding parameters | C | h (steps) | note |",
        "|---|---|---|---|---|",
    ]
    for f in finished:
        note = "; ".join(f["reasons"])
        lines.append(f"| {f['run']} | {f['nonembedding_params']:,} | {f['C']:.5f} | {f['h']:.1f} | {note} |")
    return [*lines, ""]


def markdown(result: dict[str, Any], out: Path = OUT, finished: list[dict[str, Any]] | None = None) -> str:
    source = os.path.relpath(CHECKOUT / "experiments" / "cooldown" / "forecasts.py", Path(out).resolve())
    used = dict.fromkeys(v["law"] for v in result["variants"].values())
    laws = "; ".join(LAW_TEXT[law] for law in used)
    lines = [
        "# Forecasting a run's final loss from its first checkpoints",
        "",
        f"Written by [`experiments/cooldown/forecasts.py`]({source})"
        " (`python -m experiments.cooldown.forecasts`) from the committed tables; nothing was trained"
        " for it.",
        f"Each variant's curve law ({laws}) on validation checkpoints from step"
        f" {result['config']['min_step']} on (the areas from each run's own schedule, warm-up counted at the"
        f" peak rate), {result['config']['bootstrap']} bootstrap refits per fit over stretches of every"
        " curve, 95 % intervals. *alone*: each model fitted on its own checkpoints and its branches'."
        " *joint*: every model of the suite fitted at once, each with its own L0, A (and α), the named"
        " parameters shared (*C ∝ N^k*: C a power of each model's non-embedding parameter count, one"
        " coefficient and one exponent for the suite).",
        "",
        "| variant | schedule, seen | forecast / runs | median \\|error\\| | largest | mean error"
        " | within target | measured inside interval |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for variant, by_key in result["summary"].items():
        for key, s in by_key.items():
            lines.append(f"| {variant} | {key} | " + summary_cells(s))
    lines += [""]
    if finished:
        lines += finished_lines(finished)
    lines += ["## Every forecast", ""]
    lines += ["| variant | run | schedule | seen | points | forecast [95 %] | measured | error | note |"]
    lines.append("|---|---|---|---|---|---|---|---|---|")
    for variant, entries in result["forecasts"].items():
        for e in entries:
            head = f"| {variant} | {e['run']} | {e['schedule']} | {e['cut']:.0%} | {e['points']} | "
            lines.append(head + forecast_cells(e))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.cooldown.forecasts", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--bootstrap", type=int, default=100)
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument(
        "--markdown-only",
        action="store_true",
        help="rewrite forecasts.md from --out's forecasts.json; fit nothing",
    )
    args = parser.parse_args(argv)
    rows = read_table(OUT / "results.csv")
    ladder_rows = read_table(LADDER_TABLE) if LADDER_TABLE.is_file() else []
    all_models = models(rows, ladder_rows)
    finished = finished_fits(all_models)
    if args.markdown_only:
        result = json.loads((Path(args.out) / "forecasts.json").read_text())
        (Path(args.out) / "forecasts.md").write_text(markdown(result, Path(args.out), finished))
        return
    forecasts: dict[str, list[dict[str, Any]]] = {}
    summaries: dict[str, dict[str, Any]] = {}
    for name in args.variants:
        entries = [e for cut in CUTS for e in run_variant(all_models, cut, VARIANTS[name], args.bootstrap)]
        forecasts[name] = entries
        summaries[name] = {}
        for cut, target in CUTS.items():
            for kind in dict.fromkeys(m.schedule_kind for m in all_models):
                mine = [e for e in entries if e["cut"] == cut and e["schedule"] == kind]
                summaries[name][f"{kind}, {cut:.0%}"] = summary(mine, target)
                print(name, f"{kind}, {cut:.0%}", summaries[name][f"{kind}, {cut:.0%}"])
    cfg = ForecastConfig()
    result = {
        "config": {"min_step": cfg.min_step, "min_points": cfg.points_needed, "bootstrap": args.bootstrap},
        "variants": {k: VARIANTS[k] for k in args.variants},
        "targets": {f"{k:.0%}": v for k, v in CUTS.items()} | {"inside_interval_share": INSIDE_TARGET},
        "summary": summaries,
        "forecasts": forecasts,
    }
    out = Path(args.out)
    write_result(out / "forecasts.json", result, module="experiments.cooldown.forecasts", argv=argv)
    (out / "forecasts.md").write_text(markdown(result, out, finished))
    print(f"wrote {out / 'forecasts.json'}, {out / 'forecasts.md'}")


if __name__ == "__main__":
    main()
