"""A fit is reported as a law only when the data identify it; otherwise every output says why, and the
numbers that show it, and no output prints or draws it as a law."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from tests.scaling.synthetic import SPECTRA_SIZES, synthetic_suite
from trilm.scaling import analyse, write_table
from trilm.scaling import plots as plots_module
from trilm.scaling.fitter import interval_reasons
from trilm.scaling.laws import get_law
from trilm.scaling.laws.base import new_lows
from trilm.suite.analyse import fit_lines, run_fit_lines, summary_text

FIVE = dict(list(SPECTRA_SIZES.items())[:5])
THREE = dict(list(SPECTRA_SIZES.items())[:3])
LAW = {"E": 1.8, "A": 400.0, "alpha": 0.3, "B": 600.0, "beta": 0.3}

# A printed law: "L(N) = 2.678e-11 + 3.373 / N^-0.02907   (α 95% CI [-0.0291, -0.0291])".
PRINTED_LAW = re.compile(
    r"L\((?P<var>N|N_nonemb|bits|D)\) = [-\d.e+]+ \+ [-\d.e+]+ / (?P=var)\^(?P<exp>[-\d.e+]+)"
    r"(?:\s+\([αβ] \d+% CI \[(?P<lo>[-\d.e+]+), (?P<hi>[-\d.e+]+)\]\))?"
)


def test_new_lows_counts_sizes_that_beat_every_smaller_one():
    assert new_lows(np.array([1, 2, 3]), np.array([4.894, 5.095, 5.085])) == 1
    assert new_lows(np.array([1, 2, 3, 4]), np.array([4.0, 3.9, 3.95, 3.8])) == 3
    assert new_lows(np.array([3, 1, 2]), np.array([1.0, 3.0, 2.0])) == 3
    assert new_lows(np.array([1, 1, 2]), np.array([5.0, 4.0, 4.5])) == 1  # lowest loss per x


def _rows(sizes, losses_by_family, checkpoints=4):
    rows = synthetic_suite({f: LAW for f in losses_by_family}, sizes=sizes, checkpoints=checkpoints, seed=1)
    out = []
    for r in rows:
        final = r.step == checkpoints * 1000
        losses = losses_by_family[r.family]
        if final and losses is not None:
            r = dataclasses.replace(r, loss=losses[list(sizes).index(r.size)])
        out.append(r)
    return out


def _all_text(report, out_dir) -> str:
    texts = [summary_text(report), "\n".join(fit_lines(report)), "\n".join(run_fit_lines(report))]
    texts.append((out_dir / "report.md").read_text())
    return "\n".join(texts)


def _assert_only_identified_laws_printed(text: str) -> int:
    printed = list(PRINTED_LAW.finditer(text))
    for m in printed:
        assert float(m["exp"]) > 0, m.group(0)
        if m["lo"] is not None:
            lo, hi = float(m["lo"]), float(m["hi"])
            assert 0 < lo < hi, m.group(0)
    return len(printed)


@pytest.fixture
def drawn(monkeypatch):
    """Labels of the fit curves the plots draw."""
    calls: list[str] = []
    original = plots_module._draw_law

    def record(ax, law, var, x, color, label, **kw):
        calls.append(label)
        return original(ax, law, var, x, color, label, **kw)

    monkeypatch.setattr(plots_module, "_draw_law", record)
    return calls


def test_a_clean_decrease_is_identified_printed_and_drawn(tmp_path, drawn):
    rows = synthetic_suite(
        {"floatlm": LAW, "trilm": {**LAW, "A": 900.0}}, sizes=FIVE, checkpoints=4, noise=0.002
    )
    report = analyse(write_table(tmp_path / "r.csv", rows), tmp_path / "out", bootstrap=200, seed=0)
    law = report.families["floatlm"].law_x
    assert law.identified and law.fit.reasons == ()
    text = _all_text(report, tmp_path / "out")
    assert _assert_only_identified_laws_printed(text) >= 4  # L(N) of both families in summary and report
    assert "not identified" not in "\n".join(fit_lines(report))
    assert sum("fit:" in label for label in drawn) == 4  # L(N) and L(bits) of two families
    assert [c["axis"] for c in report.comparisons].count("params") == 1


def test_the_quickstart_losses_of_issue_21_are_not_a_law(tmp_path, drawn):
    """Smallest model best: FloatLM 4.894, 5.095, 5.085; TriLM rising. Three sizes, α ≤ 0."""
    losses = {"floatlm": [4.894, 5.095, 5.085], "trilm": [5.10, 5.16, 5.22]}
    report = analyse(write_table(tmp_path / "r.csv", _rows(THREE, losses)), tmp_path / "out", bootstrap=200)
    for fam in losses:
        law = report.families[fam].law_x
        assert not law.identified
        assert any("new low at only 1 of 3 sizes" in r for r in law.fit.reasons)
        assert any("3 sizes for 3 parameters (an exact fit" in r for r in law.fit.reasons)
    text = _all_text(report, tmp_path / "out")
    assert _assert_only_identified_laws_printed(text) == 0
    lines = "\n".join(fit_lines(report))
    assert (
        "FloatLM  L(N) not identified:" in lines
        and "loss by size: 99M 4.8940, 190M 5.0950, 390M 5.0850" in lines
    )
    assert "### Not identified" in (tmp_path / "out" / "report.md").read_text()
    assert not [label for label in drawn if "fit:" in label]
    assert [c["axis"] for c in report.comparisons] == ["observed"]
    assert any("is not identified, so no size is matched" in n for n in report.notes)


def test_three_decreasing_sizes_fit_exactly_and_get_a_zero_width_interval(tmp_path):
    losses = {"floatlm": [4.2, 4.0, 3.9]}
    report = analyse(write_table(tmp_path / "r.csv", _rows(THREE, losses)), None, bootstrap=100)
    law = report.families["floatlm"].law_x
    assert law.fit.params["alpha"] > 0
    lo, hi = law.fit.param_intervals()["alpha"]
    assert hi - lo < 1e-6  # every usable resample redraws the same three sizes
    assert not law.identified
    assert any("zero-width alpha interval" in r for r in law.fit.reasons)
    assert _assert_only_identified_laws_printed(summary_text(report)) == 0


def test_an_interval_reaching_zero_is_not_a_law(tmp_path):
    losses = {"floatlm": [4.30, 4.20, 4.25, 4.10, 4.19]}  # new lows at 3 sizes, but no clear trend
    report = analyse(write_table(tmp_path / "r.csv", _rows(FIVE, losses)), tmp_path / "o", bootstrap=300)
    law = report.families["floatlm"].law_x
    reasons = " ".join(law.fit.reasons)
    assert not law.identified and any(k in reasons for k in ("reaches 0", "≤ 0", "a step")), reasons
    assert _assert_only_identified_laws_printed(_all_text(report, tmp_path / "o")) == 0


def test_l_of_d_along_each_run_is_reported_where_identified(tmp_path):
    rows = synthetic_suite({"floatlm": LAW}, sizes=FIVE, checkpoints=6, noise=0.001)
    flat = [
        dataclasses.replace(r, loss=5.0 + 0.001 * (r.step % 2000)) if r.size == "99M" else r for r in rows
    ]
    report = analyse(write_table(tmp_path / "r.csv", flat), tmp_path / "o", bootstrap=0)
    identified = {run for run, law in report.run_fits.items() if law.identified}
    assert identified == {f"floatlm-{s}" for s in FIVE if s != "99M"}
    lines = run_fit_lines(report)
    assert "identified in 4 of 5 runs" in lines[0]
    assert any(line.startswith("not identified: floatlm-99M:") for line in lines)
    assert _assert_only_identified_laws_printed(_all_text(report, tmp_path / "o")) >= 0


def test_identify_reads_the_bootstrap_of_every_exponent(tmp_path):
    rows = synthetic_suite({"floatlm": LAW}, sizes=FIVE, checkpoints=1, noise=0.001)
    report = analyse(write_table(tmp_path / "r.csv", rows), None, bootstrap=100, loso=False)
    law = report.families["floatlm"].law_x
    assert law.identified and interval_reasons(get_law("n"), law.fit, exact=False, loss=law.loss) == []
    tiled = np.tile(law.fit.theta, (len(law.fit.boot_thetas), 1))
    degenerate = dataclasses.replace(law.fit, boot_thetas=tiled)
    assert any("zero-width alpha interval" in r for r in interval_reasons(get_law("n"), degenerate, False))


def test_a_zero_width_interval_of_exact_data_is_certainty_not_degeneracy(tmp_path):
    rows = synthetic_suite({"floatlm": LAW}, sizes=FIVE, checkpoints=1, noise=0.0)
    law = (
        analyse(write_table(tmp_path / "r.csv", rows), None, bootstrap=50, loso=False)
        .families["floatlm"]
        .law_x
    )
    lo, hi = law.fit.param_intervals()["alpha"]
    assert hi - lo < 1e-6 and law.identified


def test_the_summary_says_where_loss_does_not_fall_with_size(tmp_path):
    from trilm.suite.analyse import ordering_lines

    losses = {"floatlm": [4.894, 5.095, 5.085], "trilm": [5.3, 5.2, 5.1]}
    report = analyse(write_table(tmp_path / "r.csv", _rows(THREE, losses)), None, bootstrap=0)
    lines = ordering_lines(report)
    assert lines[0] == " FloatLM  loss does not fall at 99M → 190M (+0.2010)"
    assert lines[1] == "   TriLM  loss falls at every step up in size"


def test_l_of_d_after_warm_up_and_a_collapsed_e_is_not_a_law(tmp_path):
    rows = synthetic_suite({"floatlm": LAW}, sizes=FIVE, checkpoints=8, noise=0.0)
    report = analyse(write_table(tmp_path / "r.csv", rows), None, bootstrap=0, d_from=0.05)
    law = report.run_fits["floatlm-99M"]
    assert law.fit.n_points == 6 and law.identified  # log-spaced from 1/64 of the budget: two below 0.05
    assert any("L(D) from D = " in n and "2 earlier checkpoint(s) left out" in n for n in report.notes)
    d = get_law("d")
    bare = d.theta({**law.fit.params, "E": 1e-12})
    reasons = d.plausibility(bare, d.design(law.data), law.loss)
    assert "E = 1e-12 ≈ 0 (the irreducible loss is not identified)" in reasons
