"""The report of the ternarization experiment: ``python -m experiments.ternarize.report [--out DIR]``.

README.md in two sections, each written from the rows that exist: which share f to convert at one budget
(``results.csv``, this module), and the crossover of the gap against tokens per parameter
(``crossover.csv``, :mod:`experiments.ternarize.gap`).

Seeds pair the arms: a seed fixes the data order and the initialisation of every run of one size, so the
difference between a conversion and the from-scratch TriLM is taken per seed and its interval is Student's
t over seeds (the spread between seeds is most of the noise; pairing removes what the arms share).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from benchmarks.common import write_result
from experiments.ternarize.run import FRACTIONS, OUT, PEAK_LR, SIZES, read_rows
from experiments.ternarize.stats import mean_interval


def _arm_label(arm: str, fraction: float) -> str:
    if arm == "trilm":
        return "TriLM from scratch"
    if arm == "floatlm":
        return "FloatLM from scratch"
    kd = " + distillation" if arm.endswith("-kd") else ""
    return f"FloatLM {1 - fraction:.0%} → TriLM {fraction:.0%}{kd}"


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per size: every arm's mean loss and interval, and the paired differences that answer the question."""
    out: dict[str, Any] = {}
    for size in [s for s in SIZES if any(r["size"] == s for r in rows)]:
        mine = [r for r in rows if r["size"] == size]
        loss = {(r["arm"], float(r["fraction"]), int(r["seed"])): float(r["val_loss"]) for r in mine}
        seeds = sorted({int(r["seed"]) for r in mine})
        arms = []
        for arm, fraction in [("trilm", 0.0), ("floatlm", 0.0)] + [
            (a, f) for f in FRACTIONS for a in ("trilm-conv", "trilm-conv-kd")
        ]:
            values = [loss[(arm, fraction, s)] for s in seeds if (arm, fraction, s) in loss]
            if not values:
                continue
            mean, half = mean_interval(values)
            entry = {"arm": arm, "fraction": fraction, "label": _arm_label(arm, fraction), "n": len(values)}
            entry.update(mean=mean, half_width=half)
            diffs = [
                loss[(arm, fraction, s)] - loss[("trilm", 0.0, s)]
                for s in seeds
                if (arm, fraction, s) in loss and ("trilm", 0.0, s) in loss
            ]
            if arm != "trilm" and diffs:
                d, dh = mean_interval(diffs)
                entry.update(vs_scratch=d, vs_scratch_half_width=dh, paired=len(diffs))
            if arm == "trilm-conv-kd":
                kd = [
                    loss[(arm, fraction, s)] - loss[("trilm-conv", fraction, s)]
                    for s in seeds
                    if (arm, fraction, s) in loss and ("trilm-conv", fraction, s) in loss
                ]
                if kd:
                    k, kh = mean_interval(kd)
                    entry.update(vs_plain=k, vs_plain_half_width=kh)
            arms.append(entry)
        conversions = [a for a in arms if a["arm"].startswith("trilm-conv")]
        best = min(conversions, key=lambda a: a["mean"]) if conversions else None
        out[size] = {"seeds": seeds, "arms": arms, "best": best}
    return out


def _pm(value: float | None, half: float | None, signed: bool = False) -> str:
    if value is None:
        return "—"
    text = f"{value:+.4f}" if signed else f"{value:.4f}"
    return text + (f" ± {half:.4f}" if half is not None else "")


def _verdict(entry: dict[str, Any], key: str) -> str:
    value, half = entry.get(key), entry.get(f"{key}_half_width")
    if value is None or half is None:
        return ""
    if value + half < 0:
        return "lower"
    if value - half > 0:
        return "higher"
    return "no difference"


TITLE = "# Ternarizing a float model: from scratch or converted late, at equal tokens"
COMMANDS = "[`commands.sh`](../../../experiments/ternarize/commands.sh)"


def markdown(summary: dict[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    """The split experiment's section: which share f to convert, at one budget, two sizes."""
    seconds = sum(float(r["seconds"]) for r in rows)
    tokens = max((int(r["tokens"]) for r in rows if r["arm"] == "trilm"), default=0)
    lines = [
        f"## Which share to convert, at D = {tokens:,} tokens",
        "",
        "Written from [`results.csv`](results.csv), which "
        "`python -m experiments.ternarize` fills as each run ends. One thread per run; "
        f"D = {tokens:,} tokens per arm at batch 1,024 and peak rate {PEAK_LR:g}; {len(rows)} runs, "
        f"{seconds / 3600:.2f} h of run time in all.",
        "",
        "A conversion trains a FloatLM for (1 − f)·D tokens on its cosine schedule, then continues it as a "
        "TriLM for f·D tokens (the latent weights start as the float ones; the TriLM recipe's schedule with "
        "a 5 % warm-up), without or with distillation from that FloatLM (KL at temperature 1, weight ½). "
        'Differences are paired by seed, with 95 % t intervals over seeds; "lower"/"higher" means the '
        "interval excludes 0.",
        "",
    ]
    for size, entry in summary.items():
        lines += [
            f"### {size} ({len(entry['seeds'])} seeds)",
            "",
            "| arm | loss | − TriLM from scratch | | distillation − plain | |",
            "|---|---|---|---|---|---|",
        ]
        for arm in entry["arms"]:
            lines.append(
                f"| {arm['label']} | {_pm(arm['mean'], arm['half_width'])} | "
                f"{_pm(arm.get('vs_scratch'), arm.get('vs_scratch_half_width'), True)} | "
                f"{_verdict(arm, 'vs_scratch')} | "
                f"{_pm(arm.get('vs_plain'), arm.get('vs_plain_half_width'), True)} | "
                f"{_verdict(arm, 'vs_plain')} |"
            )
        best = entry["best"]
        if best is not None:
            lines += ["", f"Best conversion at this size: {best['label']} ({best['mean']:.4f})."]
        lines.append("")
    lines += ["![loss against the converted share f](ternarize.png)", ""]
    return lines


def plot(summary: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(summary), figsize=(5 * len(summary), 4), squeeze=False)
    for ax, (size, entry) in zip(axes[0], summary.items(), strict=True):
        by = {(a["arm"], a["fraction"]): a for a in entry["arms"]}
        for arm, style, label in (
            ("trilm-conv", "o-", "converted"),
            ("trilm-conv-kd", "s--", "converted + KD"),
        ):
            pts = [by[(arm, f)] for f in FRACTIONS if (arm, f) in by]
            if pts:
                ax.errorbar(
                    [p["fraction"] for p in pts],
                    [p["mean"] for p in pts],
                    yerr=[p["half_width"] or 0 for p in pts],
                    fmt=style,
                    capsize=3,
                    label=label,
                )
        for arm, color in (("trilm", "C3"), ("floatlm", "C2")):
            if (arm, 0.0) in by:
                a = by[(arm, 0.0)]
                ax.axhline(a["mean"], color=color, linestyle=":", label=a["label"])
        ax.set_title(size)
        ax.set_xlabel("f: share of the tokens trained as a TriLM")
        ax.set_ylabel("validation loss (nats)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def report(out: Path, recipe: str | None = None) -> None:
    """README.md, the JSON summaries and the plots of both parts, from whichever rows exist."""
    from experiments.ternarize import crossover, gap

    rows = read_rows(out / "results.csv")
    grid = crossover.read_rows(out / "crossover.csv")
    if not rows and not grid:
        raise SystemExit(f"{out}: no results.csv or crossover.csv yet (python -m experiments.ternarize)")
    lines = [
        TITLE,
        "",
        "Written by `python -m experiments.ternarize.report`; every command that made the rows: "
        f"{COMMANDS}. Embedded corpus (2,048-token vocabulary), CPU. Losses are validation cross-entropy "
        "(nats) on the same 32,768 tokens.",
        "",
    ]
    if rows:
        summary = summarise(rows)
        write_result(out / "summary.json", {"sizes": summary}, module="experiments.ternarize.report")
        lines += markdown(summary, rows)
        plot(summary, out / "ternarize.png")
    if grid:
        run_json = out / "crossover-run.json"
        train_tokens = json.loads(run_json.read_text()).get("train_tokens") if run_json.is_file() else None
        found = gap.summarise(grid, recipe)
        write_result(out / "crossover.json", gap.to_json(found), module="experiments.ternarize.report")
        lines += gap.markdown(found, train_tokens)
        gap.plot(found, out / "crossover.png")
    (out / "README.md").write_text("\n".join(lines))
    print((out / "README.md").read_text())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.ternarize.report", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--out", default=str(OUT), help="the folder holding results.csv; the report goes there"
    )
    parser.add_argument("--recipe", help="the crossover's conversion recipe, when the driver pinned one")
    args = parser.parse_args(argv)
    report(Path(args.out), args.recipe)


if __name__ == "__main__":
    main()
