"""The crossover's analysis: the conversion − scratch gap against tokens per parameter D/N, its fit
gap = a + b·ln(D/N), where that crosses 0, and what it says at Spectra's D/N.

Seeds pair the arms at a point (size, D/N): a seed fixes the data order and the initialisation of the
TriLM from scratch and of the FloatLM a conversion starts from, so the gap is taken per seed and its
interval is Student's t over seeds. The fit's intervals come from a bootstrap that resamples the seeds of
every point (stratified, so each point keeps its weight): the crossing D/N* = exp(−a/b) exists only where
the resampled slope is negative, and the share of resamples without a crossing is reported beside it.
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

from experiments.ternarize.crossover import (
    DEFAULT_SIZES,
    DN,
    FRACTIONS,
    OPTIMIZERS,
    RATE_POINT,
    RATES,
    RECIPE_POINT,
    RECIPE_SEEDS,
    RECIPES,
    SEEDS,
    SIZES,
    Run,
    best_rate,
    branch_losses,
    budget,
    chosen_optimizer,
    chosen_recipe,
    nonembedding,
)
from experiments.ternarize.stats import mean_interval

VARIANTS = [(arm, f) for arm in ("trilm-conv", "trilm-cool", "trilm-branch") for f in FRACTIONS]
"""The conversions: plain, from the cooldown start's snapshot, or as a branch of the float run's state
there, at each converted share f."""
ARMS = {"trilm-conv": "plain", "trilm-cool": "cooldown start", "trilm-branch": "cooldown branch"}
TRAINED_FROM = 50
"""The fit's second range starts here. Below it the runs are short: at 16x2 every run is still close to
its start (the TriLM from scratch 1.5–2 nats above its loss at D/N = 150), and at 32x2 the FloatLM sources,
cosine runs of a few hundred steps, end well above the TriLM from scratch, so a gap there says little about
converting a trained float model."""
SPECTRA = ("99m", "1.1b", "3.9b")
SPECTRA_TOKENS = 300e9
BOOTSTRAP = 2000


def variant_label(arm: str, fraction: float) -> str:
    return f"{ARMS[arm]}, f = {fraction:g}"


def spectra_dn() -> dict[str, float]:
    """D/N of Spectra's TriLMs: 300B tokens over each size's non-embedding parameters."""
    from trilm.model.config import preset
    from trilm.model.flops import parameter_counts

    return {n: SPECTRA_TOKENS / parameter_counts(preset(f"trilm-{n}")).nonembedding for n in SPECTRA}


def _loss(rows: dict[str, dict[str, Any]], run: Run) -> float | None:
    row = rows.get(run.name)
    return float(row["val_loss"]) if row else None


def rate_table(rows: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for size in SIZES:
        for family in ("trilm", "floatlm"):
            losses = {lr: _loss(rows, Run(size, RATE_POINT, min(SEEDS), family, lr)) for lr in RATES[size]}
            if all(v is None for v in losses.values()):
                continue
            out.append(
                {"size": size, "family": family, "losses": losses, "best": best_rate(rows, family, size)}
            )
    return out


def recipe_table(rows: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Per recipe at the sweep point: the conversions' losses and their gaps to the TriLM from scratch."""
    size, dn = RECIPE_POINT
    flt, tri = best_rate(rows, "floatlm", size), best_rate(rows, "trilm", size)
    if flt is None or tri is None:
        return []
    out = []
    for recipe in RECIPES:
        entry: dict[str, Any] = {"recipe": recipe, **RECIPES[recipe], "by_f": {}}
        gaps_all = []
        for f in FRACTIONS:
            gaps = []
            for seed in RECIPE_SEEDS:
                conv = _loss(rows, Run(size, dn, seed, "trilm-conv", flt, f, recipe))
                scratch = _loss(rows, Run(size, dn, seed, "trilm", tri))
                if conv is not None and scratch is not None:
                    gaps.append(conv - scratch)
            if gaps:
                entry["by_f"][f] = (*mean_interval(gaps), len(gaps))
                gaps_all += gaps
        if gaps_all:
            entry["mean_gap"] = sum(gaps_all) / len(gaps_all)
            entry["n"] = len(gaps_all)
            out.append(entry)
    return out


def optimizer_table(rows: dict[str, dict[str, Any]], recipe: str | None) -> dict[str, Any] | None:
    """The branches' moments at the sweep point: each choice's mean loss, and reset − keep per seed and f."""
    size, dn = RECIPE_POINT
    flt = best_rate(rows, "floatlm", size)
    if flt is None or recipe is None:
        return None
    losses = branch_losses(rows, flt, recipe)
    diffs = []
    for f in FRACTIONS:
        for seed in RECIPE_SEEDS:
            pair = [_loss(rows, Run(size, dn, seed, "trilm-branch", flt, f, recipe, o)) for o in OPTIMIZERS]
            if None not in pair:
                diffs.append(pair[1] - pair[0])  # type: ignore[operator]
    if not diffs:
        return None
    return {"losses": losses, "reset_minus_keep": diffs}


def points(
    rows: dict[str, dict[str, Any]], recipe: str | None, optimizer: str | None
) -> list[dict[str, Any]]:
    """Every grid point (size, D/N) with its per-seed losses and per-variant gaps."""
    out = []
    for size in SIZES:
        tri, flt = best_rate(rows, "trilm", size), best_rate(rows, "floatlm", size)
        if tri is None:
            continue
        n = nonembedding(size)
        for dn in DN:
            d = budget(size, dn)
            scratch = {s: _loss(rows, Run(size, dn, s, "trilm", tri)) for s in SEEDS}
            entry: dict[str, Any] = {
                "size": size,
                "n": n,
                "dn": dn,
                "d": d,
                "dn_actual": d / n,
                "scratch": {s: v for s, v in scratch.items() if v is not None},
                "gaps": {},
                "sources": {},
            }
            if flt is not None:
                for f in FRACTIONS:
                    pre = {s: _loss(rows, Run(size, dn, s, "floatlm-pre", flt, f)) for s in SEEDS}
                    entry["sources"][f"floatlm-pre{f:g}"] = {s: v for s, v in pre.items() if v is not None}
                stable = {s: _loss(rows, Run(size, dn, s, "floatlm-stable", flt)) for s in SEEDS}
                entry["sources"]["floatlm-stable"] = {s: v for s, v in stable.items() if v is not None}
            for arm, f in VARIANTS:
                gaps = {}
                opt = optimizer if arm == "trilm-branch" else ""
                if flt is not None and recipe is not None and (opt is not None):
                    for s, base in entry["scratch"].items():
                        conv = _loss(rows, Run(size, dn, s, arm, flt, f, recipe, opt))
                        if conv is not None:
                            gaps[s] = conv - base
                entry["gaps"][(arm, f)] = gaps
            out.append(entry)
    return out


def _ols(xs: list[float], ys: list[float]) -> tuple[float, float] | None:
    n = len(xs)
    if n < 2:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return None
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return my - b * mx, b


def _quantiles(values: list[float], lo: float = 0.025, hi: float = 0.975) -> tuple[float, float]:
    s = sorted(values)
    return s[int(lo * (len(s) - 1))], s[math.ceil(hi * (len(s) - 1))]


def _crossing(a: float, b: float) -> float:
    """exp(−a/b), the D/N where a + b·ln(D/N) = 0 (b < 0); inf past a float's range (a flat slope)."""
    return math.exp(-a / b) if -a / b < 700 else math.inf


def fit(
    pts: list[dict[str, Any]], variant: tuple[str, float], sizes: list[str] | None = None, dn_from: float = 0
) -> dict | None:
    """gap = a + b·ln(D/N) over every seed's gap at every point of ``sizes`` (all when None) from D/N =
    ``dn_from`` on, with bootstrap intervals for a, b, the crossing D/N* and the gap at Spectra's D/N."""
    groups = [
        [(math.log(p["dn_actual"]), g) for g in p["gaps"][variant].values()]
        for p in pts
        if p["gaps"][variant] and (sizes is None or p["size"] in sizes) and p["dn"] >= dn_from
    ]
    groups = [g for g in groups if g]
    if len({g[0][0] for g in groups}) < 2:
        return None
    obs = [o for g in groups for o in g]
    base = _ols([x for x, _ in obs], [y for _, y in obs])
    if base is None:
        return None
    a, b = base
    spectra = spectra_dn()
    rng = random.Random(0)
    boot_a, boot_b, crossings, never = [], [], [], 0
    at_spectra: dict[str, list[float]] = {k: [] for k in spectra}
    for _ in range(BOOTSTRAP):
        sample = [rng.choice(g) for g in groups for _ in g]
        got = _ols([x for x, _ in sample], [y for _, y in sample])
        if got is None:
            continue
        ra, rb = got
        boot_a.append(ra)
        boot_b.append(rb)
        if rb < 0:
            crossings.append(_crossing(ra, rb))
        else:
            never += 1
        for k, dn in spectra.items():
            at_spectra[k].append(ra + rb * math.log(dn))
    out: dict[str, Any] = {
        "a": a,
        "b": b,
        "a_ci": _quantiles(boot_a),
        "b_ci": _quantiles(boot_b),
        "points": len(groups),
        "observations": len(obs),
        "dn_range": (math.exp(min(x for x, _ in obs)), math.exp(max(x for x, _ in obs))),
        "crossing": _crossing(a, b) if b < 0 else None,
        "no_crossing_share": never / max(len(boot_b), 1),
        "spectra": {
            k: {"dn": spectra[k], "gap": a + b * math.log(spectra[k]), "ci": _quantiles(at_spectra[k])}
            for k in spectra
        },
    }
    if crossings and len(crossings) >= 0.5 * len(boot_b):
        # the interval of D/N* over the resamples that cross; those that do not are counted above
        out["crossing_ci"] = _quantiles(crossings)
    return out


def summarise(rows_list: list[dict[str, Any]], pinned: str | None = None) -> dict[str, Any]:
    rows = {r["run"]: r for r in rows_list}
    recipe = chosen_recipe(rows, pinned)
    optimizer = chosen_optimizer(rows, recipe)
    pts = points(rows, recipe, optimizer)
    fits = {}
    for variant in VARIANTS:
        rows_of = {"all": fit(pts, variant), f"≥ {TRAINED_FROM:g}": fit(pts, variant, dn_from=TRAINED_FROM)}
        sizes = sorted({p["size"] for p in pts if p["gaps"][variant]}, key=list(SIZES).index)
        if len(sizes) > 1:
            for size in sizes:
                rows_of[f"≥ {TRAINED_FROM:g}, {size}"] = fit(pts, variant, [size], TRAINED_FROM)
        fits[variant] = {k: v for k, v in rows_of.items() if v}
    missing = []
    for size in DEFAULT_SIZES:
        for dn in DN:
            p = next((p for p in pts if p["size"] == size and p["dn"] == dn), None)
            done = {s for s in SEEDS if p and all(s in p["gaps"][v] for v in VARIANTS)}
            if done != set(SEEDS):
                missing.append((size, dn, sorted(set(SEEDS) - done)))
    return {
        "recipe": recipe,
        "optimizer": optimizer,
        "optimizers": optimizer_table(rows, recipe),
        "rates": rate_table(rows),
        "recipes": recipe_table(rows),
        "points": pts,
        "fits": fits,
        "missing": missing,
        "seconds": sum(float(r["seconds"]) for r in rows_list),
        "runs": len(rows_list),
    }


def _pm(values: list[float], signed: bool = True) -> str:
    if not values:
        return "—"
    mean, half = mean_interval(values)
    text = f"{mean:+.3f}" if signed else f"{mean:.3f}"
    if half is not None:
        text += f" ± {half:.3f}"
    return f"{text} ({len(values)})"


def _verdict(values: list[float]) -> str:
    if len(values) < 2:
        return ""
    mean, half = mean_interval(values)
    assert half is not None
    if mean + half < 0:
        return " **below**"
    if mean - half > 0:
        return " above"
    return " ≈ 0"


def _dn(value: float) -> str:
    return f"{value:,.0f}" if value < 1e6 else "> 10⁶"


def _ci(pair: tuple[float, float], fmt: str = "{:+.3f}") -> str:
    return f"[{fmt.format(pair[0])}, {fmt.format(pair[1])}]"


def markdown(s: dict[str, Any], train_tokens: int | None = None) -> list[str]:
    """The crossover's section of the README."""
    lines = [
        "## The crossover: the gap against tokens per parameter",
        "",
        "Written from [`crossover.csv`](crossover.csv), which `python -m experiments.ternarize crossover` "
        f"fills as each run ends ({s['runs']} runs so far, {s['seconds'] / 3600:.2f} h of run time, one CPU "
        "thread, a shared 2-core machine). The gap is the converted TriLM's validation loss minus the "
        "TriLM's from scratch on the same total tokens D, per seed; negative means converting paid. Each "
        "conversion trains a FloatLM on (1 − f)·D tokens and continues it as a TriLM on f·D: **plain** from "
        "a FloatLM that finished its own cosine schedule on (1 − f)·D, **cooldown start** from a FloatLM at "
        "the end of the stable phase of a warmup-stable run (the constant peak rate, no cooldown), the "
        "ternary phase taking the place of the float cooldown. The conversion's latent weights start as the "
        "float ones, with a fresh optimizer, on its own data order. Every run from scratch is at its "
        "family's best rate for the size.",
        "",
        "### Rates (D/N = 50, seed 1, the ladder's recipe: 15 % warm-up, batch 1,024)",
        "",
        "| size | family | final loss by peak rate | best |",
        "|---|---|---|---|",
    ]
    for r in s["rates"]:
        losses = ", ".join(
            f"{lr:g}: {v:.4f}" if v is not None else f"{lr:g}: —" for lr, v in r["losses"].items()
        )
        best = r["best"]
        edge = ""
        if best is not None and best in (min(r["losses"]), max(r["losses"])):
            edge = " (edge)"
        lines.append(
            f"| {r['size']} | {r['family']} | {losses} | {best:g}{edge} |"
            if best
            else f"| {r['size']} | {r['family']} | {losses} | (sweep incomplete) |"
        )
    size, dn = RECIPE_POINT
    lines += [
        "",
        f"### The conversion recipe (plain conversions at {size}, D/N = {dn}, seeds "
        f"{', '.join(map(str, RECIPE_SEEDS))})",
        "",
        "`spectra`: the TriLM recipe's schedule (5 % warm-up, rate halved at ½, weight decay 0.1 off at ⅔) "
        "at the source's rate, the split experiment's recipe. `rX`: no warm-up, cosine to 0, no weight decay "
        "(ParetoQ's) at X times the source's peak rate; `-kdT`: plus logit distillation from the source at "
        "temperature T, weight ½; `-rampS`: a λ ramp W + λ·(W̃ − W) over the first S of the steps (`s`: "
        "sigmoid, else linear), tried on the best of the first ten. Gap to the TriLM from scratch, mean "
        "± 95 % t half-width (seeds):",
        "",
        "| recipe | " + " | ".join(f"gap, f = {f:g}" for f in FRACTIONS) + " | mean gap |",
        "|---|" + "---|" * len(FRACTIONS) + "---|",
    ]
    for r in sorted(s["recipes"], key=lambda r: r["mean_gap"]):
        cells = []
        for f in FRACTIONS:
            if f in r["by_f"]:
                mean, half, n = r["by_f"][f]
                cells.append(f"{mean:+.3f}" + (f" ± {half:.3f}" if half is not None else "") + f" ({n})")
            else:
                cells.append("—")
        mark = " **chosen**" if r["recipe"] == s["recipe"] else ""
        lines.append(f"| `{r['recipe']}`{mark} | " + " | ".join(cells) + f" | {r['mean_gap']:+.3f} |")
    if s["recipe"] is None:
        lines += ["", "The recipe sweep is not complete: no grid conversion is run or shown yet."]
    else:
        lines += ["", f"Every conversion below uses `{s['recipe']}`."]
    opt = s["optimizers"]
    if opt:
        means = {o: (sum(v) / len(v) if v else None) for o, v in opt["losses"].items()}
        text = ", ".join(f"{o} {m:.4f}" for o, m in means.items() if m is not None)
        lines += [
            "",
            f"Conversion branches at the same point keep or reset the float run's AdamW moments: mean loss "
            f"{text}; reset − keep {_pm(opt['reset_minus_keep'])}{_verdict(opt['reset_minus_keep'])}. "
            + (
                f"The grid's branches {s['optimizer']} them."
                if s["optimizer"]
                else "Not every branch of that comparison has finished: the grid has no branch yet."
            ),
        ]
    if train_tokens:
        largest = max((p for p in s["points"]), key=lambda p: p["d"], default=None)
        lines += [
            "",
            f"The training split holds {train_tokens:,} tokens, so budgets above it repeat data"
            + (
                f" (the largest, {largest['d']:,} tokens at {largest['size']}, is "
                f"{largest['d'] / train_tokens:.1f} epochs)."
                if largest and largest["d"] > train_tokens
                else "."
            ),
        ]
    lines += [
        "",
        "### The gap at each point",
        "",
        "Mean ± 95 % t half-width over seeds (number of seeds); **below**: the interval is under 0.",
        "",
        "| size (N) | D/N | D | TriLM from scratch | "
        + " | ".join(variant_label(*v) for v in VARIANTS)
        + " |",
        "|---|---|---|---|" + "---|" * len(VARIANTS),
    ]
    for p in s["points"]:
        if not p["scratch"] and not any(p["gaps"].values()):
            continue
        cells = []
        for v in VARIANTS:
            vals = list(p["gaps"][v].values())
            cells.append(_pm(vals) + _verdict(vals))
        lines.append(
            f"| {p['size']} ({p['n']:,}) | {p['dn_actual']:.1f} | {p['d']:,} | "
            f"{_pm(list(p['scratch'].values()), signed=False)} | " + " | ".join(cells) + " |"
        )
    lines += [
        "",
        "### The fit: gap = a + b·ln(D/N)",
        "",
        "Least squares over every seed's gap at every point, over all D/N and from D/N = "
        f"{TRAINED_FROM:g} on (below it the runs are short and the float sources weak: the losses above), "
        "both sizes pooled and, where there are two, each alone; "
        f"95 % intervals from {BOOTSTRAP:,} bootstrap resamples of the seeds within each point. D/N* is "
        "where the fitted gap crosses 0 (exp(−a/b), only for b < 0). The last columns apply the fit at the "
        "D/N of Spectra's TriLMs (300B tokens over their non-embedding parameters): inside or near the D/N "
        "measured, but at sizes thousands of times those measured, and the fit has no term for the size, so "
        "they say what the trend in D/N alone implies.",
        "",
    ]
    spectra = spectra_dn()
    header = (
        "| conversion | D/N (size) | points | a | b (per e-fold of D/N) | D/N* | resamples not crossing | "
    )
    header += " | ".join(f"gap at Spectra {k.upper()} (D/N {v:,.0f})" for k, v in spectra.items()) + " |"
    lines += [header, "|---|---|---|---|---|---|---|" + "---|" * len(spectra)]
    any_fit = False
    for v in VARIANTS:
        for sizes, f in s["fits"][v].items():
            if not f:
                continue
            any_fit = True
            if f["crossing"] is not None:
                cross = _dn(f["crossing"])
                if "crossing_ci" in f:
                    cross += f" [{_dn(f['crossing_ci'][0])}, {_dn(f['crossing_ci'][1])}]"
            else:
                cross = "none (b ≥ 0)"
            sp = " | ".join(f"{e['gap']:+.3f} {_ci(e['ci'])}" for e in f["spectra"].values())
            lines.append(
                f"| {variant_label(*v)} | {sizes} | {f['points']} | {f['a']:+.3f} {_ci(f['a_ci'])} | "
                f"{f['b']:+.4f} {_ci(f['b_ci'], '{:+.4f}')} | {cross} | {f['no_crossing_share']:.0%} | {sp} |"
            )
    if not any_fit:
        lines.append("| (no variant has gaps at two D/N yet) | | | | | | |" + " |" * len(spectra))
    lines += ["", "![the gap against D/N](crossover.png)", "", "### Still missing", ""]
    if s["missing"]:
        for size, dn, seeds in s["missing"]:
            lines.append(f"- {size}, D/N = {dn:g}: seeds {', '.join(map(str, seeds))}")
    else:
        lines.append("Nothing: every point has all its seeds.")
    lines.append("")
    return lines


def plot(s: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(ARMS), figsize=(5.5 * len(ARMS), 4.2), sharey=True)
    markers = {"16x2": "o", "32x2": "s", "64x2": "^"}
    for ax, arm in zip(axes, ARMS, strict=True):
        for i, f in enumerate(FRACTIONS):
            color = f"C{i}"
            for size in SIZES:
                pts = [p for p in s["points"] if p["size"] == size and p["gaps"][(arm, f)]]
                if not pts:
                    continue
                xs, ys, es = [], [], []
                for p in pts:
                    mean, half = mean_interval(list(p["gaps"][(arm, f)].values()))
                    xs.append(p["dn_actual"])
                    ys.append(mean)
                    es.append(half or 0)
                ax.errorbar(
                    xs,
                    ys,
                    yerr=es,
                    fmt=markers.get(size, "o"),
                    color=color,
                    capsize=3,
                    label=f"f = {f:g}, {size}",
                )
            fitted = s["fits"][(arm, f)].get(f"≥ {TRAINED_FROM:g}") or s["fits"][(arm, f)].get("all")
            if fitted:
                lo, hi = fitted["dn_range"]
                grid = [lo * (hi / lo) ** (k / 50) for k in range(51)]
                ax.plot(
                    grid, [fitted["a"] + fitted["b"] * math.log(x) for x in grid], "-", color=color, alpha=0.6
                )
        ax.axhline(0, color="k", linewidth=0.8)
        spectra = spectra_dn()
        ax.axvspan(
            min(spectra.values()),
            max(spectra.values()),
            color="0.9",
            zorder=0,
            label="Spectra's D/N (3.9B to 99M)",
        )
        ax.set_xscale("log")
        ax.set_xlabel("D/N: tokens per non-embedding parameter")
        ax.set_title(
            {
                "trilm-conv": "plain conversion",
                "trilm-cool": "from the cooldown start's snapshot",
                "trilm-branch": "branch at the cooldown start",
            }[arm]
        )
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    axes[0].set_ylabel("converted − from scratch (nats)")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def to_json(s: dict[str, Any]) -> dict[str, Any]:
    """The summary with its tuple keys as strings (for summary JSON)."""
    pts = [
        {**p, "gaps": {f"{a}{f:g}": {str(k): v for k, v in g.items()} for (a, f), g in p["gaps"].items()}}
        for p in s["points"]
    ]
    fits = {f"{a}{f:g}": v for (a, f), v in s["fits"].items()}
    rates = [{**r, "losses": {f"{k:g}": v for k, v in r["losses"].items()}} for r in s["rates"]]
    recipes = [{**r, "by_f": {f"{k:g}": v for k, v in r["by_f"].items()}} for r in s["recipes"]]
    return {**s, "points": pts, "fits": fits, "rates": rates, "recipes": recipes}
