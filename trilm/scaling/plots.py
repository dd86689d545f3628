"""Plots of a scaling analysis, as PNG and SVG: loss vs parameters and vs size in bits with fits and bootstrap
bands, training curves per run, and the L(N, D) surface sliced per model size.

Figures are built on :class:`matplotlib.figure.Figure` directly (no pyplot state, no backend switch), so
this works headless and inside other programs.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from matplotlib.figure import Figure

from trilm.families import display_name
from trilm.scaling.table import family_kind

if TYPE_CHECKING:
    from trilm.scaling.results import LawFit, Report

KIND_COLORS = {"floatlm": "tab:blue", "trilm": "tab:red", "bilm": "tab:green"}
OTHER_COLORS = ["tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan", "tab:gray", "tab:orange"]


def family_colors(families: list[str]) -> dict[str, str]:
    out, spare = {}, iter(OTHER_COLORS * 4)
    for f in families:
        out[f] = KIND_COLORS.get(family_kind(f)) or next(spare)
    return out


def _plain_minor_ticks(ax: Any) -> None:
    """No labels on minor log ticks: over one or two decades matplotlib labels them and they collide."""
    from matplotlib.ticker import NullFormatter

    ax.xaxis.set_minor_formatter(NullFormatter())


def _save(fig: Figure, out_dir: Path, stem: str) -> dict[str, str]:
    files = {}
    for ext in ("png", "svg"):
        path = out_dir / f"{stem}.{ext}"
        fig.savefig(path, dpi=150 if ext == "png" else None, bbox_inches="tight")
        files[f"{stem}.{ext}"] = str(path)
    return files


def _law_label(law: LawFit, var: str) -> str:
    p = law.fit.params
    coef, exp = ("A", "alpha") if "A" in p else ("B", "beta")
    return f"E={p['E']:.3g} + {p[coef]:.3g}/{var}^{p[exp]:.3g}"


def _draw_law(
    ax: Any,
    law: LawFit,
    var: str,
    x_data: np.ndarray,
    color: str,
    label: str,
    *,
    extend: tuple[float, float] = (0.5, 4.0),
) -> None:
    """Fit curve (solid over the data, dashed beyond) and the bootstrap band, over an extended x range."""
    lo, hi = x_data.min() * extend[0], x_data.max() * extend[1]
    xs = np.geomspace(lo, hi, 200)
    ys = law.fit.predict(**{var: xs})
    inside = (xs >= x_data.min()) & (xs <= x_data.max())
    ax.plot(xs[inside], ys[inside], color=color, lw=1.8, label=label)
    ax.plot(xs, np.where(inside, np.nan, ys), color=color, lw=1.2, ls="--")
    if law.bootstrap is not None and law.bootstrap.n_ok >= 10:
        band_lo, band_hi = law.bootstrap.band(**{var: xs})
        ax.fill_between(xs, band_lo, band_hi, color=color, alpha=0.15, lw=0)


def plot_loss_vs(report: Report, out_dir: Path, axis: str) -> dict[str, str]:
    """Final loss per family against parameters (``axis="params"``) or model size in bits (``"bits"``)."""
    fig = Figure(figsize=(7.5, 5.0))
    ax = fig.subplots()
    colors = family_colors(list(report.families))
    attr = "law_x" if axis == "params" else "law_bits"
    for name, fa in report.families.items():
        x = np.array(
            [getattr(r, report.config.x) if axis == "params" else r.model_bits for r in fa.finals], float
        )
        y = np.array([r.loss for r in fa.finals])
        color = colors[name]
        law = getattr(fa, attr)
        identified = law is not None and law.identified
        suffix = "" if law is None or identified else "; no law identified"
        ax.scatter(
            x, y, color=color, s=28, zorder=3, label=f"{display_name(name)} (final checkpoints{suffix})"
        )
        if identified:
            var = "bits" if axis == "bits" else "N"
            _draw_law(ax, law, "N", x, color, f"{display_name(name)} fit: {_law_label(law, var)}")
        elif x.size > 1:
            order = np.argsort(x)
            ax.plot(x[order], y[order], color=color, lw=0.8, alpha=0.6)
    ax.set_xscale("log")
    _plain_minor_ticks(ax)
    if axis == "params":
        ax.set_xlabel(
            "non-embedding parameters" if report.config.x == "nonembedding_params" else "parameters N"
        )
        ax.set_title(f"Final {report.eval_name} vs model parameters")
    else:
        ax.set_xlabel("model size in bits (params × bits/param)")
        ax.set_title(f"Final {report.eval_name} vs model size in bits")
    ax.set_ylabel(f"{report.eval_name} (nats)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper right")
    if any(getattr(fa, attr) is not None and getattr(fa, attr).identified for fa in report.families.values()):
        fig.text(
            0.01,
            0.0,
            "solid: fit over the data, dashed: extrapolation, band: bootstrap "
            f"{int(report.config.level * 100)}% interval",
            fontsize=7,
            color="0.35",
        )
    return _save(fig, out_dir, f"loss_vs_{axis}")


def plot_training_curves(report: Report, out_dir: Path) -> dict[str, str]:
    """Loss against training tokens for every run, one panel per family, with the L(D) fits dashed."""
    fams = list(report.families)
    ncols = min(3, len(fams))
    nrows = int(np.ceil(len(fams) / ncols))
    fig = Figure(figsize=(5.2 * ncols, 3.9 * nrows))
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
    all_params = [items[0].params for items in report.runs.values()]
    lp_lo, lp_hi = np.log(min(all_params)), np.log(max(all_params))
    from matplotlib import colormaps

    cmap = colormaps["viridis"]
    for ax, name in zip(axes, fams):
        runs = sorted(
            (items for items in report.runs.values() if items[0].family == name),
            key=lambda items: (items[0].params, items[-1].tokens),
        )
        labelled: set[str] = set()
        for items in runs:
            pts = [r for r in items if r.tokens > 0]
            if not pts:
                continue
            frac = 0.5 if lp_hi == lp_lo else (np.log(items[0].params) - lp_lo) / (lp_hi - lp_lo)
            color = cmap(0.1 + 0.8 * frac)
            d = np.array([r.tokens for r in pts])
            # One legend entry per size: runs of one size (other token budgets) share its colour.
            label = None if items[0].size in labelled else items[0].size
            labelled.add(items[0].size)
            ax.plot(d, [r.loss for r in pts], "o-", ms=3, lw=1.2, color=color, label=label)
            law = report.run_fits.get(items[0].run)
            if law is not None and law.identified:
                xs = np.geomspace(d.min(), d.max(), 100)
                ax.plot(xs, law.fit.predict(D=xs), "--", lw=1.0, color=color)
        ax.set_xscale("log")
        ax.set_xlabel("training tokens D")
        ax.set_ylabel(f"{report.eval_name} (nats)")
        ax.set_title(f"{display_name(name)}: training curves (dashed: identified L(D) fits)", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        _plain_minor_ticks(ax)
        ax.legend(fontsize=6, ncol=2 if len(labelled) > 6 else 1, title="size", title_fontsize=6)
    for ax in axes[len(fams) :]:
        ax.set_visible(False)
    fig.tight_layout()
    return _save(fig, out_dir, "training_curves")


def draw_nd(ax: Any, law: LawFit, title: str) -> None:
    """Loss vs D coloured by N, with the fitted L(N, D) at each distinct N as a line."""
    from matplotlib import colormaps

    n, d = law.inputs["N"], law.inputs["D"]
    cmap = colormaps["plasma"]
    ln = np.log(n)
    span = max(ln.max() - ln.min(), 1e-12)
    sc = ax.scatter(d, law.loss, c=ln / np.log(10), cmap=cmap, s=14, zorder=3)
    distinct = np.unique(n)
    shown = distinct if distinct.size <= 12 else np.geomspace(n.min(), n.max(), 8)
    xs = np.geomspace(d.min() * 0.7, d.max() * 1.4, 120)
    for value in shown:
        ax.plot(
            xs,
            law.fit.predict(N=np.full_like(xs, value), D=xs),
            lw=0.9,
            color=cmap(0.9 * (np.log(value) - ln.min()) / span),
        )
    ax.set_xscale("log")
    _plain_minor_ticks(ax)
    ax.set_xlabel("training tokens D")
    ax.set_ylabel("loss (nats)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.figure.colorbar(sc, ax=ax, label="log10 N")


def plot_nd(report: Report, out_dir: Path) -> dict[str, str]:
    laws = [(name, fa.law_nd) for name, fa in report.families.items() if fa.law_nd and fa.law_nd.identified]
    if not laws:
        return {}
    fig = Figure(figsize=(6.2 * len(laws), 4.6))
    axes = np.atleast_1d(fig.subplots(1, len(laws), squeeze=False)).ravel()
    for ax, (name, law) in zip(axes, laws):
        p = law.fit.params
        draw_nd(ax, law, f"{display_name(name)}: L(N, D), α={p['alpha']:.3g}, β={p['beta']:.3g}")
    fig.tight_layout()
    return _save(fig, out_dir, "loss_nd")


def write_all(report: Report, out_dir: Path) -> dict[str, str]:
    """Write every plot the report has data for; return ``{file name: path}``."""
    files: dict[str, str] = {}
    files.update(plot_loss_vs(report, out_dir, "params"))
    files.update(plot_loss_vs(report, out_dir, "bits"))
    files.update(plot_training_curves(report, out_dir))
    files.update(plot_nd(report, out_dir))
    return files
