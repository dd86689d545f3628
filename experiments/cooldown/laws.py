"""Which L(N, D) law predicts the cooldown experiment's held-out runs: every law of ``trilm.scaling.laws`` on
the cooldown report's own split, and the law each family would choose by held-out error.

Launch (reads only committed tables, trains nothing)::

    python -m experiments.cooldown.laws            # docs/results/cooldown/laws.json and laws.md

The split is the cooldown report's (:mod:`experiments.cooldown.heldout`): per family, the fit uses the final
checkpoints of the cooldown branches that end at ≤ ½ of the budget; held out are the ¾ branches, the WSD
runs' own ends and the CPU ladder's separately trained runs of the same budget and peak rate. Each law is
fitted with the same objective and the same 1,000-resample bootstrap by lineage, and judged by the same
plausibility rules.

The choice per family must not look at those held-out runs, so it is made on the fit's own points: each law
is fitted on the branches ≤ ⅜ of the budget and scored on the ½ branches (:func:`trilm.scaling.select.
select_law`); the chosen law is then judged on the held-out runs against the targets (median error ≤ 0.03
nats, ≥ 90 % inside the 95 % interval).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import write_result
from experiments.cooldown.heldout import FIT_UP_TO, NAMES, ORDER, SEED, TARGET, finals, ladder_finals
from experiments.cooldown.run import LADDER_TABLE, OUT

INSIDE_TARGET = 0.9
"""At least this share of held-out losses inside their bootstrap intervals."""
KINDS = ("branch at ¾", "run end", "separate run (ladder)")
FRESH_KIND = "fresh run at ½ (own schedule)"
"""The cooldown-fresh suite's runs (``fresh-results.csv``): at a D inside the fit's range but trained
separately on the family's own schedule. Scored apart: the cooldown report does not hold them out."""


def _split(rows: list, ladder_rows: list, fresh_rows: list) -> tuple[float, dict[str, tuple[list, list]]]:
    """Per family: the fit's points and the held-out rows (with their kind), exactly as the cooldown report,
    then the fresh runs."""
    from trilm.scaling.analyse import branch_parent

    last = finals(rows)
    budget = max(r.tokens for r in last.values() if not branch_parent(r))
    ladder = ladder_finals(ladder_rows, budget)
    out = {}
    for family in ORDER:
        fam = [r for r in last.values() if r.family == family]
        points = [r for r in fam if branch_parent(r) and r.tokens <= FIT_UP_TO * budget + 1]
        held = [
            (r, KINDS[0] if branch_parent(r) else KINDS[1])
            for r in sorted(fam, key=lambda r: (r.nonembedding_params, r.tokens))
            if r not in points
        ]
        held += [(r, KINDS[2]) for r in ladder if r.family == family]
        fresh = sorted(finals(fresh_rows).values(), key=lambda r: r.nonembedding_params)
        held += [(r, FRESH_KIND) for r in fresh if r.family == family]
        out[family] = (points, held)
    return budget, out


def _score(preds: list[dict[str, Any]]) -> dict[str, Any]:
    err = np.array([abs(p["error"]) for p in preds])
    inside = [p["inside_interval"] for p in preds]
    widths = [p["interval"][1] - p["interval"][0] for p in preds if p["interval"]]
    return {
        "n": len(preds),
        "median_interval_width": float(np.median(widths)) if widths else None,
        "median_abs_error": float(np.median(err)) if err.size else None,
        "max_abs_error": float(err.max()) if err.size else None,
        "within_target": int((err <= TARGET).sum()),
        "inside_interval": int(sum(bool(v) for v in inside)),
        "mean_error": float(np.mean([p["error"] for p in preds])) if preds else None,
    }


def _fit_family(law: str, points: list, held: list, bootstrap: int) -> dict[str, Any]:
    from trilm.scaling.analyse import lineage
    from trilm.scaling.errors import FitError
    from trilm.scaling.fitter import fit as fit_law

    data = {
        "N": np.array([r.nonembedding_params for r in points], float),
        "D": np.array([r.tokens for r in points], float),
        "loss": np.array([r.loss for r in points], float),
    }
    try:
        fit = fit_law(law, data, bootstrap=bootstrap, seed=SEED, units=[lineage(r) for r in points])
    except FitError as exc:
        return {"error": str(exc)}
    hn = np.array([r.nonembedding_params for r, _ in held], float)
    hd = np.array([r.tokens for r, _ in held], float)
    prediction = fit.predict(N=hn, D=hd)
    predicted, low, high = prediction.value, prediction.low, prediction.high
    preds = []
    for i, (r, kind) in enumerate(held):
        interval = None if low is None or high is None else [float(low[i]), float(high[i])]
        preds.append(
            {
                "run": r.run,
                "kind": kind,
                "N": r.nonembedding_params,
                "D": int(r.tokens),
                "predicted": float(predicted[i]),
                "interval": interval,
                "measured": r.loss,
                "error": float(predicted[i]) - r.loss,
                "inside_interval": None if interval is None else bool(interval[0] <= r.loss <= interval[1]),
            }
        )
    record = fit.to_dict()
    record.pop("boot_thetas")  # thousands of refits; their intervals are in param_intervals and predictions
    return {
        "points": len(points),
        "fit": record,
        "score": _score([p for p in preds if p["kind"] in KINDS]),
        "by_kind": {k: _score([p for p in preds if p["kind"] == k]) for k in (*KINDS, FRESH_KIND)},
        "predictions": preds,
    }


def compare(rows: list, ladder_rows: list, fresh_rows: list, bootstrap: int) -> dict[str, Any]:
    """Every law on every family's split, the choice by held-out error on the fit's own points, the totals."""
    from trilm.scaling.select import SelectionConfig, nd_laws, select_law

    LAWS = nd_laws()
    budget, split = _split(rows, ladder_rows, fresh_rows)
    families: dict[str, Any] = {}
    for family, (points, held) in split.items():
        data = {
            "N": np.array([r.nonembedding_params for r in points], float),
            "D": np.array([r.tokens for r in points], float),
            "loss": np.array([r.loss for r in points], float),
        }
        selection = select_law(SelectionConfig(laws=list(LAWS)), data)
        laws = {name: _fit_family(name, points, held, bootstrap) for name in LAWS}
        chosen = selection.chosen
        families[family] = {
            "fit_points": len(points),
            "held_out": len(held),
            "selection": selection.to_dict(),
            "laws": laws,
            "chosen": chosen,
            "chosen_score": laws[chosen]["score"] if chosen and "score" in laws[chosen] else None,
        }
    totals = {}
    for name in [*LAWS, "chosen"]:
        preds = [
            p
            for fam in families.values()
            for p in fam["laws"].get(fam["chosen"] if name == "chosen" else name, {}).get("predictions", [])
            if p["kind"] in KINDS
        ]
        totals[name] = _score(preds)
    best = totals["chosen"]
    return {
        "budget": int(budget),
        "fit_up_to": FIT_UP_TO,
        "bootstrap": bootstrap,
        "targets": {"median_abs_error": TARGET, "inside_interval_share": INSIDE_TARGET},
        "families": families,
        "totals": totals,
        "chosen_meets_targets": {
            "median": best["median_abs_error"] <= TARGET,
            "inside": best["inside_interval"] >= INSIDE_TARGET * best["n"],
        },
    }


def _cell(s: dict[str, Any] | None) -> str:
    if not s or not s.get("n"):
        return "–"
    width = "–" if s.get("median_interval_width") is None else f"{s['median_interval_width']:.3g}"
    return (
        f"{s['median_abs_error']:.4f} / {s['max_abs_error']:.3f} / {s['within_target']} of {s['n']} /"
        f" {s['inside_interval']} of {s['n']} / {width}"
    )


def markdown(result: dict[str, Any]) -> str:
    from trilm.scaling.laws import LAWS as REGISTRY
    from trilm.scaling.select import nd_laws

    LAWS = {name: REGISTRY[name] for name in nd_laws()}
    tot = result["totals"]
    lines = [
        "# Which L(N, D) law predicts the cooldown experiment's held-out runs",
        "",
        "Written by [`experiments/cooldown/laws.py`](../../../experiments/cooldown/laws.py)"
        " (`python -m experiments.cooldown.laws`) from the committed tables: [`results.csv`](results.csv),"
        " [`fresh-results.csv`](fresh-results.csv) and the CPU ladder's"
        " [`results.csv`](../ladder/analysis/results.csv). Nothing was trained for it.",
        "",
        f"Same split as the cooldown report ([README.md](README.md)): per family the fit uses the branches"
        f" that end at ≤ {result['fit_up_to']:g} of the {result['budget']:,}-token budget; held out are the ¾"
        " branches, the WSD runs' own ends and the ladder's separately trained runs. Every law: Huber"
        f" (δ = 1e-3) of the log residuals, {result['bootstrap']:,} bootstrap resamples by lineage, 95 %"
        " percentile intervals (`trilm.scaling.fitter.fit`), the plausibility rules of each law"
        " (`trilm.scaling.laws`).",
        "",
        "| law | formula |",
        "|---|---|",
        *[f"| `{name}` | {law.formula} |" for name, law in LAWS.items()],
        "",
        "## All held-out runs",
        "",
        f"Cells: median \\|error\\| / largest \\|error\\| / within {TARGET} nats / inside the 95 % interval /"
        f" median width of the interval (nats). Targets: median ≤ {TARGET}, ≥ {INSIDE_TARGET:.0%} inside."
        f" The {len(KINDS)} kinds of held-out run of the cooldown report; the fresh runs are scored apart"
        " below.",
        "",
        "| law | all families | " + " | ".join(NAMES[f] for f in result["families"]) + " |",
        "|---|---|" + "---|" * len(result["families"]),
    ]
    for name in LAWS:
        cells = [_cell(fam["laws"][name].get("score")) for fam in result["families"].values()]
        lines.append(f"| `{name}` | {_cell(tot[name])} | " + " | ".join(cells) + " |")
    chosen_cells = [f"`{fam['chosen']}`: {_cell(fam['chosen_score'])}" for fam in result["families"].values()]
    lines.append(f"| **chosen per family** | {_cell(tot['chosen'])} | " + " | ".join(chosen_cells) + " |")
    meets = result["chosen_meets_targets"]
    lines += [
        "",
        f"The chosen laws {'meet' if meets['median'] else 'miss'} the median target"
        f" ({tot['chosen']['median_abs_error']:.4f} against {TARGET}) and"
        f" {'meet' if meets['inside'] else 'miss'} the interval target"
        f" ({tot['chosen']['inside_interval']} of {tot['chosen']['n']} inside, against"
        f" {INSIDE_TARGET:.0%}).",
        "",
        "## The choice, made without the held-out runs",
        "",
        "Each law fitted on the branches ≤ ⅜ of the budget, scored on the ½ branches (median \\|error\\|;"
        " a law whose fit is not plausible cannot be chosen while another is):",
        "",
        "| family | " + " | ".join(f"`{n}`" for n in LAWS) + " | chosen |",
        "|---|" + "---|" * (len(LAWS) + 1),
    ]
    for family, fam in result["families"].items():
        val = fam["selection"]["validation"]
        cells = []
        for name in LAWS:
            v = val[name]
            if "error" in v:
                cells.append("not fitted")
                continue
            mark = "" if v["plausible"] else " (not plausible: " + "; ".join(v["not_plausible_because"]) + ")"
            cells.append(f"{v['median_abs_error']:.4f}{mark}")
        note = f" ({fam['selection']['note']})" if fam["selection"]["note"] else ""
        lines.append(f"| {NAMES[family]} | " + " | ".join(cells) + f" | `{fam['chosen']}`{note} |")
    kinds = (*KINDS, FRESH_KIND)
    lines += ["", "## By kind of held-out run", "", "| family | law | " + " | ".join(kinds) + " |"]
    lines.append("|---|---|" + "---|" * len(kinds))
    for family, fam in result["families"].items():
        for name in LAWS:
            by = fam["laws"][name].get("by_kind", {})
            lines.append(
                f"| {NAMES[family]} | `{name}` | " + " | ".join(_cell(by.get(k)) for k in kinds) + " |"
            )
    lines += [
        "",
        "## Fits",
        "",
        "| family | law | parameters (95 % interval) | RMS log residual | plausible |",
    ]
    lines.append("|---|---|---|---|---|")
    for family, fam in result["families"].items():
        for name in LAWS:
            entry = fam["laws"][name]
            if "error" in entry:
                lines.append(f"| {NAMES[family]} | `{name}` | {entry['error']} | – | no |")
                continue
            fit = entry["fit"]
            iv = fit["param_intervals"]
            params = ", ".join(
                f"{k} = {v:.4g}" + (f" [{iv[k][0]:.3g}, {iv[k][1]:.3g}]" if k in iv else "")
                for k, v in fit["params"].items()
            )
            ok = "yes" if fit["identified"] else "no: " + "; ".join(fit["not_identified_because"])
            lines.append(f"| {NAMES[family]} | `{name}` | {params} | {fit['log_residual_rms']:.4f} | {ok} |")
    lines += ["", "## Every held-out run", ""]
    lines += ["| run | held out as | measured | " + " | ".join(f"`{n}` [95 % CI]" for n in LAWS) + " |"]
    lines.append("|---|---|---|" + "---|" * len(LAWS))
    for fam in result["families"].values():
        per_law = {n: fam["laws"][n].get("predictions", []) for n in LAWS}
        first: list[dict[str, Any]] = next(iter(p for p in per_law.values() if p), [])
        for i, p in enumerate(first):
            cells = []
            for name in LAWS:
                q = per_law[name][i] if per_law[name] else None
                if q is None:
                    cells.append("–")
                    continue
                ci = "" if not q["interval"] else f" [{q['interval'][0]:.3f}, {q['interval'][1]:.3f}]"
                cells.append(f"{q['predicted']:.4f}{ci} ({q['error']:+.3f})")
            lines.append(f"| {p['run']} | {p['kind']} | {p['measured']:.4f} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    from trilm.scaling.table import read_table

    parser = argparse.ArgumentParser(
        prog="python -m experiments.cooldown.laws", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--bootstrap", type=int, default=1000)
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args(argv)
    out = Path(args.out)
    rows = read_table(OUT / "results.csv")
    ladder_rows = read_table(LADDER_TABLE) if LADDER_TABLE.is_file() else []
    fresh_table = OUT / "fresh-results.csv"
    fresh_rows = read_table(fresh_table) if fresh_table.is_file() else []
    result = compare(rows, ladder_rows, fresh_rows, args.bootstrap)
    write_result(out / "laws.json", result, module="experiments.cooldown.laws", argv=argv)
    (out / "laws.md").write_text(markdown(result))
    for name, s in result["totals"].items():
        print(f"{name:>9}: {_cell(s)}")
    print(f"wrote {out / 'laws.json'}, {out / 'laws.md'}")


if __name__ == "__main__":
    main()
