"""``trilm suite analyse``: checkpoints → results table → scaling fits and family comparison → report.

The rows come from the one writer of results rows (:mod:`trilm.eval.suite`): every complete snapshot of every
run, with the validation loss the trainer measured on the fixed validation set when it wrote the snapshot.
The fits and comparisons are :func:`trilm.scaling.analyze` (L(N) and L(bits) per family with bootstrap
intervals, L(D) per run, families against FloatLM at equal parameters and at equal size in bits). On top,
this module writes ``suite.md``: the suite's final losses side by side per size, the gaps between families,
the fitted curves, what the fitted curves say at equal size in bits, and how well the curve law and the
scaling laws predicted the finished runs they did not see (:mod:`trilm.suite.predicted`) — the summary the
quickstart prints.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trilm.atomic import write_text
from trilm.eval.suite import write_suite_table
from trilm.families import display_name
from trilm.scaling import analyze
from trilm.scaling.compare import EXTRAPOLATE
from trilm.scaling.envelope import gaps
from trilm.scaling.errors import FitError
from trilm.scaling.identify import SYMBOLS, loss_by_point
from trilm.schedule import Schedule
from trilm.store.integrity import complete_steps
from trilm.store.snapshot import read_snapshot_config
from trilm.suite.config import Suite, shown_path
from trilm.suite.cooldown import cooldown_branches
from trilm.suite.predicted import FORECAST_FROM, markdown_lines, predictions, write_plot
from trilm.suite.text import si, table

if TYPE_CHECKING:
    from trilm.scaling.report_types import FittedPoints, Report
    from trilm.suite.predicted import Predictions

ORDER = ("floatlm", "trilm", "bilm")


@dataclasses.dataclass
class SuiteAnalysis:
    suite: Suite
    table: Path
    out_dir: Path
    runs_with_rows: list[str]
    added: int
    skipped: int
    without_loss: list[str]
    report: Report
    predictions: Predictions | None = None

    @property
    def summary_file(self) -> Path:
        return self.out_dir / "suite.md"


def _snapshots_without_loss(run_dir: Path) -> list[str]:

    out = []
    for step, path in complete_steps(run_dir / "snapshots"):
        if read_snapshot_config(path)[1].val_loss is None:
            out.append(f"{run_dir.name}@{step}")
    return out


def analyse_suite(
    suite: Suite,
    *,
    out_dir: str | Path | None = None,
    bootstrap: int = 1000,
    seed: int = 0,
    plots: bool = True,
    x: str | None = None,
    forecast_from: float | None = FORECAST_FROM,
    echo: Callable[[str], None] = print,
) -> SuiteAnalysis:
    """Results table ``<root>/results.csv`` (rows already there are kept) → ``<root>/analysis``; ``x`` is
    the size axis of L(N) (default: the suite's ``analysis.x``); ``forecast_from`` the share of each finished
    run the curve-law forecast is made from (None: no forecasts)."""

    run_dirs = [r.run_dir for r in suite.runs if complete_steps(r.run_dir / "snapshots")]
    if suite.config.cooldown.at:
        branches = [b.run for b in cooldown_branches(suite) if not b.itself]
        run_dirs += [r.run_dir for r in branches if complete_steps(r.run_dir / "snapshots")]
    if not run_dirs:
        raise FitError(f"suite {suite.name}: no run under {suite.root} has a complete snapshot yet")
    missing = [s for d in run_dirs for s in _snapshots_without_loss(d)]
    table_path = suite.root / "results.csv"
    added, skipped = write_suite_table(run_dirs, table_path)
    echo(f"results table {table_path}: {added} rows added, {skipped} already there")
    return analyse_table(
        suite,
        table_path,
        out_dir=out_dir,
        bootstrap=bootstrap,
        seed=seed,
        plots=plots,
        x=x,
        forecast_from=forecast_from,
        counts=([d.name for d in run_dirs], added, skipped, missing),
    )


def analyse_table(
    suite: Suite,
    table_path: Path,
    *,
    out_dir: str | Path | None = None,
    bootstrap: int = 1000,
    seed: int = 0,
    plots: bool = True,
    x: str | None = None,
    forecast_from: float | None = FORECAST_FROM,
    counts: tuple[list[str], int, int, list[str]] | None = None,
) -> SuiteAnalysis:
    """Fits, predictions and report of the suite's results table ``table_path`` as it is (what
    :func:`analyse_suite` runs once it has written it; ``counts``: its runs with rows, rows added and
    skipped, snapshots without a loss)."""

    out = Path(out_dir) if out_dir is not None else suite.root / "analysis"
    axis = x or suite.config.analysis.x
    report = analyze(
        [table_path],
        out,
        bootstrap=bootstrap,
        seed=seed,
        plots=plots,
        x=axis,
        d_from=warmup_fraction(suite),
        events=schedule_events(suite),
    )
    runs, added, skipped, missing = counts or (list(report.runs), 0, 0, [])
    result = SuiteAnalysis(suite, table_path, out, runs, added, skipped, missing, report)
    if forecast_from is not None:
        result.predictions = predictions(list(suite.runs), report, forecast_from)
        if plots:
            report.files.update(write_plot(result.predictions, out))
    write_text(result.summary_file, render_markdown(result))
    report.files["suite"] = str(result.summary_file)
    return result


def schedule_events(suite: Suite) -> dict[str, list[dict[str, Any]]]:
    """Per run (branches included), its schedule's events with the tokens at which they happen."""

    runs = list(suite.runs)
    if suite.config.cooldown.at:
        runs += [b.run for b in cooldown_branches(suite) if not b.itself]
    out = {}
    for r in runs:
        sched = Schedule.for_optimizer(r.cfg.optim, r.cfg.schedule, r.cfg.steps)
        out[r.name] = [
            {"name": e.name, "step": e.step, "tokens": e.step * r.cfg.batch_tokens, "detail": e.detail}
            for e in sched.events()
            if not (r.parent and e.step <= r.branch_step)  # a branch shows only what happens in it
        ]
    return out


def warmup_fraction(suite: Suite) -> float:
    """The largest fraction of a run that is warm-up, over the suite's runs (L(D) is fitted after it)."""

    fractions = [
        Schedule.for_optimizer(r.cfg.optim, r.cfg.schedule, r.cfg.steps).warmup_steps / max(r.cfg.steps, 1)
        for r in suite.runs
    ]
    return min(max(fractions, default=0.0), 0.9)


# ---- what the analysis says -------------------------------------------------------------------------------
def _families(report: Report) -> list[str]:
    known = [f for f in ORDER if f in report.families]
    return known + [f for f in report.families if f not in known]


def _name(family: str) -> str:
    return display_name(family)


def final_losses(report: Report) -> dict[str, dict[str, Any]]:
    """``{size: {"params": N, family: loss, …}}`` from the final checkpoint of each run (lowest per size)."""
    out: dict[str, dict[str, Any]] = {}
    for fam, fa in report.families.items():
        for row in fa.finals:
            entry = out.setdefault(
                row.size, {"params": row.params, "nonembedding_params": row.nonembedding_params, "bits": {}}
            )
            if fam not in entry or row.loss < entry[fam]:
                entry[fam] = row.loss
                entry["bits"][fam] = row.model_bits
    return dict(sorted(out.items(), key=lambda kv: kv[1]["params"]))


def _gap_pairs(families: list[str]) -> list[tuple[str, str]]:
    pairs = [(f, "floatlm") for f in families if f != "floatlm" and "floatlm" in families]
    if "trilm" in families and "bilm" in families:
        pairs.append(("trilm", "bilm"))
    return pairs


def loss_table(report: Report, markdown: bool = False) -> str:
    families = _families(report)
    pairs = _gap_pairs(families)
    gaps = [f"{_name(a)}−{_name(b)}" for a, b in pairs]
    headers = ["size", "params", "non-emb", *[_name(f) for f in families], *gaps]
    rows = []
    for size, entry in final_losses(report).items():
        cells = [size, si(entry["params"]), si(entry["nonembedding_params"])]
        cells += [f"{entry[f]:.4f}" if f in entry else "–" for f in families]
        cells += [f"{entry[a] - entry[b]:+.4f}" if a in entry and b in entry else "–" for a, b in pairs]
        rows.append(cells)
    return table(headers, rows, markdown=markdown)


def _law_text(law: FittedPoints, var: str, level: float) -> str:
    """An identified law with its exponent's bootstrap interval (only ever called for identified laws)."""
    p = law.fit.params
    coef, exp, sym = ("A", "alpha", "α") if "A" in p else ("B", "beta", "β")
    cell = f"L({var}) = {p['E']:.4g} + {p[coef]:.4g} / {var}^{p[exp]:.4g}"
    interval = law.fit.param_intervals().get(exp)
    if interval is not None:
        cell += f"   ({sym} {int(level * 100)}% CI [{interval[0]:.3g}, {interval[1]:.3g}])"
    return cell


def fit_lines(report: Report) -> list[str]:
    """Per family: its identified L(N) and L(bits) as laws, or why the L(N) is not identified and the loss by
    size that shows it. An unidentified fit is never written as a law."""

    axis = "N" if report.config.x == "params" else "N_nonemb"
    lines = []
    for fam in _families(report):
        fa = report.families[fam]
        for law, var in ((fa.law_x, axis), (fa.law_bits, "bits")):
            if law is None:
                continue
            if law.identified:
                text = _law_text(law, var, report.config.level)
                lines.append(f"{_name(fam):>8}  {text}   [{law.fit.n_points} sizes]")
            elif var != "bits" or (fa.law_x is not None and fa.law_x.identified):
                lines.append(f"{_name(fam):>8}  L({var}) not identified: {law.because}")
                lines.append(f"{'':>8}  loss by size: {loss_by_point(law)}")
    return lines


def run_fit_rows(report: Report) -> tuple[list[list[str]], list[str]]:
    """L(D) along each run: table rows of the identified fits, and ``run: why not`` for the others."""
    rows, others = [], []
    for run, law in report.run_fits.items():
        if law.identified:
            p, d = law.fit.params, law.fit.to_dict()
            rows.append(
                [
                    run,
                    f"{p['E']:.4g}",
                    f"{p['B']:.4g}",
                    f"{p['beta']:.3g}",
                    str(law.fit.n_points),
                    f"{d['log_residual_rms']:.3g}",
                ]
            )
        else:
            others.append(f"{run}: {law.because}")
    return rows, others


RUN_FIT_HEADERS = ["run", "E", "B", "β", "checkpoints", "RMS log-resid"]
TRAINING_DYNAMICS = (
    "training dynamics, not a scaling law: along one run the schedule shapes the curve, and a checkpoint at D"
    " is not the model a run of D tokens would give"
)


def run_fit_lines(report: Report, markdown: bool = False) -> list[str]:
    if not report.run_fits:
        return []
    rows, others = run_fit_rows(report)
    head = (
        f"L(D) = E + B/D^β along each run ({TRAINING_DYNAMICS}; identified in {len(rows)} of"
        f" {len(report.run_fits)} runs):"
    )
    lines = [head]
    if rows:
        lines.append(table(RUN_FIT_HEADERS, rows, markdown=markdown))
    lines += [f"not identified: {o}" for o in others]
    return lines


def nd_lines(report: Report) -> list[str]:
    """Per family with cooldown branches or several budgets: its L(N, D) as a law, or why not; and the
    approach-1 envelope's compute-optimal size."""

    lines = []
    axis = "N" if report.config.x == "params" else "N_nonemb"
    for fam in _families(report):
        fa = report.families[fam]
        law = fa.law_nd
        if law is not None:
            p = law.fit.params
            if law.identified:
                cell = (
                    f"L({axis}, D) = {p['E']:.4g} + {p['A']:.4g}/{axis}^{p['alpha']:.3g}"
                    f" + {p['B']:.4g}/D^{p['beta']:.3g}"
                )
                s, level = law.fit.param_intervals(), int(report.config.level * 100)
                if s:
                    cis = [f"{SYMBOLS[k]} {level}% CI [{s[k][0]:.3g}, {s[k][1]:.3g}]" for k in SYMBOLS]
                    cell += f"   ({', '.join(cis)})"
                lines.append(f"{_name(fam):>8}  {cell}   [{law.fit.n_points} cooled points]")
            else:
                lines.append(f"{_name(fam):>8}  L({axis}, D) not identified: {law.because}")
        env = fa.envelope
        if env is not None:
            if env.identified:
                ci = f" [{env.interval_n[0]:.3g}, {env.interval_n[1]:.3g}]" if env.interval_n else ""
                lines.append(
                    f"{'':>8}  compute-optimal (approach 1, lowest cooled loss at each C):"
                    f" N* ∝ C^{env.exponent_n:.3g}{ci}, D* ∝ C^{env.exponent_d:.3g};"
                    f" optimal sizes {', '.join(env.winners())}"
                )
            else:
                lines.append(f"{'':>8}  compute-optimal N*(C) not identified: {env.reason}")
    ref = report.families.get("floatlm")
    for fam in _families(report):
        env = report.families[fam].envelope
        if fam == "floatlm" or env is None or ref is None or ref.envelope is None:
            continue

        cells = [f"{g:+.4f} at {c:.3g} FLOPs" for c, g in gaps(env, ref.envelope)]
        if cells:
            lines.append(
                f"{_name(fam):>8}  − FloatLM at equal training FLOPs (lowest cooled loss): {'; '.join(cells)}"
            )
    return lines


def _signed(value: float) -> str:
    """An interval bound: a bootstrap resample whose fit ran off (few sizes) shows as 1e+30, not 31 digits."""
    return f"{value:+.4f}" if abs(value) < 100 else f"{value:+.2e}"


def _below_floor(ref: str, loss: float, c: dict) -> str:
    """A loss under the reference fit's floor E: said with E and its interval, and not as a finding when the
    interval reaches the loss (the floor is then not known well enough to be beaten)."""
    text = f"below the {ref} fit's floor E = {c['reference_E']:.4f}"
    if "reference_E_interval" not in c:
        return text
    (lo, hi), level = c["reference_E_interval"], int(100 * c.get("level", 0.95))
    if loss >= lo:
        return f"{text}, but inside its {level}% interval [{lo:.4f}, {hi:.4f}]: not settled"
    return f"{text} and its {level}% interval [{lo:.4f}, {hi:.4f}]"


def comparison_lines(report: Report) -> list[str]:
    """What the fitted curves say, per family against the reference, at equal parameters and equal bits.
    A match further out than one decade beyond the reference's largest model (:data:`EXTRAPOLATE`) is not
    read off the curve: it would be the extrapolation the plots refuse to draw."""

    lines = []
    for c in report.comparisons:
        if c["axis"] == "observed":
            continue
        fam, ref = _name(c["family"]), _name(c["reference"])
        unit = "parameters" if c["axis"] == "params" else "size in bits"
        if c["crossings"]:
            where = ", ".join(
                f"{si(x['x'])} ({'within the data' if x['within_data'] else 'extrapolated'})"
                for x in c["crossings"]
            )
            cross = f"curves cross at {where}"
        else:
            lo, hi = c["search_range"]
            cross = f"curves do not cross between {si(lo)} and {si(hi)}"
        lower = c["lower_family_by_range"]
        at_data = [s for s in lower if s["from"] <= max(m["x"] for m in c["matches"])]
        lower_now = _name(at_data[-1]["lower"]) if at_data else "?"
        lines.append(f"{fam} vs {ref} at equal {unit}: {cross}; {lower_now} is lower at the largest size")
        g = c.get("gaps")
        if c["axis"] == "params" and g:
            change = f"{g['change']:+.4f}"
            if "change_interval" in g:
                lo, hi = g["change_interval"]
                change += f" [{_signed(lo)}, {_signed(hi)}]"
            lines.append(
                f"    fitted gap {fam}−{ref}: {g['gap'][0]:+.4f} at {si(g['x'][0])} → {g['gap'][-1]:+.4f}"
                f" at {si(g['x'][-1])}; change {change}"
            )
        what = "parameters" if c["axis"] == "params" else "bits"
        for m in c["matches"]:
            ratio = m["ratio"]
            if ratio != ratio or ratio == float("inf"):
                verdict = _below_floor(ref, m["loss"], c)
            elif m.get("beyond_reference_data"):
                verdict = (
                    f"below the {ref} fit up to {EXTRAPOLATE:g}× its largest model (a match further out is"
                    " not read off the curve)"
                )
            else:
                verdict = f"as good as {ref} with {ratio:.3g}× its {what}"
            lines.append(f"    {fam} {m['size']:<8} {si(m['x']):>7}: loss {m['loss']:.4f} — {verdict}")
    return lines


def _unfitted(report: Report) -> list[str]:
    return [n for n in report.notes if "L(N) not fitted" in n]


def _shown(note: str) -> bool:
    return "L(N) not fitted" in note or ": not identified: " in note


def other_notes(report: Report) -> list[str]:
    """The analysis notes that :func:`summary_text` does not already show."""
    return [n for n in report.notes if not _shown(n)]


def ordering_lines(report: Report) -> list[str]:
    """Per family: does the final loss fall at every step up in size, and where not."""
    lines = []
    for fam in _families(report):
        by_size: dict[str, tuple[float, float]] = {}
        for r in report.families[fam].finals:
            if r.size not in by_size or r.loss < by_size[r.size][1]:
                by_size[r.size] = (r.params, r.loss)
        ordered = sorted(by_size.items(), key=lambda kv: kv[1][0])
        if len(ordered) < 2:
            continue
        rises = [
            f"{a} → {b} ({lb - la:+.4f})"
            for (a, (_, la)), (b, (_, lb)) in itertools.pairwise(ordered)
            if lb >= la
        ]
        verdict = "falls at every step up in size" if not rises else f"does not fall at {', '.join(rises)}"
        lines.append(f"{_name(fam):>8}  loss {verdict}")
    return lines


def summary_text(
    report: Report, after_table: list[str] | None = None, comparison_caveat: str | None = None
) -> str:
    """Terminal summary: final losses per size and family (with ``after_table`` right below them), whether
    they fall with size, the identified laws (or why not), the L(D) fits along each run and the
    comparisons (headed by ``comparison_caveat``, e.g. that this budget orders the families otherwise than
    a longer one, so the reader meets it before the first "X is lower")."""
    lines = ["final validation loss per size (nats/token; A−B: loss of A minus loss of B)"]
    lines += [loss_table(report), *(after_table or []), *[f"  {line}" for line in ordering_lines(report)], ""]
    fits = fit_lines(report)
    lines += ["L(N) = E + A/N^α per family (final checkpoints):" if fits else "no L(N) fitted"]
    lines += [f"  {f}" for f in fits] if fits else [f"  {n}" for n in _unfitted(report)]
    nd = nd_lines(report)
    if nd:
        lines += ["", "L(N, D) = E + A/N^α + B/D^β per family (cooldown branches and final checkpoints):"]
        lines += [f"  {line}" for line in nd]
    runs = run_fit_lines(report)
    if runs:
        lines += ["", runs[0], *[f"  {line}" for text in runs[1:] for line in text.splitlines()]]
    comp = comparison_lines(report)
    if comp:
        lines += ["", "family comparison (fitted curves):"]
        lines += [f"  note: {comparison_caveat}"] if comparison_caveat else []
        lines += [f"  {c}" for c in comp]
    elif comparison_caveat:
        lines += ["", f"note: {comparison_caveat}"]
    return "\n".join(lines)


def render_markdown(result: SuiteAnalysis) -> str:
    suite, report = result.suite, result.report
    cfg = suite.config
    fams = ", ".join(_name(f) for f in _families(report))
    budgets = ", ".join(f"{t:,}" for t in cfg.tokens)
    lines = [f"# Suite {cfg.name}", ""]
    if cfg.description.strip():
        lines += [cfg.description.strip(), ""]
    lines += [
        f"- Suite file: `{shown_path(suite.path)}`",
        f"- Families: {fams}; sizes: {', '.join(s.name for s in cfg.sizes)}; token budget(s): {budgets}",
        f"- Runs analysed: {len(result.runs_with_rows)} of {len(suite.runs)}; results table"
        f" `{result.table.name}` ({report.n_rows} rows of `{report.eval_name}`)",
    ]
    if result.without_loss:
        lines.append(
            f"- {len(result.without_loss)} snapshot(s) without a recorded loss left out:"
            f" {', '.join(result.without_loss[:8])}{' …' if len(result.without_loss) > 8 else ''}"
        )
    lines += [
        "",
        "## Final validation loss per size",
        "",
        "Nats per token on the fixed validation set, at each run's last checkpoint; the gap columns are the"
        " first family minus the second (negative: the first is better).",
        "",
        loss_table(report, markdown=True),
        "",
        *[f"- {line.strip()}" for line in ordering_lines(report)],
        "",
    ]
    by_bits = sorted(
        (entry["bits"][fam], size, fam, entry[fam])
        for size, entry in final_losses(report).items()
        for fam in _families(report)
        if fam in entry
    )
    bit_rows = [[size, _name(fam), si(bits), f"{loss:.4f}"] for bits, size, fam, loss in by_bits]
    lines += [
        "## Loss against model size in bits",
        "",
        "Every final checkpoint ordered by its size in bits (linear weights at log2(3) bits for TriLM, 1 for"
        " BiLM, 16 for FloatLM; embedding, head and norms at 16).",
        "",
        table(["size", "family", "bits", "loss"], bit_rows, markdown=True),
        "",
    ]
    fits = fit_lines(report)
    if fits:
        lines += [
            "## Fitted curves",
            "",
            "A fit is shown as a law only when the data identify it (exponent above 0 with a bootstrap"
            " interval of width that excludes 0, a new low at 3 or more sizes, more sizes than"
            " parameters); otherwise it says why not.",
            "",
            "```",
            *fits,
            "```",
            "",
        ]
    nd = nd_lines(report)
    if nd:
        lines += ["## L(N, D) over cooled points", "", "```", *nd, "```", ""]
    runs = run_fit_lines(report, markdown=True)
    if runs:
        lines += ["## Training dynamics along each run: L(D)", "", runs[0], "", *runs[1:], ""]
    comp = comparison_lines(report)
    if comp:
        lines += ["## Family comparison (fitted curves)", "", "```", *comp, "```", ""]
    if result.predictions is not None:
        lines += markdown_lines(result.predictions)
    lines += [
        "The full scaling report (fits with bootstrap intervals, leave-one-size-out errors, crossings,"
        " notes) is [report.md](report.md); plots: [loss vs parameters](loss_vs_params.png),"
        " [loss vs size in bits](loss_vs_bits.png), [loss vs training FLOPs](loss_vs_flops.png),"
        " [training curves](training_curves.png).",
        "",
    ]
    return "\n".join(lines)
