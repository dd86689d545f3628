"""The markdown report of a scaling analysis: fits with intervals, extrapolation errors, the family
comparison, notes on what was not fitted, and the plots."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trilm.families import display_name
from trilm.scaling.identify import loss_by_point

if TYPE_CHECKING:
    from trilm.scaling.report_types import FittedPoints, Report


def fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return "–"
    if isinstance(value, str):
        return value
    value = float(value)
    if math.isinf(value):
        return "∞" if value > 0 else "−∞"
    if math.isnan(value):
        return "–"
    if value != 0 and (abs(value) >= 1e5 or abs(value) < 1e-3):
        return f"{value:.{digits - 1}e}"
    return f"{value:.{digits}g}"


def _param_cell(law: FittedPoints, name: str) -> str:
    value = law.fit.params[name]
    interval = law.fit.param_intervals().get(name)
    if interval is None:
        return fmt(value)
    return f"{fmt(value)} [{fmt(interval[0], 3)}, {fmt(interval[1], 3)}]"


def _law_table(title: str, laws: list[tuple[str, FittedPoints]], names: list[str], level: float) -> list[str]:
    if not laws:
        return []
    head = ["fit", "points", *names, "RMS log-resid", "max |log-resid|", "bootstrap"]
    lines = [
        f"### {title}",
        "",
        (
            f"Estimates with {int(level * 100)}% percentile bootstrap intervals."
            if any(law.fit.param_intervals() for _, law in laws)
            else "Point estimates (no bootstrap)."
        ),
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for label, law in laws:
        d = law.fit.to_dict()
        boot = law.fit.bootstrap
        boot_cell = (
            (
                f"{boot['n_accepted']}/{boot['n_resamples']} ok"
                + (f", {boot['n_degenerate']} degenerate" if boot["n_degenerate"] else "")
                + (f", {boot['n_not_converged']} not converged" if boot["n_not_converged"] else "")
            )
            if boot
            else "–"
        )
        cells = [
            label,
            str(law.fit.n_points),
            *[_param_cell(law, n) for n in names],
            fmt(d["log_residual_rms"], 3),
            fmt(d["log_residual_max_abs"], 3),
            boot_cell,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return [*lines, ""]


def _not_identified(laws: list[tuple[str, FittedPoints]]) -> list[str]:
    """Fits the data do not pin down: why, and the losses that show it (no law, no curve)."""
    if not laws:
        return []
    lines = [
        "### Not identified",
        "",
        "These fits converged, but the data do not identify a law (`Law.plausibility` in"
        " `trilm/scaling/laws/base.py`, the bootstrap's rules in `trilm/scaling/fitter.py`, and"
        " `trilm/scaling/identify.py` across runs); they are not reported as laws, not drawn and not used to"
        " compare families.",
        "",
        "| fit | why not | loss by point |",
        "|---|---|---|",
    ]
    for label, law in laws:
        lines.append(f"| {label} | {law.because} | {loss_by_point(law)} |")
    return [*lines, ""]


def _loso(laws: list[tuple[str, FittedPoints]]) -> list[str]:
    rows = [(label, e) for label, law in laws if law.loso for e in law.loso]
    if not rows:
        return []
    lines = [
        "### Leave-one-size-out",
        "",
        "Each size is left out, the law refitted on the rest and the held-out loss predicted.",
        "",
        "| fit | left out | observed | predicted | rel. error | extrapolation |",
        "|---|---|---|---|---|---|",
    ]
    for label, e in rows:
        if "skipped" in e:
            lines.append(f"| {label} | {e['group']} | – | – | – | skipped: {e['skipped']} |")
        else:
            lines.append(
                f"| {label} | {e['group']} | {fmt(e['observed'])} | {fmt(e['predicted'])} |"
                f" {e['rel_error'] * 100:+.2f}% | {'yes' if e['extrapolation'] else 'no'} |"
            )
    return [*lines, ""]


def _observed(c: dict[str, Any]) -> list[str]:
    ref, fam = display_name(c["reference"]), display_name(c["family"])
    lines = [
        f"### {fam} vs {ref}: observed final losses at shared sizes",
        "",
        f"| size | params | {ref} loss | {fam} loss | difference | {ref} bits | {fam} bits |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in c["shared_sizes"]:
        lines.append(
            f"| {r['size']} | {fmt(r['params'])} | {fmt(r['reference_loss'])} | {fmt(r['loss'])} |"
            f" {r['difference']:+.4f} | {fmt(r['reference_bits'])} | {fmt(r['bits'])} |"
        )
    return [*lines, ""]


def _comparison(c: dict[str, Any]) -> list[str]:
    if c["axis"] == "observed":
        return _observed(c)
    ref, fam = display_name(c["reference"]), display_name(c["family"])
    unit = "params" if c["axis"] == "params" else "bits"
    lo, hi = c["search_range"]
    lines = [f"### {fam} vs {ref} ({'parameters' if unit == 'params' else 'model size in bits'})", ""]
    if c["crossings"]:
        for x in c["crossings"]:
            where = "within the data" if x["within_data"] else "an extrapolation"
            lines.append(f"- The fitted curves cross at {fmt(x['x'])} {unit} ({where}).")
    else:
        lines.append(f"- The fitted curves do not cross between {fmt(lo)} and {fmt(hi)} {unit}.")
    for seg in c["lower_family_by_range"]:
        lines.append(
            f"- {display_name(seg['lower'])} is lower from {fmt(seg['from'])} to {fmt(seg['to'])} {unit}."
        )
    boot = c.get("bootstrap_crossing")
    if boot:
        interval = boot["first_crossing_interval"]
        extra = f"; first crossing interval [{fmt(interval[0])}, {fmt(interval[1])}]" if interval else ""
        lines.append(
            f"- Paired bootstrap: {boot['fraction_with_crossing'] * 100:.1f}% of {boot['n_pairs']} resample"
            f" pairs cross in that range{extra}."
        )
    lines += [
        "",
        f"| {fam} size | {unit} | loss | fitted loss | {ref} loss at same {unit} | {ref} {unit} with equal"
        " loss | ratio | interval |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m in c["matches"]:
        interval = m.get("reference_x_interval")
        cell = f"[{fmt(interval[0])}, {fmt(interval[1])}]" if interval else "–"
        ratio = fmt(m["ratio"], 3)
        if m.get("beyond_reference_data"):
            ratio += " (beyond one decade of the data: not a reading of the fit)"
        lines.append(
            f"| {m['size']} | {fmt(m['x'])} | {fmt(m['loss'])} | {fmt(m['fitted_loss'])} |"
            f" {fmt(m['reference_loss_at_x'])} | {fmt(m['reference_x'])} | {ratio} | {cell} |"
        )
    if c["axis"] == "params" and c.get("gaps"):
        lines += ["", *_gap_lines(c, fam, ref)]
    return [*lines, ""]


def _gap_lines(c: dict[str, Any], fam: str, ref: str) -> list[str]:
    g = c["gaps"]
    intervals = g.get("gap_interval")
    lines = [
        f"Fitted gap {fam} − {ref} at {fam}'s sizes (paired bootstrap intervals):",
        "",
        "| params | fitted gap | interval |",
        "|---|---|---|",
    ]
    for k, (x, gap) in enumerate(zip(g["x"], g["gap"])):
        cell = f"[{intervals[k][0]:+.4f}, {intervals[k][1]:+.4f}]" if intervals else "–"
        lines.append(f"| {fmt(x)} | {gap:+.4f} | {cell} |")
    change = f"- Change from the smallest to the largest size: {g['change']:+.4f}"
    if "change_interval" in g:
        lo, hi = g["change_interval"]
        change += (
            f" [{lo:+.4f}, {hi:+.4f}]; |gap| is smaller at the largest size in"
            f" {g['fraction_shrinking'] * 100:.1f}% of {g['n_pairs']} paired resamples."
        )
    return [*lines, "", change]


def render(report: Report, out_dir: Path) -> str:
    cfg = report.config
    lines = [
        "# Scaling-law report",
        "",
        f"- Tables: {', '.join(f'`{t}`' for t in report.tables)}"
        f" ({report.n_rows} rows of eval `{report.eval_name}`)",
        f"- Families: {', '.join(display_name(f) for f in report.families)}; runs: {len(report.runs)}",
        f"- Form: {cfg.form}; x axis: {cfg.x}; Huber δ = {cfg.delta:g} on log-loss residuals, summed; L-BFGS"
        " from Hoffmann's grid of starts",
        f"- Bootstrap: {cfg.bootstrap} resamples, seed {cfg.seed}, {int(cfg.level * 100)}% percentile"
        " intervals; sizes are resampled, paired across families measured at the same sizes",
        "",
        "## Fits",
        "",
    ]
    fams = report.families.items()
    axis = "N" if cfg.x == "params" else "N_nonemb"
    every = [
        *[(f"{display_name(n)} L({axis})", fa.law_x) for n, fa in fams if fa.law_x],
        *[(f"{display_name(n)} L(bits)", fa.law_bits) for n, fa in fams if fa.law_bits],
        *[(f"{display_name(n)} L(N, D)", fa.law_nd) for n, fa in fams if fa.law_nd],
        *[(f"{run} L(D)", law) for run, law in report.run_fits.items()],
    ]
    x_laws = [(f"{display_name(n)}", fa.law_x) for n, fa in fams if fa.law_x and fa.law_x.identified]
    bit_laws = [
        (f"{display_name(n)}", fa.law_bits) for n, fa in fams if fa.law_bits and fa.law_bits.identified
    ]
    nd_laws = [(f"{display_name(n)}", fa.law_nd) for n, fa in fams if fa.law_nd and fa.law_nd.identified]
    run_laws = [(run, law) for run, law in report.run_fits.items() if law.identified]
    lines += _law_table(
        f"L({axis}) = E + A/{axis}^α on final checkpoints", x_laws, ["E", "A", "alpha"], cfg.level
    )
    lines += _law_table(
        "L(bits) = E + A/bits^α (model size in bits)", bit_laws, ["E", "A", "alpha"], cfg.level
    )
    lines += _law_table(
        "L(N, D) = E + A/N^α + B/D^β on final checkpoints of separate runs",
        nd_laws,
        ["E", "A", "alpha", "B", "beta"],
        cfg.level,
    )
    lines += _law_table(
        "L(D) = E + B/D^β along each run (training dynamics, not separate-D runs)",
        run_laws,
        ["E", "B", "beta"],
        cfg.level,
    )
    if not (x_laws or nd_laws or run_laws):
        lines += ["No law is identified; see below and the notes.", ""]
    lines += _not_identified([(label, law) for label, law in every if not law.identified])
    lines += _loso(x_laws + nd_laws)
    if report.comparisons:
        lines += ["## Family comparison", ""]
        for c in report.comparisons:
            lines += _comparison(c)
    if report.notes:
        lines += ["## Notes", "", *[f"- {n}" for n in report.notes], ""]
    pngs = [name for name in report.files if name.endswith(".png")]
    if pngs:
        lines += ["## Plots", "", *[f"![{name}]({name})" for name in pngs], ""]
    return "\n".join(lines)
