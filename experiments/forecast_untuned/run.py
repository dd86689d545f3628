"""Forecasts of a run's final loss where nothing was tuned: two suites no forecast setting was chosen on,
each run forecast from 25 % and 50 % of it with :class:`trilm.scaling.forecast.ForecastConfig`'s defaults,
as ``trilm suite status`` makes them.

- ``configs/suites/forecast-long.yaml``: TriLM and FloatLM at 32x2 and 64x2 on the cooldown suite's WSD
  recipe for 4x its budget (8,192 steps; 2.5 passes over the embedded corpus), a validation loss every 128
  steps;
- ``configs/suites/forecast-large.yaml``: TriLM and FloatLM at 192x4, above the cooldown suite's largest
  size, at the ladder's rate and budget for it (2,048 steps, under one pass), a validation loss every 64.

Each run has one cooldown branch ending at 1/8 of its budget, the annealing a forecast borrows. Why a test
of its own: the law, the fitter and the forecast's settings were chosen while looking at the cooldown
suite's forecasts (``docs/results/cooldown/forecasts.md``); these runs are longer or larger than any of
those, and nothing here was changed after they were trained.

Launch (the suites' runs, then their curves as tables, then the report)::

    trilm suite launch forecast-long --local && trilm suite cooldown forecast-long
    trilm suite launch forecast-large --local && trilm suite cooldown forecast-large
    python -m experiments.forecast_untuned collect   # docs/results/forecast-untuned/curves/*.csv, runs.json
    python -m experiments.forecast_untuned report    # forecasts.json, README.md, forecasts.png

``report`` reads only the committed tables: each is a loss-curve table of :mod:`trilm.scaling.curves`
(``step``, ``tokens``, ``lr``, ``loss`` = training loss, ``val_loss``), which ``trilm scaling fit --law tissue
--loss val_loss`` reads as it is.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import CHECKOUT, write_result
from experiments.cooldown.forecasts import forecast_cells, summary, summary_cells
from trilm.scaling.curves import LossCurve, read_curve, write_curve
from trilm.scaling.forecast import ForecastConfig, ModelCurves, forecast_models
from trilm.scaling.laws.curve import areas
from trilm.schedule import Schedule

SUITES = ("forecast-long", "forecast-large")
OUT = CHECKOUT / "docs" / "results" / "forecast-untuned"
CUTS = {0.25: 0.04, 0.5: 0.02}
"""Fraction of the run seen → the target |error| of the forecast final loss (nats), issue 56's."""
INSIDE_TARGET = 0.9
VARIANTS: dict[str, tuple[str, list[str], list[str]]] = {
    "suite (C shared)": ("tissue", ["C"], []),
    "alone": ("tissue", [], []),
    "multi-power, suite (drop shared)": ("multipower", ["B", "C", "beta", "gamma"], []),
    "λ fitted, suite (λ shared, C ∝ N^k)": ("tissue_lambda", ["C", "h"], ["C"]),
}
"""Per variant, the curve law and the parameters a suite's models share. ``suite (C shared)`` is ``trilm
suite status``'s default, the test; ``alone`` fits each run with its own branch; the multi-power law with
the shape of the drop shared was added after the default's errors were seen (why: README.md), so it is
not a test where nothing was tuned. ``λ fitted`` (Tissue's law with its momentum fitted, λ shared and C a
power of the non-embedding parameter count) was chosen on the cooldown suite's forecasts after this test's
first report, so it is a test of that choice on runs it was not chosen on, not of one made blind."""
UNTUNED = ("suite (C shared)", "alone")


def _rates(schedule: Schedule) -> np.ndarray:
    return np.array([schedule.lr(i) for i in range(schedule.total)], float)


def _metrics(run_dir: Path) -> tuple[dict[int, dict[str, float]], float]:
    """Per step, the training loss, tokens and validation loss the run logged; and its training seconds
    (first to last record of ``logs/metrics.jsonl``)."""
    rows: dict[int, dict[str, float]] = {}
    times = []
    path = run_dir / "logs" / "metrics.jsonl"
    for line in path.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if not isinstance(record, dict) or not isinstance(record.get("step"), int):
            continue
        if isinstance(record.get("time"), int | float):
            times.append(float(record["time"]))
        row = rows.setdefault(record["step"], {})
        for key in ("tokens", "loss", "val_loss"):
            if isinstance(record.get(key), int | float) and np.isfinite(record[key]):
                row[key] = record[key]
    return rows, (max(times) - min(times)) if times else 0.0


def schedule_rows(lr: np.ndarray) -> list[int]:
    """The steps (1-based) whose rates, joined linearly, give back every step's rate: the ends and each
    step where the schedule bends."""
    bend = np.abs(np.diff(lr, 2)) > 1e-12 * max(float(np.abs(lr).max()), 1e-30)
    return sorted({1, lr.size, *(int(i) + 2 for i in np.flatnonzero(bend))})


def write_table(path: Path, cfg: Any, run_dir: Path) -> tuple[int, float]:
    """One run's curve table; returns (its steps, its training seconds)."""
    lr = _rates(Schedule.for_optimizer(cfg.optim, cfg.schedule, cfg.steps))
    logged, seconds = _metrics(run_dir)
    steps = sorted({*schedule_rows(lr), *(s for s in logged if 1 <= s <= lr.size)})
    rows = [{"step": s, "lr": float(lr[s - 1]), **logged.get(s, {})} for s in steps]
    write_curve(path, rows)
    back = read_curve(path, loss_column="val_loss")
    if back.lr.size != lr.size or not np.allclose(back.lr, lr, rtol=1e-9, atol=0):
        raise RuntimeError(f"{path}: the table does not give back the run's schedule")
    return lr.size, seconds


def collect(out: Path) -> None:
    # deferred for start-up time: the suite loader pulls in torch, which `report` does not need
    from trilm.suite.config import load_suite
    from trilm.suite.cooldown import cooldown_branches

    manifest: dict[str, dict[str, Any]] = {}
    for name in SUITES:
        suite = load_suite(name)
        for run in suite.runs:
            steps, seconds = write_table(out / "curves" / f"{run.name}.csv", run.cfg, run.run_dir)
            manifest[run.name] = {"suite": name, "family": run.family, "size": run.size, "parent": None}
            manifest[run.name] |= {"steps": steps, "seconds": round(seconds, 1)}
        for b in cooldown_branches(suite):
            if b.itself:
                continue
            steps, seconds = write_table(out / "curves" / f"{b.run.name}.csv", b.run.cfg, b.run.run_dir)
            manifest[b.run.name] = {"suite": name, "family": b.parent.family, "size": b.parent.size}
            manifest[b.run.name] |= {"parent": b.parent.name, "steps": steps, "seconds": round(seconds, 1)}
    (out / "runs.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"wrote {len(manifest)} tables under {out / 'curves'} and {out / 'runs.json'}")


def seen_models(
    curves: dict[str, LossCurve], manifest: dict[str, Any], cut: float, sizes: dict[str, float] | None = None
) -> dict[str, Any]:
    """Per run: what a user has at ``cut`` of it (its own checkpoints so far, the branches that ended by
    then), where to forecast (its last step) and its non-embedding parameter count."""
    models = {}
    for name, info in manifest.items():
        if info["parent"] is not None:
            continue
        own = curves[name]
        limit = int(cut * own.total)
        seen = [own.until(limit)]
        seen += [
            curves[b] for b, binfo in manifest.items() if binfo["parent"] == name and curves[b].total <= limit
        ]
        size = None if sizes is None else sizes[name]
        models[name] = ModelCurves(seen, LossCurve(name, own.lr, [own.total], [1.0]), size)
    return models


def run_sizes(manifest: dict[str, Any]) -> dict[str, float]:
    """Each run's non-embedding parameter count, from its suite's config."""
    # deferred for start-up time: the suite loader pulls in torch, which the other variants do not need
    from trilm.model.flops import parameter_counts
    from trilm.suite.config import load_suite

    wanted = {name for name, info in manifest.items() if info["parent"] is None}
    return {
        run.name: float(parameter_counts(run.cfg.model).nonembedding)
        for suite in SUITES
        for run in load_suite(suite).runs
        if run.name in wanted
    }


def forecasts(curves: dict[str, LossCurve], manifest: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    sizes = run_sizes(manifest) if any(trend for _, _, trend in VARIANTS.values()) else None
    for variant, (law, shared, trend) in VARIANTS.items():
        cfg = ForecastConfig(law=law, shared=shared, size_trend=trend)
        entries = []
        for cut in CUTS:
            models = seen_models(curves, manifest, cut, sizes)
            groups = (
                [{k: v for k, v in models.items() if manifest[k]["suite"] == suite} for suite in SUITES]
                if shared
                else [{k: v} for k, v in models.items()]
            )
            for group in [g for g in groups if g]:
                for name, fc in forecast_models(group, cfg).items():
                    own = curves[name]
                    if int(own.steps[-1]) != own.total:
                        raise RuntimeError(f"{name}: no validation loss at its last step {own.total}")
                    measured = float(own.loss[-1])
                    entry = {"run": name, "suite": manifest[name]["suite"], "cut": cut, "kind": fc.kind}
                    entry["points"] = fc.n_points
                    entry |= {"measured": measured, "note": fc.note}
                    if fc.kind == "forecast":
                        entry |= {"predicted": fc.loss, "low": fc.low, "high": fc.high}
                        entry["error"] = fc.loss - measured
                        entry["inside"] = None if fc.low is None else bool(fc.low <= measured <= fc.high)
                    entries.append(entry)
        out[variant] = entries
    return out


def drops(curves: dict[str, LossCurve], manifest: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per run with a branch: how much its cooldowns took off the loss, and Tissue's annealing area S2 at
    each cooldown's end. ``branch_gain``: the parent's loss minus the branch's at the branch's last step
    (the same tokens, constant rate against cooled down); ``run_drop``: the run's loss at the last
    evaluation before its cooldown minus its final loss (the stable phase's progress over the cooldown's
    steps included, so at least the cooldown's own gain)."""
    out = {}
    for name, info in manifest.items():
        if info["parent"] is None:
            continue
        parent, branch = curves[info["parent"]], curves[name]
        at = {int(s): float(v) for s, v in zip(parent.steps, parent.loss, strict=True)}
        if branch.total not in at:
            continue
        start = _cooldown_start(parent.lr)
        before = max(s for s in at if s <= start)
        out[info["parent"]] = {
            "branch_steps": branch.total - _cooldown_start(branch.lr) + 1,
            "branch_gain": at[branch.total] - float(branch.loss[-1]),
            "branch_s2": float(areas(branch.lr)[1][-1]),
            "run_steps": parent.total - start + 1,
            "run_drop": at[before] - at[parent.total],
            "run_s2": float(areas(parent.lr)[1][-1]),
        }
    return out


def _cooldown_start(lr: np.ndarray) -> int:
    """The first step (1-based) of the rate's final descent from its peak."""
    peak = np.flatnonzero(lr >= lr.max())
    return int(peak[-1]) + 2


def why(result: dict[str, Any]) -> list[str]:
    """The reading of the table: the sign of the default's errors, and the cooldowns' measured gains
    against the growth of Tissue's annealing area, which the default extrapolates linearly."""
    test = [e for v in UNTUNED for e in result["forecasts"][v] if "error" in e]
    low = sum(e["error"] < 0 for e in test)
    lines = [
        "## Why",
        "",
        f"The forecasts where nothing was tuned err low in {low} of {len(test)} cases: they expect more"
        " fall than comes. In Tissue et al.'s law the cooldown's gain is C·S2, linear in the annealing"
        " area S2, and S2 grows with the cooldown's length. The only cooldown a forecast has seen is the"
        " branch's, a few hundred steps; the run's own is several times longer, and the measured gains do"
        " not grow as S2 does:",
        "",
        "| run | branch cooldown: steps, S2, gain | run cooldown: steps, S2, drop | S2 ratio | gain ratio |",
        "|---|---|---|---|---|",
    ]
    for name, d in result["drops"].items():
        lines.append(
            f"| {name} | {d['branch_steps']:,}, {d['branch_s2']:.1f}, {d['branch_gain']:.4f} |"
            f" {d['run_steps']:,}, {d['run_s2']:.1f}, {d['run_drop']:.4f} |"
            f" {d['run_s2'] / d['branch_s2']:.1f}x | {d['run_drop'] / d['branch_gain']:.1f}x |"
        )
    lines += [
        "",
        "(gain: the parent's loss minus the branch's at the branch's last step; drop: the run's loss at its"
        " last evaluation before the cooldown minus its final loss, which includes the stable phase's"
        " progress over those steps, so the cooldown's own gain is at most that.) `forecast-long` adds a"
        " second reason: past 3.3M tokens its runs see the corpus again, which a law of fresh tokens does"
        " not describe.",
        "",
        "Luo et al.'s multi-power law has a drop that saturates with the cooldown's length (G); fitted the"
        " same way with the shape of its drop (B, C, β, γ) shared across a suite's runs, it is the last"
        " variant but one of the table. It was added after the default's errors were seen, so it is not a"
        " test where nothing was tuned.",
        "",
        'The last variant is an option of `ForecastConfig` (`law="tissue_lambda", shared=["C", "h"],'
        ' size_trend=["C"]`): Tissue\'s law with its momentum λ fitted'
        " (`tissue_lambda`: the gain saturates after about 1/(1 − λ) steps of cooldown instead of growing"
        " with S2), λ shared by a suite's runs and C a power of each run's non-embedding parameter count."
        " It was chosen on the cooldown suite's forecasts, where each finished run's own fit puts"
        " 1/(1 − λ) at 26–67 steps and C growing with size in every family, not on these runs; so here it"
        " is a test on runs it was not chosen on, made after this table's first variants were seen. With"
        " one size, `forecast-large` has no size trend to fit, and C is one for both runs.",
        "",
    ]
    return lines


def markdown(result: dict[str, Any]) -> str:
    runs = result["runs"]
    own = {k: v for k, v in runs.items() if v["parent"] is None}
    hours = sum(v["seconds"] for v in runs.values()) / 3600
    lines = [
        "# Forecasts where nothing was tuned: longer runs and a larger size than the cooldown suite's",
        "",
        "Written by `python -m experiments.forecast_untuned report` from the committed curve tables"
        " ([`curves/`](curves/), one per run and branch: `step`, `tokens`, `lr`, training `loss`,"
        " `val_loss`; [`runs.json`](runs.json) says which is which); every command that made them:"
        " [`commands.sh`](../../../experiments/forecast_untuned/commands.sh).",
        "",
        "Two suites on the cooldown suite's WSD recipe (128 warm-up steps, a 1-sqrt cooldown over the last"
        " 20 % to 0, batch 1,024 tokens, the validation loss on 32,768 tokens), each run with one cooldown"
        " branch ending at 1/8 of its budget:",
        "",
        "- [`forecast-long`](../../../configs/suites/forecast-long.yaml): "
        + ", ".join(k for k, v in own.items() if v["suite"] == "forecast-long")
        + " at the cooldown suite's rate 4e-3 for 8,192 steps, 4x its budget and 2.5 passes over the"
        " embedded corpus's 3.3M training tokens (the law assumes tokens not seen before), evaluated every"
        " 128 steps;",
        "- [`forecast-large`](../../../configs/suites/forecast-large.yaml): "
        + ", ".join(k for k, v in own.items() if v["suite"] == "forecast-large")
        + ", 2.1x the non-embedding parameters of the cooldown suite's largest size, at the CPU ladder's"
        " best rate for it (2e-3) and the cooldown suite's 2,048 steps (under one pass), evaluated every"
        " 64 steps.",
        "",
        f"{len(runs)} runs and branches, {hours:.2f} h of training on one CPU thread each (a 2-core machine"
        " shared with other jobs).",
        "",
        "Each forecast is what `trilm suite status` showed at that point of the run when these runs were"
        " trained, with `trilm.scaling.forecast.ForecastConfig`'s defaults of then (Tissue et al.'s law,"
        f" validation losses from step {result['config']['min_step']} on,"
        f" {result['config']['bootstrap']} bootstrap refits, 95 % intervals): *suite (C shared)* fits a"
        " suite's runs at once with the annealing parameter shared; *alone* fits each run with its own"
        " branch. The law, the fitter and these settings were chosen on the cooldown suite's runs"
        " ([`../cooldown/forecasts.md`](../cooldown/forecasts.md)) before these runs were trained, and"
        " were not changed after. The last variant, *λ fitted*, is an option chosen later (see Why).",
        "",
        "| variant | suite | seen | forecast / runs | median \\|error\\| | largest | mean error"
        " | within target | measured inside interval |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for variant, by_key in result["summary"].items():
        for key, s in by_key.items():
            suite, cut = key.split(", ")
            lines.append(f"| {variant} | {suite} | {cut} | " + summary_cells(s))
    lines += ["", "![every run's validation curve and its forecasts](forecasts.png)", ""]
    lines += why(result)
    lines += ["## Every forecast", ""]
    lines += ["| variant | run | seen | points | forecast [95 %] | measured | error | note |"]
    lines.append("|---|---|---|---|---|---|---|---|")
    for variant, entries in result["forecasts"].items():
        for e in entries:
            lines.append(f"| {variant} | {e['run']} | {e['cut']:.0%} | {e['points']} | " + forecast_cells(e))
    return "\n".join(lines) + "\n"


def plot(curves: dict[str, LossCurve], result: dict[str, Any], path: Path) -> None:
    # deferred for start-up time: matplotlib is only needed for the figure
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    own = [k for k, v in result["runs"].items() if v["parent"] is None]
    cols = min(3, len(own))
    rows = -(-len(own) // cols)
    fig, grid = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.6 * rows), squeeze=False)
    axes = grid.ravel()
    markers = dict(zip(VARIANTS, "os^D", strict=True))
    colors = {0.25: "tab:orange", 0.5: "tab:green"}
    for ax, name in zip(axes, own, strict=False):
        c = curves[name]
        ax.plot(c.steps, c.loss, color="black", lw=1, label="validation loss")
        for b, info in result["runs"].items():
            if info["parent"] == name:
                ax.plot(curves[b].steps, curves[b].loss, color="grey", lw=1, ls="--", label="1/8 branch")
        for i, (variant, entries) in enumerate(result["forecasts"].items()):
            for e in entries:
                if e["run"] != name or "error" not in e:
                    continue
                x = c.total * (1.0 + 0.02 * (1 + i + 2 * list(CUTS).index(e["cut"])))
                low = e["predicted"] - (e["low"] if e["low"] is not None else e["predicted"])
                high = (e["high"] if e["high"] is not None else e["predicted"]) - e["predicted"]
                ax.errorbar(
                    x,
                    e["predicted"],
                    yerr=[[low], [high]],
                    fmt=markers[variant],
                    color=colors[e["cut"]],
                    ms=4,
                    capsize=2,
                    label=f"{variant}, from {e['cut']:.0%}",
                )
        for cut, color in colors.items():
            ax.axvline(cut * c.total, color=color, lw=0.8, ls=":")
        made = [
            e["predicted"]
            for v in result["forecasts"].values()
            for e in v
            if e["run"] == name and "error" in e
        ]
        ax.set_ylim(min([float(c.loss[-1]), *made]) - 0.1, float(c.loss[-1]) + 0.6)
        ax.set_title(name)
        ax.set_xlabel("step")
    for ax in grid[:, 0]:
        ax.set_ylabel("validation loss (nats)")
    for ax in axes[len(own) :]:
        ax.set_visible(False)
    axes[0].legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(out: Path) -> None:
    manifest = json.loads((out / "runs.json").read_text())
    curves = {
        name: read_curve(out / "curves" / f"{name}.csv", loss_column="val_loss", name=name)
        for name in manifest
    }
    found = forecasts(curves, manifest)
    summaries = {
        variant: {
            f"{suite}, {cut:.0%}": summary(
                [e for e in entries if e["cut"] == cut and e["suite"] == suite], target
            )
            for suite in SUITES
            for cut, target in CUTS.items()
        }
        for variant, entries in found.items()
    }
    cfg = ForecastConfig(law="tissue", shared=["C"], size_trend=[])
    result = {
        "config": {"law": cfg.law, "min_step": cfg.min_step, "bootstrap": cfg.bootstrap, "level": cfg.level},
        "targets": {f"{k:.0%}": v for k, v in CUTS.items()} | {"inside_interval_share": INSIDE_TARGET},
        "runs": manifest,
        "summary": summaries,
        "forecasts": found,
        "drops": drops(curves, manifest),
    }
    for variant, by_cut in summaries.items():
        for cut, s in by_cut.items():
            print(variant, cut, s)
    write_result(out / "forecasts.json", result, module="experiments.forecast_untuned", argv=["report"])
    (out / "README.md").write_text(markdown(result))
    plot(curves, result, out / "forecasts.png")
    print(f"wrote {out / 'forecasts.json'}, {out / 'README.md'}, {out / 'forecasts.png'}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.forecast_untuned", description=__doc__.splitlines()[0]
    )
    parser.add_argument("what", choices=["collect", "report"])
    parser.add_argument("--out", default=str(OUT), help="where the tables and the report go")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if args.what == "collect":
        collect(out)
    else:
        report(out)


if __name__ == "__main__":
    main()
