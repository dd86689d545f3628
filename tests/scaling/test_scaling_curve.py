"""The areas of the curve laws follow the schedule: the forward area sums the rate (warm-up at the peak), the
annealing area grows only after the rate falls, and the multi-power law's sum over the rate's decreases is
exact for a schedule that falls at few steps."""

from __future__ import annotations

import numpy as np
import pytest

from trilm.scaling.curves import LossCurve
from trilm.scaling.laws import get_law
from trilm.scaling.laws.curve import MAX_DROPS, areas, curve_design, normalised_rates
from trilm.schedule import Schedule, ScheduleConfig


def _wsd(steps: int, cooldown: int) -> np.ndarray:
    cfg = ScheduleConfig(kind="wsd", warmup=128, cooldown=cooldown, cooldown_shape="1-sqrt")
    sched = Schedule(cfg, steps, peak_lr=4e-3)
    return np.array([sched.lr(i) for i in range(steps)])


def test_areas_follow_the_schedule():
    s1, s2 = areas(np.array([1.0, 1.0, 0.5, 0.5]), momentum=0.5)
    np.testing.assert_allclose(s1, [1.0, 2.0, 2.5, 3.0])
    np.testing.assert_allclose(s2, [0.0, 0.0, 0.5, 0.75])
    lr = _wsd(2048, 410)
    s1, s2 = areas(lr)
    assert s2[1637] == 0.0 < s2[-1]  # no annealing before the cooldown
    assert s1[1000] == pytest.approx(1001)  # the warm-up counts at the peak rate
    assert normalised_rates(lr)[:128].tolist() == [1.0] * 128


def test_the_multipower_drop_is_summed_exactly_over_a_few_decreases():
    """A schedule with two steps down: the loss drop at a point is B·Σ_k (η_{k−1} − η_k)·G(η_k^(−γ)·S_k),
    written out by hand here for the two decreases, and it matches the law's own sum."""
    lr = np.concatenate([np.full(100, 1.0), np.full(100, 0.5), np.full(100, 0.1)])
    params = {"L0": 2.0, "A": 5.0, "alpha": 0.5, "B": 0.3, "C": 0.5, "beta": 0.7, "gamma": 0.4}
    law = get_law("multipower")
    steps = np.array([50, 150, 250, 300])
    got = np.exp(law.log_predict(law.theta(params), law.design([LossCurve("x", lr, steps, np.ones(4))]))[0])
    s1 = np.cumsum(lr)

    def g(x):
        return 1 - (params["C"] * x + 1) ** -params["beta"]

    for t, value in zip(steps, got):
        drop = 0.0
        for k, (before, after) in ((101, (1.0, 0.5)), (201, (0.5, 0.1))):
            if k <= t:
                drop += (before - after) * g(after ** -params["gamma"] * (s1[t - 1] - s1[k - 2]))
        expected = params["L0"] + params["A"] * s1[t - 1] ** -params["alpha"] - params["B"] * drop
        assert value == pytest.approx(expected, rel=1e-12)


def test_a_long_decay_is_summed_in_blocks():
    lr = np.linspace(1.0, 0.01, 5000)
    design = curve_design([LossCurve("x", lr, [5000], [1.0])], pairs=True)
    assert design.pair_drop.size == MAX_DROPS
    assert design.pair_drop.sum() == pytest.approx(1.0 - 0.01)
