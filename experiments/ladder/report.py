"""The CPU ladder's report: the best rate of each (family, size) → trilm's suite analysis → README.md.

    python -m experiments.ladder       # from the repository root; --bootstrap 1000 by default

Reads the finished runs of the ladder's rate sweep (``runs/ladder/sweep/<family>-<size>-lr<rate>``, the full
budget), takes for each (family, size) the rate with the lowest final validation loss (``adopt.py``'s choice),
and runs ``trilm suite analyse``'s analysis (:func:`trilm.suite.analyse.analyse_suite`: results table, L(N)
and L(bits) per family with size-bootstrap intervals, L(D) along each run, the families compared) on exactly
those runs. Writes, under ``docs/results/ladder/``:

- ``analysis/``: ``suite.md`` and ``report.md`` (the analysis' own reports), ``fit.json``, ``results.csv`` and
  the plots (PNG);
- ``sweeps.png`` and ``mup.png`` (``sweeps.py``: final loss against rate, and the μP check);
- ``README.md``: whether the ladder meets its target, the Spectra questions with intervals, the rate sweeps,
  the wall time, and what is not finished yet. Every number in it comes from this script.

Rerun it whenever more runs have finished; unfinished ones are listed as such, never filled in.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import itertools
import json
import shutil
import sys
from pathlib import Path

from benchmarks.common import CHECKOUT
from experiments.ladder import sweeps
from experiments.ladder.adopt import candidates
from trilm.families import display_name
from trilm.suite import load_suite
from trilm.suite.analyse import analyse_suite, comparison_lines, final_losses, fit_lines, loss_table
from trilm.suite.config import Suite
from trilm.suite.status import run_status
from trilm.suite.text import si

HERE = CHECKOUT / "docs" / "results" / "ladder"
TARGET_SPAN = 8.0
"""The target's smallest ratio of largest to smallest non-embedding parameter count per family."""


@dataclasses.dataclass
class Choice:
    family: str
    size: str
    rates: dict[float, float]
    """every finished rate → its final validation loss"""
    best: float
    run_dir: Path


def choose(suite: Suite) -> tuple[list[Choice], list[str]]:
    """The best finished rate of each (family, size), and the (family, size) pairs with none finished."""
    chosen, missing = [], []
    for run in suite.runs:
        points = candidates(suite, run)
        if not points:
            missing.append(run.name)
            continue
        losses = {p.lr: run_status(p.run).val_loss for p in points}
        best = min(losses, key=losses.get)
        winner = next(p for p in points if p.lr == best)
        chosen.append(Choice(run.family, run.size, losses, best, winner.run.run_dir))
    return chosen, missing


def view(suite: Suite, chosen: list[Choice], root: Path) -> Suite:
    """The suite restricted to the chosen runs, each read from its sweep directory; its results table lives
    under ``root`` (emptied first, so a run that lost its place to a better rate leaves no rows behind)."""
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    where = {(c.family, c.size): c.run_dir for c in chosen}
    runs = [
        dataclasses.replace(r, cfg=r.cfg.with_overrides([f"run_dir={where[r.family, r.size]}"]))
        for r in suite.runs
        if (r.family, r.size) in where
    ]
    return Suite(suite.config.replace(root=str(root)), suite.path, runs)


def wall_times(folder: Path) -> tuple[list[float], float, float]:
    """Per finished full-budget sweep run: seconds from its first to its last metrics record; and the first
    start and last finish over all of them (epoch seconds)."""
    walls, first, last = [], float("inf"), 0.0
    for run in sweeps.collect(folder):
        times = [
            json.loads(line)["time"]
            for line in (folder / run["dir"] / "logs" / "metrics.jsonl").read_text().splitlines()
        ]
        walls.append(times[-1] - times[0])
        first, last = min(first, times[0]), max(last, times[-1])
    return walls, first, last


def target_lines(report) -> tuple[bool, list[str]]:
    """Per family: monotone in size, the span of non-embedding parameters, α and its interval."""
    met, lines = True, []
    for fam in [f for f in ("floatlm", "trilm", "bilm") if f in report.families]:
        fa = report.families[fam]
        by_size = sorted((r.nonembedding_params, r.loss) for r in fa.finals)
        sizes = [n for n, _ in by_size]
        span = sizes[-1] / sizes[0] if sizes else 0.0
        mono = len(set(sizes)) == len(sizes) and all(b < a for (_, a), (_, b) in itertools.pairwise(by_size))
        steps = [a - b for (_, a), (_, b) in itertools.pairwise(by_size)]
        smallest = f"{min(steps):+.4f}" if steps else "–"
        law = fa.law_x
        alpha = "no L(N) fitted"
        ok_alpha = False
        interval = law.fit.param_intervals().get("alpha") if law is not None else None
        if law is not None and law.identified and interval is not None:
            lo, hi = interval
            ok_alpha = lo > 0
            alpha = f"α = {law.fit.params['alpha']:.3g}, 95% CI [{lo:.3g}, {hi:.3g}]"
        elif law is not None:
            alpha = "L(N) not identified: " + (law.because or "no bootstrap interval")
        ok = mono and span >= TARGET_SPAN and ok_alpha
        met &= ok
        lines.append(
            f"| {display_name(fam)} | {len(sizes)} | {span:.1f}× | {'yes' if mono else 'no'} | {smallest} |"
            f" {alpha} | {'**met**' if ok else 'not met'} |"
        )
    return met, lines


def _bound(value: float) -> str:
    """An interval bound; a resample whose fit ran off to a huge value shows as such, not as 30 digits."""
    return f"{value:+.3f}" if abs(value) < 100 else f"{value:+.1e}"


def gap_table(report) -> list[str]:
    """The fitted gaps at each size with their paired-bootstrap intervals, and the change across sizes."""
    out = []
    for c in report.comparisons:
        g = c.get("gaps")
        if c["axis"] != "params" or not g:
            continue
        name = f"{display_name(c['family'])}−{display_name(c['reference'])}"
        cells = []
        for x, gap, iv in zip(g["x"], g["gap"], g.get("gap_interval") or [None] * len(g["x"])):
            cells.append(f"{si(x)}: {gap:+.3f}" + (f" [{_bound(iv[0])}, {_bound(iv[1])}]" if iv else ""))
        change = f"{g['change']:+.3f}"
        if "change_interval" in g:
            lo, hi = g["change_interval"]
            change += f" [{_bound(lo)}, {_bound(hi)}]"
        out.append(f"| {name} | {'; '.join(cells)} | {change} |")
    return out


def spectra_lines(report) -> list[str]:
    gaps, comparison = gap_table(report), comparison_lines(report)
    if not gaps:
        return ["No fitted comparison yet: it needs two families' L(N) identified (see Fits)."]
    return [
        "| gap | at each size (non-embedding params): gap [95 % CI] | change [95 % CI] |",
        "|---|---|---|",
        *gaps,
        "",
        "```",
        *comparison,
        "```",
    ]


def bits_table(report) -> list[str]:
    rows = sorted(
        (entry["bits"][fam], size, fam, entry[fam])
        for size, entry in final_losses(report).items()
        for fam in ("floatlm", "trilm", "bilm")
        if fam in entry
    )
    return [
        "| size in bits | run | loss |",
        "|---|---|---|",
        *[f"| {si(bits)} | {display_name(fam)} {size} | {loss:.4f} |" for bits, size, fam, loss in rows],
    ]


def open_questions(chosen: list[Choice], missing: list[str]) -> list[str]:
    """Which runs would change the picture: sizes not trained yet, rates not bracketed."""
    out = [f"- {name}: no rate finished yet." for name in missing]
    for c in chosen:
        rates = sorted(c.rates)
        if len(rates) == 1:
            out.append(f"- {c.family}-{c.size}: one rate ({c.best:g}) so far; its loss is an upper bound.")
        elif c.best == rates[-1]:
            out.append(
                f"- {c.family}-{c.size}: best at the highest rate tried ({c.best:g}); try {2 * c.best:g}."
            )
        elif c.best == rates[0]:
            out.append(
                f"- {c.family}-{c.size}: best at the lowest rate tried ({c.best:g}); try {c.best / 2:g}."
            )
    return out or ["- Every (family, size) has a finished run with its best rate bracketed."]


def render(suite, chosen, missing, result, ladder, mup, walls, span, mup_walls, bootstrap) -> str:
    report = result.report
    met, targets = target_lines(report)
    first, last = span
    today = datetime.datetime.fromtimestamp(last, datetime.UTC).strftime("%Y-%m-%d")
    n_runs = len(suite.runs)
    lines = [
        "# The CPU ladder: does loss fall with size, and what do the families do?",
        "",
        "TriLM, FloatLM and BiLM at five sizes (widths 32–192, depth 2–4; 33k–1.77M non-embedding"
        " parameters, 54×) on the embedded corpus, 2,097,152 tokens per run in batches of 1,024 tokens, 15 %"
        " warm-up, every run on the same tokens and validated on the same 32,768 tokens"
        " ([`configs/suites/ladder.yaml`](../../../configs/suites/ladder.yaml)). Each (family, size) is"
        " trained at several peak rates and its best is the ladder's run. How the recipe was chosen:"
        " [`pilots.md`](pilots.md). Every command: [`commands.sh`](../../../experiments/ladder/commands.sh).",
        "",
        "This file is written by [`report.py`](../../../experiments/ladder/report.py)"
        " (`python -m experiments.ladder`,"
        f" bootstrap {bootstrap} resamples over sizes, seed 0) from the runs finished by {today}: "
        f"{len(chosen)} of the {n_runs} (family, size) runs have at least one finished rate.",
        "",
        "## Target",
        "",
        "In every family the final loss falls at every step up in size, over at least 8× in non-embedding "
        "parameters, and L(N) = E + A/N^α is identified with α > 0 and a bootstrap interval that excludes 0."
        " (The smallest step down is the least any step up in size lowered the loss, in nats.)",
        "",
        "| family | sizes | span | loss falls at every step | smallest step down | L(N_nonemb) | target |",
        "|---|---|---|---|---|---|---|",
        *targets,
        "",
        f"**The target is {'met' if met else 'not met'}** with the runs finished so far.",
    ]
    if missing:
        lines[-1] += f" Not finished at any rate yet: {', '.join(missing)}."
    lines += [
        "",
        "## Final loss by size (best rate of each)",
        "",
        loss_table(report, markdown=True),
        "",
        "| run | rates finished (final loss) | best |",
        "|---|---|---|",
        *[
            f"| {c.family}-{c.size} | "
            + ", ".join(f"{lr:g}: {loss:.4f}" for lr, loss in sorted(c.rates.items()))
            + f" | {c.best:g}"
            + (" (edge)" if len(c.rates) > 1 and c.best in (min(c.rates), max(c.rates)) else "")
            + " |"
            for c in chosen
        ],
        "",
        "A best rate at the edge of what was tried (or a single rate) may not be the size's best: its loss"
        " is an upper bound.",
        "",
        "## Fits",
        "",
        "```",
        *fit_lines(report),
        "```",
        "",
        "![loss against non-embedding parameters](analysis/loss_vs_params.png)",
        "",
        "## Spectra's questions",
        "",
        "Fitted gaps between the families' L(N) curves at each size, with paired-bootstrap 95 % intervals "
        "(the same sizes drawn for both families), and the change of the gap from the smallest to the"
        " largest size (negative: the gap shrinks). Only where both families' laws are identified.",
        "",
        *spectra_lines(report),
        "",
        "Equal size in bits: every final checkpoint by its size in bits (linear weights at log2(3) bits for"
        " TriLM, 1 for BiLM, 16 for FloatLM; embedding, head and norms at 16):",
        "",
        *bits_table(report),
        "",
        "![loss against size in bits](analysis/loss_vs_bits.png)",
        "",
        "The full analysis (L(D) along each run, leave-one-size-out errors, notes): "
        "[`analysis/suite.md`](analysis/suite.md), [`analysis/report.md`](analysis/report.md); training "
        "curves: [`analysis/training_curves.png`](analysis/training_curves.png).",
        "",
        "## Rate sweeps",
        "",
        "Final validation loss by peak rate; the best of each row in bold.",
        "",
        sweeps.ladder_table(ladder),
        "",
        "![final loss against rate](sweeps.png)",
        "",
        "Does a rate carry over across widths? FloatLM at depth 4, widths 64–192, in the standard "
        "parametrization (SP; 128x4 and 192x4 are the ladder's own runs) and in μP with base width 64 "
        "(`model.mup_base_width=64`; μP at width 64 is SP, the same runs):",
        "",
        sweeps.mup_table(mup),
        "",
        "![the μP check](mup.png)",
        "",
        "## Wall time",
        "",
        f"{len(walls)} full-budget runs of the sweep finished, {sum(walls) / 3600:.1f} hours of run time in"
        f" all (first to last metrics record of each; median {sorted(walls)[len(walls) // 2] / 60:.0f} min), "
        f"between {_utc(first)} and {_utc(last)} ({(last - first) / 3600:.1f} hours elapsed), two to five "
        "single-threaded runs at a time at nice 19 on a 2-core machine shared with other work: they show"
        " what the ladder costs here, not on a quiet machine.",
    ]
    if mup_walls:
        lines[-1] += f" The μP check: {len(mup_walls)} more runs, {sum(mup_walls) / 3600:.1f} hours."
    lines += ["", "## Not settled yet", "", *open_questions(chosen, missing)]
    return "\n".join(lines) + "\n"


def _utc(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")


def tidy(analysis: Path, out: Path) -> None:
    """PNG plots only (the README shows them; SVG copies of every regeneration add up), and ``fit.json``'s
    file list relative to its own folder (the machine's absolute paths do not belong in the repository)."""
    for svg in [*analysis.glob("*.svg"), out / "sweeps.svg", out / "mup.svg"]:
        svg.unlink(missing_ok=True)
    fit_json = analysis / "fit.json"
    fit = json.loads(fit_json.read_text())
    fit["files"] = {k: Path(v).name for k, v in fit["files"].items() if not v.endswith(".svg")}
    fit_json.write_text(json.dumps(fit, indent=2) + "\n")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", type=Path, default=None, help="the ladder's run directory (default: its own)")
    p.add_argument("--out", type=Path, default=HERE, help="where README.md, analysis/ and the plots go")
    p.add_argument("--bootstrap", type=int, default=1000)
    args = p.parse_args()
    suite = load_suite("ladder", root=args.root)
    chosen, missing = choose(suite)
    if not chosen:
        print(f"no finished run under {suite.root / 'sweep'}", file=sys.stderr)
        return 2
    analysis = args.out / "analysis"
    result = analyse_suite(
        view(suite, chosen, suite.root / "report"), out_dir=analysis, bootstrap=args.bootstrap, seed=0
    )
    shutil.copy(result.table, analysis / "results.csv")
    ladder = sweeps.collect(suite.root / "sweep")
    mup_root = suite.root.parent / "ladder-mup" / "sweep"
    mup = sweeps.mup_points(ladder, sweeps.collect(mup_root))
    sweeps.plot_sweeps(ladder, args.out)
    sweeps.plot_mup(mup, args.out)
    tidy(analysis, args.out)
    walls, first, last = wall_times(suite.root / "sweep")
    mup_walls = wall_times(mup_root)[0] if mup_root.is_dir() else []
    text = render(
        suite, chosen, missing, result, ladder, mup, walls, (first, last), mup_walls, args.bootstrap
    )
    (args.out / "README.md").write_text(text)
    print(text)
    print(f"wrote {args.out / 'README.md'}, {analysis}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
