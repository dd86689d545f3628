"""Plots of a scaling analysis, one figure per question, as PNG and SVG: loss against parameters, against size
in bits and against training FLOPs (final checkpoints, identified laws with their bootstrap bands), the
training curves with the schedule's events marked, and L(N, D) against D per size.

Every figure follows the same rules, so that a reader sees the data and not the fit's imagination:

- the axes are bounded by the data, with a margin (:func:`log_limits`, :func:`lin_limits`); a fitted
  curve is drawn over its data's range (solid) and at most one decade beyond (dashed), never further,
  and curves and bands that leave the axes are clipped at them;
- only identified laws are drawn (:attr:`trilm.scaling.fitter.Fit.identified`); the others' points are
  joined by a thin line and their legend entry says "no law identified";
- the legend sits outside the axes, right of them, so it never covers a point.

Figures are built on :class:`matplotlib.figure.Figure` directly (no pyplot state, no backend switch), so
this works headless and inside other programs. ``figure_*`` functions return the figure (what the tests
inspect); ``plot_*`` write it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter

from trilm.families import display_name
from trilm.scaling.compare import EXTRAPOLATE
from trilm.scaling.table import family_kind

if TYPE_CHECKING:
    from trilm.scaling.report_types import FittedPoints, Report

KIND_COLORS = {"floatlm": "tab:blue", "trilm": "tab:red", "bilm": "tab:green"}
OTHER_COLORS = ["tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan", "tab:gray", "tab:orange"]
MARGIN = 0.06
"""Share of the data's span (log span on log axes) added on each side."""
EVENT_STYLE = {
    "warmup_end": ("warm-up ends", ":"),
    "cooldown_start": ("cooldown starts", "--"),
    "lr_drop": ("LR drop", "-."),
    "weight_decay_off": ("weight decay off", (0, (1, 3))),
}


def family_colors(families: list[str]) -> dict[str, str]:
    out, spare = {}, iter(OTHER_COLORS * 4)
    for f in families:
        out[f] = KIND_COLORS.get(family_kind(f)) or next(spare)
    return out


def log_limits(values: Any, margin: float = MARGIN) -> tuple[float, float]:
    """Limits of a log axis around positive ``values``: their range widened by ``margin`` of its log span
    (at least a fifth of a decade in all)."""
    v = np.asarray([x for x in np.ravel(values) if np.isfinite(x) and x > 0], float)
    lo, hi = np.log10(v.min()), np.log10(v.max())
    pad = max((hi - lo) * margin, (0.2 - (hi - lo)) / 2, 0.0)
    return float(10 ** (lo - pad)), float(10 ** (hi + pad))


def lin_limits(values: Any, margin: float = MARGIN) -> tuple[float, float]:
    """Limits of a linear axis around ``values``: their range widened by ``margin`` of it (or ±1 % of the
    value when they are all equal)."""
    v = np.asarray([x for x in np.ravel(values) if np.isfinite(x)], float)
    lo, hi = float(v.min()), float(v.max())
    pad = (hi - lo) * margin if hi > lo else max(abs(hi) * 0.01, 1e-3)
    return lo - pad, hi + pad


def _plain_minor_ticks(ax: Any) -> None:
    """No labels on minor log ticks: over one or two decades matplotlib labels them and they collide."""

    ax.xaxis.set_minor_formatter(NullFormatter())


def legend_outside(ax: Any, **kw: Any) -> None:
    """The legend right of the axes (it never covers a point); nothing when there is nothing to label."""
    handles, _ = ax.get_legend_handles_labels()
    if handles:
        ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, fontsize=7, **kw)


def save(fig: Figure, out_dir: Path, stem: str) -> dict[str, str]:
    files = {}
    for ext in ("png", "svg"):
        path = out_dir / f"{stem}.{ext}"
        fig.savefig(path, dpi=150 if ext == "png" else None, bbox_inches="tight")
        files[f"{stem}.{ext}"] = str(path)
    return files


_save = save


def _law_label(law: FittedPoints, var: str) -> str:
    p = law.fit.params
    coef, exp = ("A", "alpha") if "A" in p else ("B", "beta")
    return f"E={p['E']:.3g} + {p[coef]:.3g}/{var}^{p[exp]:.3g}"


def _draw_law(
    ax: Any,
    law: FittedPoints,
    var: str,
    x_data: np.ndarray,
    color: str,
    label: str,
    *,
    x_max: float | None = None,
) -> None:
    """Fit curve (solid over the data, dashed beyond up to ``x_max``, at most one decade) and the bootstrap
    band over the same range; the caller's axis limits clip both."""
    lo, hi = float(x_data.min()), float(x_data.max())
    top = min(x_max if x_max is not None else hi * EXTRAPOLATE, hi * EXTRAPOLATE)
    xs = np.geomspace(lo, max(top, hi), 200)
    pred = law.fit.predict(**{var: xs})
    ys = pred.value
    inside = xs <= hi * (1 + 1e-9)
    ax.plot(xs[inside], ys[inside], color=color, lw=1.8, label=label)
    if top > hi:
        ax.plot(xs[~inside], ys[~inside], color=color, lw=1.2, ls="--")
    if pred.low is not None and pred.high is not None:
        ax.fill_between(xs, pred.low, pred.high, color=color, alpha=0.15, lw=0)


def _final_x(report: Report, fa: Any, axis: str) -> np.ndarray:
    if axis == "params":
        return np.array([getattr(r, report.config.x) for r in fa.finals], float)
    if axis == "bits":
        return np.array([r.model_bits for r in fa.finals], float)
    return np.array([r.flops for r in fa.finals], float)


AXIS_LABEL = {
    "bits": "model size in bits (params × bits/param)",
    "flops": "training FLOPs (trilm.model.flops × tokens)",
}


def figure_loss_vs(report: Report, axis: str) -> Figure:
    """Final loss per family against parameters (``params``), model size in bits (``bits``) or training
    FLOPs (``flops``); identified laws of L(N) and L(bits) drawn over their data and one decade beyond."""
    fig = Figure(figsize=(7.8, 4.6))
    ax = fig.subplots()
    colors = family_colors(list(report.families))
    attr = {"params": "law_x", "bits": "law_bits"}.get(axis)
    xs_all, ys_all, x_right = [], [], []
    for name, fa in report.families.items():
        x, y = _final_x(report, fa, axis), np.array([r.loss for r in fa.finals])
        if not x.size:
            continue
        xs_all.append(x)
        ys_all.append(y)
        law = getattr(fa, attr) if attr else None
        identified = law is not None and law.identified
        suffix = "" if law is None or identified else "; no law identified"
        ax.scatter(x, y, color=colors[name], s=28, zorder=3, label=f"{display_name(name)}{suffix}")
        if axis == "flops" and fa.branch_finals:
            bx = np.array([r.flops for r in fa.branch_finals], float)
            by = np.array([r.loss for r in fa.branch_finals])
            ax.scatter(bx, by, facecolors="white", edgecolors=colors[name], s=22, zorder=3,
                       label=f"{display_name(name)} cooldown branches")  # fmt: skip
            xs_all.append(bx)
            ys_all.append(by)
            env = fa.envelope
            if env is not None:
                how = "" if env.identified else " (N*(C) not identified)"
                ax.plot(env.flops, env.loss, color=colors[name], lw=1.4, alpha=0.8,
                        label=f"{display_name(name)} lowest loss at C{how}")  # fmt: skip
        if identified:
            x_right.append(x.max() * EXTRAPOLATE)
        elif x.size > 1:
            order = np.argsort(x)
            ax.plot(x[order], y[order], color=colors[name], lw=0.8, alpha=0.6)
    if not xs_all:
        return fig
    x_lim = log_limits(np.concatenate([*xs_all, x_right]) if x_right else np.concatenate(xs_all))
    for name, fa in report.families.items():
        law = getattr(fa, attr) if attr else None
        if law is not None and law.identified:
            var = "bits" if axis == "bits" else "N"
            label = f"{display_name(name)} fit: {_law_label(law, var)}"
            _draw_law(ax, law, "N", _final_x(report, fa, axis), colors[name], label)
    ax.set_xscale("log")
    ax.set_xlim(*x_lim)
    ax.set_ylim(*lin_limits(np.concatenate(ys_all)))
    _plain_minor_ticks(ax)
    xlabel = "non-embedding parameters" if report.config.x == "nonembedding_params" else "parameters N"
    ax.set_xlabel(AXIS_LABEL.get(axis, xlabel))
    what = {"params": "parameters", "bits": "size in bits", "flops": "training compute"}[axis]
    ax.set_title(f"Final {report.eval_name} vs {what}")
    ax.set_ylabel(f"{report.eval_name} (nats)")
    ax.grid(True, which="both", alpha=0.3)
    legend_outside(ax)
    if attr and any(
        getattr(fa, attr) is not None and getattr(fa, attr).identified for fa in report.families.values()
    ):
        fig.text(
            0.01,
            -0.04,
            "solid: fit over the data; dashed: at most one decade of extrapolation; band: bootstrap"
            f" {int(report.config.level * 100)}% interval (clipped to the axes)",
            fontsize=7,
            color="0.35",
        )
    return fig


def plot_loss_vs(report: Report, out_dir: Path, axis: str) -> dict[str, str]:
    return save(figure_loss_vs(report, axis), out_dir, f"loss_vs_{axis}")


def figure_training_curves(report: Report) -> Figure:
    """Loss against training tokens for every run, one panel per family: the schedule's events as vertical
    lines, cooldown branches thin from their branch point, identified L(D) fits (training dynamics along
    one run, not a scaling law) dashed over their own checkpoints only."""

    fams = list(report.families)
    ncols = min(3, len(fams))
    nrows = int(np.ceil(len(fams) / ncols))
    fig = Figure(figsize=(5.4 * ncols, 4.0 * nrows))
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
    all_params = [items[0].params for items in report.runs.values()]
    lp_lo, lp_hi = np.log(min(all_params)), np.log(max(all_params))
    cmap = colormaps["viridis"]
    for ax, name in zip(axes, fams):
        runs = sorted(
            (items for items in report.runs.values() if items[0].family == name),
            key=lambda items: (items[0].params, bool(items[-1].extra.get("parent")), items[-1].tokens),
        )
        labelled: set[str] = set()
        xs, ys = [], []
        events: dict[tuple[str, int], dict[str, Any]] = {}
        for items in runs:
            pts = [r for r in items if r.tokens > 0]
            if not pts:
                continue
            frac = 0.5 if lp_hi == lp_lo else (np.log(items[0].params) - lp_lo) / (lp_hi - lp_lo)
            color = cmap(0.1 + 0.8 * frac)
            d = np.array([r.tokens for r in pts])
            y = np.array([r.loss for r in pts])
            xs.append(d)
            ys.append(y)
            branch = bool(items[-1].extra.get("parent"))
            label = None if branch or items[0].size in labelled else items[0].size
            labelled.add(items[0].size)
            if branch:
                ax.plot(d, y, "-", lw=0.9, color=color, alpha=0.9)
                ax.plot(d[-1:], y[-1:], "o", ms=4, mfc="white", mec=color, zorder=3)
            else:
                ax.plot(d, y, "o-", ms=2.5, lw=1.2, color=color, label=label)
            law = report.run_fits.get(items[0].run)
            if law is not None and law.identified:
                fitted = law.inputs["D"]
                grid = np.geomspace(fitted.min(), fitted.max(), 100)
                ax.plot(grid, law.fit.predict(D=grid).value, "--", lw=1.0, color=color)
            for ev in report.events.get(items[0].run, []):
                events.setdefault((ev["name"], ev["tokens"]), ev)
        if not xs:
            ax.set_visible(False)
            continue
        x_lim = log_limits(np.concatenate(xs))
        for (ev_name, tokens), _ in sorted(events.items(), key=lambda kv: kv[0][1]):
            text, style = EVENT_STYLE.get(ev_name, (ev_name, ":"))
            if x_lim[0] < tokens < x_lim[1]:
                shown = text if text not in ax.get_legend_handles_labels()[1] else None
                ax.axvline(tokens, color="0.45", lw=0.9, ls=style, label=shown, zorder=1)
        ax.set_xscale("log")
        ax.set_xlim(*x_lim)
        ax.set_ylim(*lin_limits(np.concatenate(ys)))
        ax.set_xlabel("training tokens D")
        ax.set_ylabel(f"{report.eval_name} (nats)")
        title = f"{display_name(name)}: training curves"
        if any(bool(items[-1].extra.get("parent")) for items in runs):
            title += " (○: cooldown branch ends)"
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        _plain_minor_ticks(ax)
        legend_outside(ax, title="size", title_fontsize=7)
    for ax in axes[len(fams) :]:
        ax.set_visible(False)
    if report.run_fits and any(law.identified for law in report.run_fits.values()):
        fig.text(
            0.01,
            -0.04,
            "dashed: L(D) fitted along one run, over its own checkpoints (training dynamics, not a"
            " scaling law)",
            fontsize=7,
            color="0.35",
        )
    fig.tight_layout()
    return fig


def plot_training_curves(report: Report, out_dir: Path) -> dict[str, str]:
    return save(figure_training_curves(report), out_dir, "training_curves")


def draw_nd(
    ax: Any, law: FittedPoints, title: str, extra_points: Sequence[tuple[float, float, float]] = ()
) -> None:
    """Loss vs D coloured by N, with the fitted L(N, D) at each distinct N over the data's D range and at
    most one decade beyond (to the largest of ``extra_points``, (N, D, loss) shown as open circles)."""

    n, d = law.inputs["N"], law.inputs["D"]
    cmap = colormaps["plasma"]
    ln = np.log(n)
    span = max(ln.max() - ln.min(), 1e-12)
    ax.scatter(d, law.loss, c=[cmap(0.9 * (v - ln.min()) / span) for v in ln], s=16, zorder=3)
    d_hi = max([d.max(), *[p[1] for p in extra_points]])
    d_hi = min(d_hi, d.max() * EXTRAPOLATE)
    xs = np.geomspace(d.min(), d_hi, 120)
    for value in np.unique(n) if np.unique(n).size <= 12 else np.geomspace(n.min(), n.max(), 8):
        color = cmap(0.9 * (np.log(value) - ln.min()) / span)
        ys = law.fit.predict(N=np.full_like(xs, value), D=xs).value
        inside = xs <= d.max() * (1 + 1e-9)
        ax.plot(xs[inside], ys[inside], lw=1.0, color=color, label=f"N = {value:.3g}")
        ax.plot(xs[~inside], ys[~inside], lw=0.9, ls="--", color=color)
    ys_all = list(law.loss)
    for pn, pd, pl in extra_points:
        color = cmap(0.9 * (np.log(pn) - ln.min()) / span) if ln.min() <= np.log(pn) <= ln.max() else "0.3"
        ax.plot([pd], [pl], "o", mfc="white", mec=color, ms=6, zorder=4)
        ys_all.append(pl)
    ax.set_xscale("log")
    ax.set_xlim(*log_limits([d.min(), d_hi]))
    ax.set_ylim(*lin_limits(ys_all))
    _plain_minor_ticks(ax)
    ax.set_xlabel("training tokens D")
    ax.set_ylabel("loss (nats)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)


def figure_nd(report: Report) -> Figure | None:
    laws = [(name, fa.law_nd) for name, fa in report.families.items() if fa.law_nd and fa.law_nd.identified]
    if not laws:
        return None
    fig = Figure(figsize=(5.6 * len(laws) + 1.2, 4.4))
    axes = np.atleast_1d(fig.subplots(1, len(laws), squeeze=False)).ravel()
    for ax, (name, law) in zip(axes, laws):
        p = law.fit.params
        draw_nd(ax, law, f"{display_name(name)}: L(N, D), α={p['alpha']:.3g}, β={p['beta']:.3g}")
    legend_outside(axes[-1])
    fig.tight_layout()
    return fig


def plot_nd(report: Report, out_dir: Path) -> dict[str, str]:
    fig = figure_nd(report)
    return {} if fig is None else save(fig, out_dir, "loss_nd")


def write_all(report: Report, out_dir: Path) -> dict[str, str]:
    """Write every plot the report has data for; return ``{file name: path}``."""
    files: dict[str, str] = {}
    files.update(plot_loss_vs(report, out_dir, "params"))
    files.update(plot_loss_vs(report, out_dir, "bits"))
    if any(r.flops > 0 for fa in report.families.values() for r in fa.finals):
        files.update(plot_loss_vs(report, out_dir, "flops"))
    files.update(plot_training_curves(report, out_dir))
    files.update(plot_nd(report, out_dir))
    return files
