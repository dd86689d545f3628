"""Plots a person can read, and fits that are not physical kept out of them: the quickstart's numbers of
2026-12-02 (``quickstart_fixture``) rendered through every figure, with the axis limits checked against the
data, the legends checked to sit outside the axes, and its implausible fits checked not to be laws."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from tests.scaling import quickstart_fixture as qs
from tests.scaling.synthetic import SPECTRA_SIZES, synthetic_suite
from trilm.scaling import analyse, plots, write_table
from trilm.scaling.laws import get_law
from trilm.suite.analyse import run_fit_lines, summary_text


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    table = write_table(tmp_path_factory.mktemp("qs") / "results.csv", qs.rows())
    return analyse(table, None, bootstrap=200, seed=0, x="nonembedding_params", d_from=0.3)


def _within(limits, values, *, log: bool, extra: float = 1.0):
    """The limits contain the values, with a margin no wider than 25 % of their span (a factor ``extra``
    more on the upper side of a log axis, for one decade of extrapolation)."""
    v = np.asarray(values, float)
    lo, hi = limits
    if log:
        span = np.log10(v.max() / v.min())
        slack = 0.25 * span + 0.1
        assert lo <= v.min() and hi >= v.max()
        assert np.log10(v.min() / lo) <= slack
        assert np.log10(hi / (v.max() * extra)) <= slack
    else:
        span = v.max() - v.min()
        assert lo <= v.min() and hi >= v.max()
        assert v.min() - lo <= 0.25 * span + 1e-9 and hi - v.max() <= 0.25 * span + 1e-9


def _legend_outside(fig, ax):
    FigureCanvasAgg(fig).draw()
    legend = ax.get_legend()
    if legend is None:
        return
    box, area = legend.get_window_extent(), ax.get_window_extent()
    assert box.x0 >= area.x1, "the legend overlaps the axes"


def test_the_quickstart_fits_that_are_not_physical_are_not_laws(report):
    fits = report.run_fits
    for run in ("floatlm-96x3", "floatlm-128x4"):
        law = fits[run]
        assert law.fit.params["E"] == pytest.approx(qs.FLOATLM_LD[run.split("-")[1]][0], abs=0.02)
        assert not law.identified
        assert any("E rises with N in the family" in r for r in law.fit.reasons)
    text = "\n".join(run_fit_lines(report))
    assert "training dynamics, not a scaling law" in text
    rows = [line for line in text.splitlines() if line.startswith(("floatlm-96x3", "floatlm-128x4"))]
    assert not rows, "an implausible L(D) fit is tabled as identified"
    summary = summary_text(report)
    assert "not identified: floatlm-96x3: " in summary and "E rises with N" in summary


def test_the_quickstart_floatlm_law_whose_floor_is_its_last_point_is_not_a_law(report):
    """The quickstart printed FloatLM's L(N) with E = 4.197 against 4.1996 at 128x4, then TriLM 128x4 "below
    any loss the FloatLM fit reaches": a floor the largest model already touches is that model's loss."""
    law = report.families["floatlm"].law_x
    assert law.fit.params["E"] == pytest.approx(4.197, abs=0.01)
    assert not law.identified
    assert any("E interval" in r and "reaches the lowest loss, 4.1996" in r for r in law.fit.reasons)
    for fam in ("trilm", "bilm"):  # floors clear of their lowest points stay laws
        assert report.families[fam].law_x.identified, report.families[fam].law_x.fit.reasons
    summary = summary_text(report, comparison_caveat="this budget orders the families otherwise")
    assert "below any loss the FloatLM fit reaches" not in summary
    assert "FloatLM  L(N_nonemb) = " not in summary
    heading = summary.splitlines().index("family comparison (fitted curves):")
    assert summary.splitlines()[heading + 1] == "  note: this budget orders the families otherwise"
    bare = summary_text(dataclasses.replace(report, comparisons=[]), comparison_caveat="this budget")
    assert bare.splitlines()[-1] == "note: this budget"  # no comparison to head: the caveat still prints
    # 154× BiLM's parameters, as the fit would say, lies beyond one decade of BiLM's data: not read off
    assert "154×" not in summary
    assert "TriLM 128x4       853k: loss 4.1674 — below the BiLM fit up to 10× its largest model" in summary


def _reasons(name: str, params: dict, inputs: dict, loss) -> list[str]:
    """Why the law ``name`` with ``params`` is not a law on these points (empty: it is)."""
    law = get_law(name)
    data = {**{k: np.asarray(v, float) for k, v in inputs.items()}, "loss": np.asarray(loss, float)}
    return law.plausibility(law.theta(params), law.design(data), data["loss"])


def test_exponents_and_coefficients_at_the_edge_of_the_search_box_are_not_laws():
    d = np.array([1.6e5, 2.0e5, 2.6e5, 3.3e5, 3.9e5, 5.2e5])
    step = qs.STEP_LIKE
    assert _reasons("d", step, {"D": d}, step["E"] + step["B"] / d ** step["beta"])  # β = 2.53 > 2
    n = np.array([3.3e4, 1.07e5, 3.3e5, 8.5e5])
    bits = {"E": 4.19, "A": 2e9, "alpha": qs.FLOATLM_BITS_ALPHA}
    assert any("> 2" in r for r in _reasons("n", bits, {"N": n * 16}, [4.62, 4.28, 4.22, 4.2]))
    pinned = _reasons("n", {"E": 4.0, "A": 1e8, "alpha": 1.99}, {"N": n}, [4.9, 4.05, 4.0, 4.0])
    assert any("pinned at the top of the search box" in r for r in pinned)
    huge = {"E": 4.0, "A": np.exp(24.8), "alpha": 1.6}
    assert any(
        "ln A = 24.8 is at or outside the edge" in r
        for r in _reasons("n", huge, {"N": n}, [4.9, 4.2, 4.02, 4.0])
    )
    nothing = {"E": 3.5, "A": 1e-3, "alpha": 0.5, "B": 300.0, "beta": 0.4}
    nn, dd = np.meshgrid(n, d)
    loss = nothing["E"] + nothing["A"] / nn**0.5 + nothing["B"] / dd**0.4
    nd = _reasons("additive", nothing, {"N": nn.ravel(), "D": dd.ravel()}, loss.ravel())
    assert any("term 1 of E + A/N^α + B/D^β is below" in r for r in nd)
    good = {"E": 3.4, "A": 80.0, "alpha": 0.46}
    assert _reasons("n", good, {"N": n}, 3.4 + 80 / n**0.46) == []


@pytest.mark.parametrize("axis", ["params", "bits", "flops"])
def test_loss_plots_are_bounded_by_the_data(report, axis):
    fig = plots.figure_loss_vs(report, axis)
    ax = fig.axes[0]
    xs = {"params": "nonembedding_params", "bits": None, "flops": "flops"}[axis]
    x = [getattr(r, xs) if xs else r.model_bits for fa in report.families.values() for r in fa.finals]
    y = [r.loss for fa in report.families.values() for r in fa.finals]
    drawn = any(
        getattr(fa, {"params": "law_x", "bits": "law_bits"}.get(axis, "law_x")).identified
        for fa in report.families.values()
        if axis != "flops"
    )
    _within(ax.get_xlim(), x, log=True, extra=plots.EXTRAPOLATE if drawn else 1.0)
    _within(ax.get_ylim(), y, log=False)
    assert ax.get_ylim()[1] < 5.0  # not the 25 nats the BiLM band reached when extrapolated
    _legend_outside(fig, ax)


def test_training_curves_are_bounded_by_the_checkpoints_and_mark_the_events(report):
    events = {run: [{"name": "warmup_end", "step": 154, "tokens": 154 * 1024}] for run in report.runs}
    marked = dataclasses.replace(report, events=events)
    fig = plots.figure_training_curves(marked)
    for ax, fam in zip(fig.axes, report.families):
        pts = [r for items in report.runs.values() if items[0].family == fam for r in items if r.tokens > 0]
        _within(ax.get_xlim(), [r.tokens for r in pts], log=True)
        _within(ax.get_ylim(), [r.loss for r in pts], log=False)
        assert ax.get_ylim()[1] < 10  # the dashed L(D) curves once reached 8,000 nats here
        assert "warm-up ends" in ax.get_legend_handles_labels()[1]
        _legend_outside(fig, ax)


def test_the_nd_plot_extrapolates_at_most_one_decade(tmp_path):
    law = {"E": 1.8, "A": 400.0, "alpha": 0.3, "B": 600.0, "beta": 0.3}
    sizes = dict(list(SPECTRA_SIZES.items())[:5])
    rows = synthetic_suite(
        {"floatlm": law}, sizes=sizes, tokens=[2e10, 8e10, 3e11], checkpoints=2, noise=0.002
    )
    nd_report = analyse(write_table(tmp_path / "r.csv", rows), None, form="ND", bootstrap=0, loso=False)
    fitted = nd_report.families["floatlm"].law_nd
    fig = plots.Figure(figsize=(6, 4))
    ax = fig.subplots()
    plots.draw_nd(ax, fitted, "L(N, D)", extra_points=[(fitted.inputs["N"].max(), 1e14, 2.0)])
    d = fitted.inputs["D"]
    assert ax.get_xlim()[1] <= d.max() * plots.EXTRAPOLATE * 1.6
    _within(ax.get_ylim(), [*fitted.loss, 2.0], log=False)


def test_a_loss_under_the_reference_floor_is_said_with_the_floor_and_its_interval():
    """The quickstart of 2026-12-03: BiLM's L(N) floor E = 4.184 and TriLM 128x4 at 4.1604. "Below any loss
    the BiLM fit reaches" claimed more than an E with an interval can carry."""
    from trilm.suite.analyse import _below_floor

    wide = {"reference_E": 4.184, "reference_E_interval": [4.150, 4.200], "level": 0.95}
    assert _below_floor("BiLM", 4.1604, wide) == (
        "below the BiLM fit's floor E = 4.1840, but inside its 95% interval [4.1500, 4.2000]: not settled"
    )
    tight = {**wide, "reference_E_interval": [4.170, 4.195]}
    assert _below_floor("BiLM", 4.1604, tight).endswith("and its 95% interval [4.1700, 4.1950]")
    assert _below_floor("BiLM", 4.1604, {"reference_E": 4.184}) == "below the BiLM fit's floor E = 4.1840"
