"""The cooldown experiment's report (trilm/scaling/heldout.py, cooldown_diagnosis.py) on rows drawn from a
known L(N, D): fitted on the branches at <= 1/2 of the budget, it must predict the runs' own ends, and the
fresh-run and decay-stage tables must pair and difference the right rows."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from trilm.scaling.cooldown_diagnosis import (
    alternatives,
    markdown,
    rerun_differences,
    rerun_markdown,
    size_gaps,
)
from trilm.scaling.heldout import (
    NAMES,
    TARGET,
    fit_and_predict,
    fresh_comparison,
    predict_separate,
    rate_drop,
)
from trilm.scaling.kaplan import kaplan_loss
from trilm.scaling.table import ResultRow

E, A, ALPHA, B, BETA = 3.2, 400.0, 0.5, 900.0, 0.45
BUDGET = 2_097_152
SIZES = {"32x2": 32_928, "64x2": 106_752, "96x3": 332_064, "128x4": 852_480}


def law(n: float, d: float) -> float:
    return E + A / n**ALPHA + B / d**BETA


def row(run: str, family: str, size: str, tokens: float, step: int, loss: float, **extra) -> ResultRow:
    n = SIZES[size]
    return ResultRow.from_counts(
        run=run, family=family, size=size, params=n + 131_072, nonembedding_params=n, linear_params=n,
        tokens=tokens, flops=6.0 * n * tokens, step=step, eval="val_loss", loss=loss, **extra,
    )  # fmt: skip


def suite_rows(noise: float = 0.0) -> list[ResultRow]:
    rng = np.random.default_rng(0)
    rows = []
    for size, n in SIZES.items():
        parent = f"floatlm-{size}"
        rows.append(row(parent, "floatlm", size, BUDGET, 2048, law(n, BUDGET) + noise * rng.normal()))
        for at in (0.125, 0.25, 0.375, 0.5, 0.75):
            d = at * BUDGET
            loss = law(n, d) + noise * rng.normal()
            rows.append(row(f"{parent}-cd{int(d)}", "floatlm", size, d, int(2048 * at), loss, parent=parent))
    return rows


def test_the_fit_on_early_branches_predicts_the_held_out_ends():
    laws, predictions, _ = fit_and_predict(suite_rows(), bootstrap=0)
    assert laws["floatlm"]["points"] == 16  # 4 sizes x the branches at 1/8 ... 1/2
    held = {p["run"]: p for p in predictions}
    assert len(held) == 8  # the four runs' own ends and the four branches at 3/4
    ends = [p for p in predictions if p["kind"].startswith("run end")]
    assert len(ends) == 4 and all(p["D"] == BUDGET for p in ends)
    for p in predictions:  # noiseless data of the law's own form: the fit recovers it
        assert abs(p["error"]) < 1e-3, p
        assert p["interval"] is None and p["inside_interval"] is None  # no bootstrap asked for


def test_noisy_branches_give_intervals_and_errors_of_the_noise_scale():
    _, predictions, _ = fit_and_predict(suite_rows(noise=0.005), bootstrap=200)
    assert all(p["interval"] is not None and p["interval"][0] <= p["predicted"] <= p["interval"][1]
               for p in predictions)  # fmt: skip
    assert max(abs(p["error"]) for p in predictions) < 0.05


def test_a_branch_is_compared_with_the_fresh_run_of_its_length_and_the_ladder_run_of_its_budget():
    rows = suite_rows()
    fresh = [row("floatlm-128x4", "floatlm", "128x4", BUDGET / 2, 1024, 3.70)]
    name = "floatlm-128x4-lr0.004"
    ladder = [row(name, "floatlm", "128x4", s * 1024, s, 5.0 - s / 1000) for s in (768, 1024, 1280)]
    ladder.append(row(name, "floatlm", "128x4", BUDGET, 2048, 3.52))
    pairs = {(c["wsd"], c["fresh"].split(":")[0]): c for c in fresh_comparison(rows, fresh, ladder)}
    branch = pairs[("floatlm-128x4-cd1048576", "fresh (cooldown-fresh suite)")]
    assert branch["wsd_kind"] == "branch" and branch["difference"] == branch["wsd_loss"] - 3.70
    end = pairs[("floatlm-128x4", "ladder fresh run")]
    assert end["wsd_kind"] == "run end" and end["fresh_loss"] == 3.52
    (drop,) = rate_drop(ladder)
    assert drop["middle_step"] == 1024
    assert np.isclose(drop["gain_before"], 0.256) and np.isclose(drop["excess"], 0.0)


def test_the_ladders_separately_trained_runs_of_the_same_budget_are_predicted_too():
    _, _, fitted = fit_and_predict(suite_rows(), bootstrap=0)
    name = "floatlm-128x4-lr0.004"
    n = SIZES["128x4"]
    ladder = [
        row(name, "floatlm", "128x4", 1024 * 1024, 1024, 4.0),
        row(name, "floatlm", "128x4", BUDGET, 2048, 3.5),
    ]
    ladder += [row("floatlm-128x4-lr0.002", "floatlm", "128x4", BUDGET, 2048, 3.6)]  # another rate: not this
    ladder += [row("trilm-128x4-lr0.004", "trilm", "128x4", BUDGET, 2048, 3.6)]  # a family without a fit
    (p,) = predict_separate(fitted, ladder, BUDGET)
    assert p["run"] == name and p["D"] == BUDGET and p["measured"] == 3.5 and p["kind"].startswith("separate")
    assert np.isclose(p["predicted"], law(n, BUDGET), atol=1e-3) and np.isclose(
        p["error"], p["predicted"] - 3.5
    )


def kaplan_rows() -> list[ResultRow]:
    """Rows from Kaplan's interacting form, whose gap between sizes grows with D (what the CPU runs show)."""
    theta = np.array([np.log(3.0), np.log(3e4), np.log(3e5), 0.5, 0.5])
    rows = []
    for size, n in SIZES.items():
        parent = f"floatlm-{size}"
        for at in (0.125, 0.25, 0.375, 0.5, 0.75, 1.0):
            d = at * BUDGET
            loss = float(kaplan_loss(theta, np.array([n]), np.array([d]))[0])
            name, extra = (parent, {}) if at == 1.0 else (f"{parent}-cd{int(d)}", {"parent": parent})
            rows.append(row(name, "floatlm", size, d, int(2048 * at), loss, **extra))
    return rows


def test_the_diagnosis_measures_the_gap_between_sizes_at_each_d():
    additive = size_gaps(suite_rows(), BUDGET, ("floatlm",))
    assert [g["fraction"] for g in additive] == [0.125, 0.25, 0.375, 0.5, 0.75, 1.0]
    gaps = [g["gap_smallest_largest"] for g in additive]
    assert np.allclose(gaps, A / SIZES["32x2"] ** ALPHA - A / SIZES["128x4"] ** ALPHA)  # one gap at every D
    growing = [g["gap_smallest_largest"] for g in size_gaps(kaplan_rows(), BUDGET, ("floatlm",))]
    assert all(b > a for a, b in itertools.pairwise(growing))


def test_kaplans_form_predicts_what_the_additive_law_cannot():
    rows = kaplan_rows()
    _, additive, _ = fit_and_predict(rows, bootstrap=0)
    alt = alternatives(rows, BUDGET, 0.5, ("floatlm",), bootstrap=12)
    kaplan = alt["kaplan"]["floatlm"]
    assert kaplan["points"] == 16 and kaplan["params"]["alpha"] == pytest.approx(0.5, abs=0.02)
    ends = {p["run"]: p for p in kaplan["predictions"]}
    assert set(ends) == {p["run"] for p in additive}
    assert max(abs(p["error"]) for p in kaplan["predictions"]) < 1e-3  # noiseless data of its own form
    assert max(abs(p["error"]) for p in additive) > TARGET  # the additive law misses the growing gap
    assert "predictions" in alt["late_window"]["floatlm"]
    result = {
        "target_nats": TARGET,
        "budget": BUDGET,
        "predictions": [{**p, "family": "floatlm"} for p in additive],
        "size_gaps": size_gaps(rows, BUDGET, ("floatlm",)),
        "alternatives": alt,
    }
    text = "\n".join(markdown(result, {"floatlm": NAMES["floatlm"]}))
    assert "| FloatLM | " in text and "8 of 8 within 0.03 nats" in text


def test_an_earlier_sessions_measurements_of_the_same_runs_are_paired_by_name():
    now = [{"run": "trilm-128x4", "family": "trilm", "measured": 3.5549}, {"run": "new", "measured": 1.0}]
    earlier = {"date": "2026-12-03T17:14:06", "predictions": [{"run": "trilm-128x4", "measured": 3.5888}]}
    (d,) = rerun_differences(now, earlier)
    assert d["run"] == "trilm-128x4" and np.isclose(d["difference"], 3.5549 - 3.5888)
    text = "\n".join(rerun_markdown([d], earlier))
    assert "at most -0.0339 (trilm-128x4)" in text and "2026-12-03" in text
    assert rerun_markdown([], earlier) == []
