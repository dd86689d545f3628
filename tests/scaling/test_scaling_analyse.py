"""``analyse`` and ``trilm scaling``: one call from a results table to fit.json, report.md and plots."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from tests.scaling.synthetic import SPECTRA_SIZES, synthetic_suite
from trilm.cli import main
from trilm.scaling import FitError, analyse, read_table, write_table

LAWS = {
    "floatlm": {"E": 1.75, "A": 300.0, "alpha": 0.3, "B": 600.0, "beta": 0.3},
    "trilm": {"E": 1.8, "A": 1500.0, "alpha": 0.36, "B": 600.0, "beta": 0.3},
}
SIX = dict(list(SPECTRA_SIZES.items())[:6])
TINY = {"tiny": (2.0e5, 1.0e5, 0.9e5), "small": (8.0e5, 5.0e5, 2.5e5)}


def _assert_plot(path):
    assert path.is_file(), path
    data = path.read_bytes()
    if path.suffix == ".png":
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    else:
        assert b"<svg" in data[:1000] and len(data) > 10_000


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    out = tmp_path_factory.mktemp("suite")
    rows = synthetic_suite(LAWS, sizes=SIX, checkpoints=4, noise=0.004, seed=3)
    table = write_table(out / "results.csv", rows)
    return table, analyse([table], out / "scaling", bootstrap=100, seed=0)


def test_suite_fits_report_and_plots(suite):
    table, report = suite
    out = table.parent / "scaling"
    for stem in ("loss_vs_params", "loss_vs_bits", "training_curves"):
        _assert_plot(out / f"{stem}.png")
        _assert_plot(out / f"{stem}.svg")
    data = json.loads((out / "fit.json").read_text())
    for family in LAWS:
        law = data["families"][family]["L(x)"]
        assert law["law"] == "n" and set(law["params"]) == {"E", "A", "alpha"}
        assert law["status"].startswith("converged")
        assert len(law["log_residuals"]) == len(SIX)
        boot = law["bootstrap"]
        assert boot["n_resamples"] == 100 and boot["seed"] == 0
        assert len(law["boot_thetas"]) == boot["n_accepted"]
        for name, value in law["params"].items():
            lo, hi = law["param_intervals"][name]
            assert lo <= value <= hi, (family, name)
            assert law["param_se"][name] > 0, (family, name)
        assert len(law["leave_one_size_out"]) == len(SIX)
        assert data["families"][family]["L(bits)"]["status"].startswith("converged")
    assert len(data["runs_L(D)"]) == 2 * len(SIX)
    axes = sorted(c["axis"] for c in data["comparisons"])
    assert axes == ["bits", "observed", "params"]
    text = (out / "report.md").read_text()
    for heading in ("## Fits", "### Leave-one-size-out", "## Family comparison", "![loss_vs_bits.png]"):
        assert heading in text
    assert report.families["trilm"].law_x.fit.params["alpha"] > 0


def test_separate_token_budgets_give_an_nd_fit(tmp_path):
    rows = synthetic_suite(
        {"floatlm": LAWS["floatlm"]}, sizes=SIX, tokens=[2e10, 8e10, 3e11], checkpoints=2, noise=0.002
    )
    table = write_table(tmp_path / "r.jsonl", rows)
    report = analyse(table, tmp_path / "out", form="ND", bootstrap=50, loso=False)
    nd = report.families["floatlm"].law_nd
    assert nd is not None and nd.fit.n_points == 18
    assert nd.fit.params["alpha"] == pytest.approx(0.3, rel=0.1)
    assert nd.fit.params["beta"] == pytest.approx(0.3, rel=0.1)
    _assert_plot(tmp_path / "out" / "loss_nd.png")


def _tiny_table(path):
    rows = synthetic_suite(
        {"floatlm": {"E": 3.0, "A": 50, "alpha": 0.3, "B": 200, "beta": 0.3}, "trilm": LAWS["trilm"]},
        sizes=TINY,
        tokens=2e6,
        checkpoints=4,
        noise=0.003,
    )
    rows += [dataclasses.replace(r, step=0, tokens=0.0, flops=0.0, loss=10.8) for r in rows if r.step == 1000]
    return write_table(path, rows)


def test_tiny_suite_in_auto_mode_notes_what_it_skips(tmp_path):
    table = _tiny_table(tmp_path / "results.json")
    report = analyse(table, tmp_path / "out", bootstrap=50)
    assert all(fa.law_x is None for fa in report.families.values())
    assert sorted(report.run_fits) == ["floatlm-small", "floatlm-tiny", "trilm-small", "trilm-tiny"]
    assert any("L(N) not fitted: it needs final checkpoints of at least 3 sizes" in n for n in report.notes)
    assert any("checkpoint(s) at D = 0 left out of L(D)" in n for n in report.notes)
    observed = [c for c in report.comparisons if c["axis"] == "observed"]
    assert [r["size"] for r in observed[0]["shared_sizes"]] == ["tiny", "small"]
    for stem in ("loss_vs_params", "loss_vs_bits", "training_curves"):
        _assert_plot(tmp_path / "out" / f"{stem}.png")
    assert "## Notes" in (tmp_path / "out" / "report.md").read_text()


def test_explicit_form_is_strict_about_a_family_with_too_few_sizes(tmp_path):
    table = _tiny_table(tmp_path / "results.csv")
    with pytest.raises(FitError, match=r"family floatlm: L\(N\) not fitted.*has 2 \(tiny, small\)"):
        analyse(table, None, form="N", bootstrap=0)
    rows = [r for r in read_table(table) if r.size == "tiny"]
    one = write_table(tmp_path / "one.csv", rows)
    with pytest.raises(FitError, match=r"has 1 \(tiny\)"):
        analyse(one, None, form="N", bootstrap=0)


def test_eval_choice_and_inconsistent_runs_are_errors(tmp_path):
    rows = synthetic_suite({"floatlm": LAWS["floatlm"]}, sizes=SIX, checkpoints=1)
    other = [dataclasses.replace(r, eval="wikitext") for r in rows]
    table = write_table(tmp_path / "r.csv", [dataclasses.replace(r, eval="c4") for r in rows] + other)
    with pytest.raises(FitError, match="several evaluations \\(c4, wikitext\\); choose one with --eval"):
        analyse(table, None, bootstrap=0)
    assert analyse(table, None, eval="wikitext", bootstrap=0, loso=False).eval_name == "wikitext"
    bad = write_table(tmp_path / "bad.csv", [*rows, dataclasses.replace(rows[0], step=7, family="trilm")])
    with pytest.raises(FitError, match="run 'floatlm-99M' has rows with different family"):
        analyse(bad, None, bootstrap=0)


def test_cli_fit_writes_everything(tmp_path, capsys):
    table = write_table(
        tmp_path / "results.csv", synthetic_suite(LAWS, sizes=SIX, checkpoints=3, noise=0.003)
    )
    rc = main(["scaling", "fit", str(table), "--out", str(tmp_path / "o"), "--bootstrap", "30", "--no-loso"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "fit(s) over 2 families" in printed and "report.md" in printed
    for name in ("fit.json", "report.md", "loss_vs_params.svg", "training_curves.png"):
        assert (tmp_path / "o" / name).stat().st_size > 0


def test_cli_bad_input_exits_2_with_the_location(tmp_path, capsys):
    rows = synthetic_suite(LAWS, sizes=SIX, checkpoints=1)
    table = write_table(tmp_path / "results.csv", rows)
    lines = table.read_text().splitlines()
    lines[3] = lines[3].rsplit(",", 1)[0] + ",nan"
    table.write_text("\n".join(lines) + "\n")
    assert main(["scaling", "fit", str(table), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "results.csv line 4, column 'loss': 'nan' is not a finite number" in err
    assert not (tmp_path / "o").exists()


def test_report_numbers_agree_with_fit_json(suite):
    table, report = suite
    data = json.loads((table.parent / "scaling" / "fit.json").read_text())
    alpha = data["families"]["floatlm"]["L(x)"]["params"]["alpha"]
    assert alpha == report.families["floatlm"].law_x.fit.params["alpha"]
    assert f"{alpha:.4g}" in (table.parent / "scaling" / "report.md").read_text()
    assert np.isfinite(alpha)


def test_a_fit_that_does_not_decrease_is_not_used_to_match_sizes(tmp_path):
    """When a family's loss grows with size its fitted α ≤ 0: sizes are not matched through that curve."""
    rows = synthetic_suite(LAWS, sizes=dict(list(SPECTRA_SIZES.items())[:4]), checkpoints=1, noise=0.0)
    floats = sorted((r for r in rows if r.family == "floatlm"), key=lambda r: r.params)
    rising = {id(r): 3.0 + 0.05 * i for i, r in enumerate(floats)}
    rows = [dataclasses.replace(r, loss=rising[id(r)]) if id(r) in rising else r for r in rows]
    report = analyse(write_table(tmp_path / "results.csv", rows), tmp_path / "out", bootstrap=0, plots=False)
    assert report.families["floatlm"].law_x.fit.params["alpha"] <= 0
    assert not [c for c in report.comparisons if c["axis"] in ("params", "bits")]
    assert any("the L(x) of floatlm is not identified" in n for n in report.notes)
    assert [c["axis"] for c in report.comparisons] == ["observed"]
