"""Tissue et al.'s loss-curve law: the areas follow the schedule, and a fit on a WSD run's first half plus its
early cooldown branches recovers the law it was drawn from and forecasts the run's end."""

from __future__ import annotations

import numpy as np
import pytest

from trilm.config import ConfigError
from trilm.scaling.curve import CurveConfig, areas, fit_curve, schedule_areas
from trilm.scaling.errors import FitError
from trilm.schedule import Schedule, ScheduleConfig

TRUTH = {"L0": 3.0, "A": 8.0, "alpha": 0.5, "C": 0.002}


def _loss(s1, s2):
    return TRUTH["L0"] + TRUTH["A"] * np.asarray(s1) ** -TRUTH["alpha"] - TRUTH["C"] * np.asarray(s2)


def _wsd(steps: int, cooldown: int) -> Schedule:
    cfg = ScheduleConfig(kind="wsd", warmup=128, cooldown=cooldown, cooldown_shape="1-sqrt")
    return Schedule(cfg, steps, peak_lr=4e-3)


def test_areas_follow_the_schedule():
    s1, s2 = areas([1.0, 1.0, 0.5, 0.5], momentum=0.5)
    np.testing.assert_allclose(s1, [1.0, 2.0, 2.5, 3.0])
    np.testing.assert_allclose(s2, [0.0, 0.0, 0.5, 0.75])
    s1, s2 = schedule_areas(_wsd(2048, 410))
    assert s2[1637] == 0.0 < s2[-1]  # no annealing before the cooldown
    assert s1[-1] < 2048 and s1[1000] == pytest.approx(1000 - 63.5, abs=1)


def test_a_fit_on_the_first_half_and_two_branches_forecasts_the_end():
    run = _wsd(2048, 410)
    s1, s2 = schedule_areas(run)
    steps = [205, 256, 410, 512, 614, 768, 819, 1024]
    x1, x2 = [s1[s - 1] for s in steps], [s2[s - 1] for s in steps]
    for length in (256, 512, 768, 1024):
        b1, b2 = schedule_areas(_wsd(length, round(0.2 * length)))
        x1.append(b1[-1])
        x2.append(b2[-1])
    noise = np.exp(np.random.default_rng(0).normal(0, 5e-4, len(x1)))
    fit = fit_curve(CurveConfig(), x1, x2, _loss(x1, x2) * noise)
    assert fit.identified, fit.reasons
    for key, value in TRUTH.items():
        assert fit.params[key] == pytest.approx(value, rel=0.15), key
    assert abs(fit.predict(s1[-1], s2[-1])[0] - _loss(s1[-1], s2[-1])) < 0.03


def test_too_early_and_bad_configs_are_refused():
    with pytest.raises(FitError, match="too early: 3 checkpoints"):
        fit_curve(CurveConfig(), [100, 200, 300], [0, 0, 0], [5.0, 4.5, 4.2])
    with pytest.raises(ConfigError, match="min_points"):
        CurveConfig(min_points=3)
    with pytest.raises(ConfigError, match="momentum"):
        CurveConfig(momentum=1.0)
    s1 = np.array([100.0, 200, 300, 400, 500, 600])
    fit = fit_curve(CurveConfig(), s1, np.zeros(6), _loss(s1, 0))
    assert not fit.identified and any("C" in r for r in fit.reasons)
