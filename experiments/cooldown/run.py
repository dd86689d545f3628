"""The cooldown experiment: does L(N, D) fitted on cooldown branches predict runs it has not seen?

Launch::

    python -m experiments.cooldown run --jobs 2      # WSD runs, branches, fresh runs (resumable)
    python -m experiments.cooldown report            # docs/results/cooldown/: README, predictions, plots
    python -m experiments.cooldown report --from-tables  # the same from the committed tables, no runs

``run`` trains the ``cooldown`` suite (TriLM, FloatLM and BiLM at four sizes, 26x in non-embedding
parameters, warmup-stable-decay at the ladder's rate), its cooldown branches (``trilm suite cooldown``) and
the ``cooldown-fresh`` suite (fresh runs to half the budget on each family's own decaying schedule).
``report`` then fits L(N, D) = E + A/N^α + B/D^β per family on the branches that end at no more than half
of the budget, and predicts what it never saw: each WSD run's own end at the full budget (and the branches
at ¾), and the CPU ladder's runs of the same budget and rate, trained separately on each family's own
decaying schedule. Held-out means held out of the fit; the runs' ends share their training up to the last
branch point with the fitted branches, which is what the method sells (one run per size gives the whole
grid); the ladder's runs share nothing with them.

It also compares, at equal compute, a cooldown branch with a fresh run of the same length on the family's
own schedule (Hägele et al. 2024 report that they match), the WSD runs' ends with the CPU ladder's fresh
runs of the same budget and rate (``docs/results/ladder/analysis/results.csv``), and measures the decay
stage (MiniCPM's appendix D): how much each family gains in its cooldown, by size.

The fits, predictions and comparisons are :mod:`experiments.cooldown.heldout`, the section on why the
additive law misses :mod:`experiments.cooldown.diagnosis`; this module trains the runs and writes the report.
Every command behind the evidence is ``experiments/cooldown/commands.sh``.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import CHECKOUT, write_result
from experiments.cooldown.diagnosis import (
    alternatives,
    markdown,
    rerun_differences,
    rerun_markdown,
    size_gaps,
)
from experiments.cooldown.heldout import (
    FIT_UP_TO,
    LAW,
    NAMES,
    ORDER,
    TARGET,
    bound,
    decay_stage,
    fit_and_predict,
    fresh_comparison,
    ladder_finals,
    predict_separate,
    rate_drop,
)

OUT = CHECKOUT / "docs" / "results" / "cooldown"
LADDER_TABLE = CHECKOUT / "docs" / "results" / "ladder" / "analysis" / "results.csv"
SUITE, FRESH = "cooldown", "cooldown-fresh"


def _trilm(*args: str) -> None:
    cmd = [sys.executable, "-m", "trilm", *args]
    print("$ trilm " + " ".join(args), flush=True)
    subprocess.run(cmd, cwd=CHECKOUT, check=True)


def run(args: argparse.Namespace) -> None:
    start = time.time()
    jobs = str(args.jobs)
    _trilm("suite", "launch", SUITE, "--local", "--jobs", jobs)
    _trilm("suite", "cooldown", SUITE, "--jobs", jobs)
    _trilm("suite", "launch", FRESH, "--local", "--jobs", jobs)
    print(f"cooldown experiment trained in {time.time() - start:,.0f} s (runs already finished are skipped)")


def _plot(fitted: dict, predictions: list[dict[str, Any]], out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    files = []
    fig, axes = plt.subplots(1, len(fitted), figsize=(5 * len(fitted), 4.2), squeeze=False)
    for ax, (family, (law, points, held)) in zip(axes[0], fitted.items(), strict=True):
        sizes = sorted({r.nonembedding_params for r in points + held})
        colors = plt.cm.viridis(np.linspace(0, 0.9, len(sizes)))
        d_all = [r.tokens for r in points + held]
        grid = np.geomspace(min(d_all), max(d_all), 60)
        for n, c in zip(sizes, colors, strict=True):
            ax.plot(grid, law.predict(N=n, D=grid).value, color=c, lw=1.2, label=f"N = {n:,}")
            fx = [r for r in points if r.nonembedding_params == n]
            hx = [r for r in held if r.nonembedding_params == n]
            ax.scatter([r.tokens for r in fx], [r.loss for r in fx], color=c, s=18)
            ax.scatter([r.tokens for r in hx], [r.loss for r in hx], color=c, s=46, marker="*")
        losses = [r.loss for r in points + held]
        pad = 0.05 * (max(losses) - min(losses))
        ax.set_ylim(min(losses) - pad, max(losses) + pad)
        ax.set_xscale("log")
        ax.set_title(f"{NAMES[family]}: fit on branches ≤ ½ budget (dots), held out (stars)", fontsize=9)
        ax.set_xlabel("training tokens D")
        ax.set_ylabel("validation loss (nats/token)")
        ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(out / "nd_fits.png", dpi=120)
    plt.close(fig)
    files.append("nd_fits.png")

    fig, ax = plt.subplots(figsize=(5, 5))
    for family in ORDER:
        mine = [p for p in predictions if p["family"] == family]
        if not mine:
            continue
        x = np.array([p["measured"] for p in mine])
        y = np.array([p["predicted"] for p in mine])
        lo = np.array([p["interval"][0] if p["interval"] else v for p, v in zip(mine, y, strict=True)])
        hi = np.array([p["interval"][1] if p["interval"] else v for p, v in zip(mine, y, strict=True)])
        ax.errorbar(x, y, yerr=[y - lo, hi - y], fmt="o", ms=4, capsize=2, label=NAMES[family])
    every = [p["measured"] for p in predictions] + [p["predicted"] for p in predictions]
    lim = (min(every) - 0.05, max(every) + 0.05)
    ax.plot(lim, lim, color="grey", lw=0.8)
    ax.fill_between(lim, [v - TARGET for v in lim], [v + TARGET for v in lim], color="grey", alpha=0.15)
    ax.set_xlim(lim)
    ax.set_ylim(lim)
    ax.set_xlabel("measured loss of the held-out run")
    ax.set_ylabel("L(N, D) prediction (95% bootstrap interval)")
    ax.set_title(f"predictions; grey band: ±{TARGET} nats", fontsize=9)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(out / "predictions.png", dpi=120)
    plt.close(fig)
    files.append("predictions.png")
    return files


def _markdown(result: dict[str, Any]) -> str:
    lines = [
        "# Cooldown experiment: L(N, D) from cooldown branches, tested on runs it has not seen",
        "",
        "Written by [`experiments/cooldown/run.py`](../../../experiments/cooldown/run.py)"
        " (`python -m experiments.cooldown report`) from the runs of"
        " [`configs/suites/cooldown.yaml`](../../../configs/suites/cooldown.yaml) and"
        " [`configs/suites/cooldown-fresh.yaml`](../../../configs/suites/cooldown-fresh.yaml);"
        " every command: [`commands.sh`](../../../experiments/cooldown/commands.sh). Embedded corpus, CPU,"
        " one thread per run. Without the runs, `python -m experiments.cooldown report --from-tables`"
        " rewrites it from the tables committed beside it ([`results.csv`](results.csv),"
        " [`fresh-results.csv`](fresh-results.csv)).",
        "",
        f"WSD runs of {result['budget']:,} tokens at four sizes per family; cooldown branches (1-sqrt over"
        f" the last 20 % of each branch) at {', '.join(str(a) for a in result['at'])} of the budget. The fit"
        f" uses the branches that end at ≤ {FIT_UP_TO:g} of the budget; the predictions are for what it"
        " never saw: the branches at ¾, the WSD runs' own ends, and the CPU ladder's runs of the same budget"
        " and peak rate, trained separately on each family's own decaying schedule.",
        "",
        f"## Fits (`{LAW}` law of `trilm.scaling.laws`, Huber (δ = 1e-3) in log space,"
        f" {result['bootstrap']:,} bootstrap resamples by lineage)",
        "",
        "| family | points | E | A | α | B | β | identified |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for family, law in result["laws"].items():
        if "error" in law:
            lines.append(f"| {NAMES[family]} | – | {law['error']} |||||| no |")
            continue
        p = law["params"]
        why = "yes" if law["identified"] else "no: " + "; ".join(law["not_identified_because"])
        lines.append(
            f"| {NAMES[family]} | {law['points']} | {p['E']:.3f} | {p['A']:.3g} | {p['alpha']:.3f} |"
            f" {p['B']:.3g} | {p['beta']:.3f} | {why} |"
        )
    preds = result["predictions"]
    within = sum(abs(p["error"]) <= TARGET for p in preds)
    inside = sum(bool(p["inside_interval"]) for p in preds)
    lines += [
        "",
        f"## Predictions ({within} of {len(preds)} within {TARGET} nats; {inside} of {len(preds)} inside"
        " their 95 % interval)",
        "",
        "| run | family | N (non-emb.) | D | held out as | predicted [95 % CI] | measured | error |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in preds:
        ci = "" if not p["interval"] else f" [{bound(p['interval'][0])}, {bound(p['interval'][1])}]"
        lines.append(
            f"| {p['run']} | {NAMES[p['family']]} | {p['N']:,} | {p['D']:,} | {p['kind']} |"
            f" {p['predicted']:.4f}{ci} | {p['measured']:.4f} | {p['error']:+.4f} |"
        )
    lines += [
        "",
        "![fits](nd_fits.png) ![predictions](predictions.png)",
        "",
        "## Cooldown vs fresh run at equal compute",
        "",
        "| family | size | D | WSD | loss | fresh run | loss | WSD − fresh |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in result["fresh_comparison"]:
        lines.append(
            f"| {NAMES[c['family']]} | {c['size']} | {c['D']:,} | {c['wsd']} ({c['wsd_kind']}) |"
            f" {c['wsd_loss']:.4f} | {c['fresh']} | {c['fresh_loss']:.4f} | {c['difference']:+.4f} |"
        )
    lines += [
        "",
        "## Decay stage (MiniCPM's appendix D): what each family gains in its cooldown",
        "",
        "| run | loss before the cooldown (step) | loss at the end | gain in the cooldown |"
        " gain over as many steps at the constant rate just before |",
        "|---|---|---|---|---|",
    ]
    for d in result["decay_stage"]:
        before = d["gain_at_constant_rate_before"]
        trend = "–" if before is None else f"{before:.4f}"
        lines.append(
            f"| {d['run']} | {d['loss_before']:.4f} ({d['before_step']}) | {d['loss_end']:.4f} |"
            f" {d['gain']:.4f} ({100 * d['share_of_final']:.1f} % of the final loss) | {trend} |"
        )
    lines += [
        "",
        "Spectra's rate drop, in the CPU ladder's fresh runs at the same peak rate (TriLM and BiLM halve the"
        " rate at the middle of the run; FloatLM's cosine has no event there): the loss fallen in the 256"
        " steps after the middle against the 256 steps before it.",
        "",
        "| ladder run | fallen in the 256 steps before the middle | in the 256 after | what the event adds |",
        "|---|---|---|---|",
    ]
    for d in result["ladder_rate_drop"]:
        lines.append(f"| {d['run']} | {d['gain_before']:.4f} | {d['gain_after']:.4f} | {d['excess']:+.4f} |")
    if "size_gaps" in result:
        lines += ["", *markdown(result, NAMES)]
    if result.get("rerun"):
        lines += ["", *rerun_markdown(result["rerun"], _earlier())]
    wall = result["train_seconds"]
    if wall is not None:
        lines += ["", f"Wall time of the training (this machine, summed over runs): {wall:,.0f} s."]
    return "\n".join(lines) + "\n"


def _train_seconds(run_dirs: list[Path]) -> float:
    total = 0.0
    for d in run_dirs:
        path = d / "logs" / "metrics.jsonl"
        if not path.is_file():
            continue
        times = [json.loads(line)["time"] for line in path.read_text().splitlines() if '"time"' in line]
        if times:
            total += max(times) - min(times)
    return total


EARLIER = OUT / "earlier-session-predictions.json"
"""This report as an earlier session's run of the experiment wrote it (same configs and seeds)."""


def _earlier() -> dict[str, Any]:
    return json.loads(EARLIER.read_text()) if EARLIER.is_file() else {}


def _tables(args: argparse.Namespace, suite, fresh, out: Path) -> tuple[list, list, float | None]:
    """The experiment's results tables (every checkpoint of every run and branch) and its training time.

    From the runs, each table is also copied beside the report (``results.csv``, ``fresh-results.csv``), so
    ``report --from-tables`` rewrites the report from the committed tables when the runs are gone."""
    import shutil

    from trilm.scaling.table import read_table
    from trilm.suite.analyse import analyse_suite
    from trilm.suite.cooldown import cooldown_branches

    if args.from_tables:
        previous = out / "predictions.json"
        seconds = json.loads(previous.read_text()).get("train_seconds") if previous.is_file() else None
        fresh_table = out / "fresh-results.csv"
        fresh_rows = read_table(fresh_table) if fresh_table.is_file() else []
        return read_table(out / "results.csv"), fresh_rows, seconds
    analyse_suite(suite, bootstrap=args.bootstrap, plots=False)
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(suite.root / "results.csv", out / "results.csv")
    fresh_rows = []
    if any((r.run_dir / "snapshots").is_dir() for r in fresh.runs):
        analyse_suite(fresh, bootstrap=0, plots=False)
        shutil.copyfile(fresh.root / "results.csv", out / "fresh-results.csv")
        fresh_rows = read_table(fresh.root / "results.csv")
    branches = [b.run.run_dir for b in cooldown_branches(suite) if not b.itself]
    seconds = _train_seconds([r.run_dir for r in suite.runs + fresh.runs] + branches)
    return read_table(out / "results.csv"), fresh_rows, seconds


def report(args: argparse.Namespace, argv: list[str]) -> None:
    from trilm.scaling.table import read_table
    from trilm.suite.config import load_suite

    suite, fresh = load_suite(SUITE), load_suite(FRESH)
    out = Path(args.out)
    rows, fresh_rows, seconds = _tables(args, suite, fresh, out)
    ladder_rows = read_table(LADDER_TABLE) if LADDER_TABLE.is_file() else []
    laws, predictions, fitted = fit_and_predict(rows, args.bootstrap)
    budget = max(r.tokens for r in suite.runs)
    predictions += predict_separate(fitted, ladder_rows, budget)
    rerun = rerun_differences(predictions, _earlier()) if out == OUT else []
    result = {
        "budget": budget,
        "at": list(suite.config.cooldown.at),
        "fit_up_to": FIT_UP_TO,
        "target_nats": TARGET,
        "bootstrap": args.bootstrap,
        "laws": laws,
        "predictions": predictions,
        "fresh_comparison": fresh_comparison(rows, fresh_rows, ladder_rows),
        "decay_stage": decay_stage(rows, suite),
        "ladder_rate_drop": rate_drop(ladder_rows),
        "train_seconds": seconds,
        "rerun": rerun,
        "size_gaps": size_gaps(rows, budget, ORDER),
        "alternatives": alternatives(
            rows, budget, FIT_UP_TO, ORDER, args.alt_bootstrap, tuple(ladder_finals(ladder_rows, budget))
        ),
    }
    out.mkdir(parents=True, exist_ok=True)
    write_result(out / "predictions.json", result, module="experiments.cooldown", argv=argv)
    plots = _plot(fitted, predictions, out) if fitted else []
    (out / "README.md").write_text(_markdown(result))
    print((out / "README.md").read_text())
    print(f"wrote {out / 'predictions.json'}, {out / 'README.md'}" + "".join(f", {out / p}" for p in plots))
    bad = [p for p in predictions if not math.isfinite(p["predicted"])]
    if bad:
        raise SystemExit(f"{len(bad)} prediction(s) are not finite")


def main(argv: list[str] | None = None) -> None:
    first_line = (__doc__ or "").splitlines()[0]
    parser = argparse.ArgumentParser(prog="python -m experiments.cooldown", description=first_line)
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="train the WSD runs, their cooldown branches and the fresh runs")
    p_run.add_argument("--jobs", type=int, default=2, help="runs trained at once, one thread each")
    p_rep = sub.add_parser("report", help="fit, predict and write docs/results/cooldown/")
    p_rep.add_argument("--bootstrap", type=int, default=1000)
    p_rep.add_argument("--out", default=str(OUT))
    p_rep.add_argument(
        "--from-tables",
        action="store_true",
        help="read the results tables committed beside the report instead of the runs",
    )
    p_rep.add_argument(
        "--alt-bootstrap", type=int, default=200, help="bootstrap resamples of the alternative fits"
    )
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    if args.command == "run":
        run(args)
    else:
        report(args, argv)


if __name__ == "__main__":
    main()
