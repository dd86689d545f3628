"""L(N, D) on chosen points predicts points it has not seen (with a bootstrap interval), and the approach-1
envelope finds the compute-optimal size where the data decide it."""

from __future__ import annotations

import numpy as np
import pytest

from trilm.scaling.envelope import envelope, gaps
from trilm.scaling.fitter import fit
from trilm.scaling.table import ResultRow

LAW = {"E": 3.0, "A": 60.0, "alpha": 0.35, "B": 400.0, "beta": 0.3}
SIZES = {"s": 3.3e4, "m": 1.1e5, "l": 3.3e5, "xl": 8.5e5}


def _loss(n, d, law=LAW):
    return law["E"] + law["A"] / n ** law["alpha"] + law["B"] / d ** law["beta"]


def _row(size, n, d, loss):
    return ResultRow.from_counts(
        run=f"floatlm-{size}-{int(d)}",
        family="floatlm",
        size=size,
        params=int(n * 1.5),
        nonembedding_params=int(n),
        linear_params=int(n),
        tokens=float(d),
        flops=6 * n * d,
        step=int(d // 1024),
        eval="val_loss",
        loss=float(loss),
    )


def test_fit_on_short_budgets_predicts_the_long_one():
    rng = np.random.default_rng(0)
    budgets = [2.6e5, 5.2e5, 7.9e5, 1.05e6]
    points = [
        _row(s, n, d, _loss(n, d) * (1 + rng.normal(0, 0.001))) for s, n in SIZES.items() for d in budgets
    ]
    data = {
        "N": [p.nonembedding_params for p in points],
        "D": [p.tokens for p in points],
        "loss": [p.loss for p in points],
    }
    law = fit("additive", data, units=[p.size for p in points], bootstrap=200, seed=0)
    assert law.identified, law.reasons
    p = law.predict(N=list(SIZES.values()), D=2.1e6)
    truth = _loss(np.array(list(SIZES.values())), 2.1e6)
    assert np.all(np.abs(p.value - truth) < 0.02)
    assert p.low is not None and p.high is not None
    assert np.all((p.low < p.value) & (p.value < p.high)) and np.all(p.high - p.low < 0.2)


def test_the_envelope_finds_the_compute_optimal_size_where_curves_overlap():
    points = [
        {"size": s, "n": n, "tokens": d, "flops": 6 * n * d, "loss": _loss(n, d)}
        for s, n in SIZES.items()
        for d in np.geomspace(1e5, 1e8, 12)
    ]
    env = envelope("floatlm", points, bootstrap=50, seed=0)
    assert env.identified and len(env.winners()) >= 3
    assert 0 < env.exponent_n < 1 and 0 < env.exponent_d < 1
    assert np.all(np.diff(env.n_opt[env.contested]) >= 0)  # a bigger budget never prefers a smaller model
    lo, hi = env.interval_n
    assert lo <= env.exponent_n <= hi
    two = envelope("floatlm", [p for p in points if p["size"] in ("s", "m")])
    assert not two.identified and "needs at least 3" in two.reason
    worse = [{**p, "loss": p["loss"] + 0.1} for p in points]
    assert [g for _, g in gaps(envelope("trilm", worse), env)] == pytest.approx([0.1] * 3)
