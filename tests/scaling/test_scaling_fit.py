"""The fitter on the size laws of ``trilm scaling fit --form`` (N → ``n``, D → ``d``, ND → ``additive``):
analytic gradients of the weighted objective, batched L-BFGS, recovery of known laws, clear errors on bad
input."""

from __future__ import annotations

import numpy as np
import pytest

from trilm.scaling import optim
from trilm.scaling.errors import FitError
from trilm.scaling.fitter import HuberLog, fit
from trilm.scaling.laws import get_law

TRUE = {"E": 1.7, "A": 400.0, "alpha": 0.34, "B": 410.0, "beta": 0.28}


def _law(n=None, d=None):
    out = TRUE["E"]
    if n is not None:
        out = out + TRUE["A"] / n ** TRUE["alpha"]
    if d is not None:
        out = out + TRUE["B"] / d ** TRUE["beta"]
    return out


@pytest.mark.parametrize("name", ["n", "d", "additive"])
def test_analytic_gradient_of_the_weighted_objective_matches_finite_differences(name):
    """Bootstrap weights (counts 0, 1, 2 per point) included: what the refits minimize."""
    rng = np.random.default_rng(0)
    law = get_law(name)
    inputs = {"N": np.geomspace(1e7, 1e10, 12), "D": np.geomspace(1e9, 1e12, 12)[::-1]}
    used = {v: inputs[v] if v in law.inputs else None for v in ("N", "D")}  # type: ignore[attr-defined]
    loss = _law(used["N"], used["D"]) * np.exp(0.02 * rng.standard_normal(12))
    data = {**{v: inputs[v] for v in law.inputs}, "loss": loss}  # type: ignore[attr-defined]
    weights = rng.integers(0, 3, size=(4, 12)).astype(float)
    objective = HuberLog(law, law.design(data), np.log(loss), weights=weights)
    theta = law.grid()[rng.integers(0, len(law.grid()), 4)] + 0.1 * rng.standard_normal((4, law.n_params))
    theta[:, 1:-1:2] = rng.uniform(0.2, 0.5, (4, len(law.exponents)))
    f, g = objective.fun_grad(theta)
    eps = 1e-6
    for k in range(law.n_params):
        step = np.zeros(law.n_params)
        step[k] = eps
        fp, _ = objective.fun_grad(theta + step)
        fm, _ = objective.fun_grad(theta - step)
        numeric = (fp - fm) / (2 * eps)
        np.testing.assert_allclose(g[:, k], numeric, rtol=1e-4, atol=1e-10)
    assert f.shape == (4,)


def test_batched_lbfgs_solves_independent_problems():
    # Rosenbrock valleys with different minima (a, a²): each problem must find its own.
    targets = np.array([1.0, -0.5, 2.0, 0.3])

    def fun_grad(x, idx):
        a = targets[idx]
        u, v = x[:, 0], x[:, 1]
        f = (a - u) ** 2 + 100 * (v - u**2) ** 2
        g = np.stack([-2 * (a - u) - 400 * u * (v - u**2), 200 * (v - u**2)], axis=1)
        return f, g

    res = optim.minimize_batched(fun_grad, np.tile([-1.2, 1.0], (4, 1)), ftol=1e-15, gtol=1e-10)
    assert res.converged.all()
    np.testing.assert_allclose(res.x[:, 0], targets, atol=1e-5)
    np.testing.assert_allclose(res.x[:, 1], targets**2, atol=1e-5)


def test_batched_lbfgs_reports_iteration_limit():
    def fun_grad(x, idx):
        return (x**2).sum(axis=1) + 1e3 * x[:, 0] ** 4, 2 * x + np.stack([4e3 * x[:, 0] ** 3, 0 * x[:, 1]], 1)

    res = optim.minimize_batched(fun_grad, np.array([[3.0, 2.0], [1.0, 1.0]]), max_iter=np.array([1, 500]))
    assert res.status[0] == optim.MAX_ITER and res.n_iter[0] == 1
    assert res.converged[1]


def test_recovers_l_of_n_exponent_with_one_percent_noise():
    rng = np.random.default_rng(0)
    n = np.geomspace(1e6, 1e12, 40)
    loss = _law(n=n) * np.exp(0.01 * rng.standard_normal(n.size))
    result = fit("n", {"N": n, "loss": loss})
    assert result.status.startswith("converged") and result.n_starts == 150
    assert abs(result.params["alpha"] / TRUE["alpha"] - 1) < 0.05
    assert abs(result.params["E"] / TRUE["E"] - 1) < 0.05


def test_recovers_l_of_d_exponent_with_one_percent_noise():
    rng = np.random.default_rng(1)
    d = np.geomspace(1e8, 1e14, 40)
    loss = _law(d=d) * np.exp(0.01 * rng.standard_normal(d.size))
    result = fit("d", {"D": d, "loss": loss})
    assert abs(result.params["beta"] / TRUE["beta"] - 1) < 0.05
    np.testing.assert_allclose(result.predict(D=d).value, _law(d=d), rtol=0.01)


def test_recovers_l_of_n_d_exponents_with_one_percent_noise():
    # 12 x 12 separate runs over four decades of N and of D: the exponents' SEs are about 2%.
    rng = np.random.default_rng(0)
    n = np.repeat(np.geomspace(1e7, 1e11, 12), 12)
    d = np.tile(np.geomspace(1e9, 1e13, 12), 12)
    loss = _law(n=n, d=d) * np.exp(0.01 * rng.standard_normal(n.size))
    result = fit("additive", {"N": n, "D": d, "loss": loss})
    assert result.status.startswith("converged") and result.n_starts == 4500
    assert abs(result.params["alpha"] / TRUE["alpha"] - 1) < 0.05
    assert abs(result.params["beta"] / TRUE["beta"] - 1) < 0.05
    assert abs(result.params["E"] / TRUE["E"] - 1) < 0.05


def test_exact_data_is_recovered_to_high_precision():
    n = np.geomspace(1e7, 1e10, 9)
    result = fit("n", {"N": n, "loss": _law(n=n)})
    assert result.params["alpha"] == pytest.approx(TRUE["alpha"], rel=1e-4)
    assert result.params["A"] == pytest.approx(TRUE["A"], rel=1e-3)
    assert result.params["E"] == pytest.approx(TRUE["E"], rel=1e-4)


def test_fewer_points_than_parameters_is_an_error():
    with pytest.raises(FitError, match=r"E \+ A/N\^α \+ B/D\^β has 5 parameters but only 4 points"):
        fit("additive", {"N": [1e8, 2e8, 4e8, 8e8], "D": [1e9, 2e9, 4e9, 8e9], "loss": [3.0, 2.9, 2.8, 2.7]})


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ([1e8, 0.0, 4e8, 8e8], r"N must be positive and finite; point 1 has N=0\.0"),
        ([1e8, -2e8, 4e8, 8e8], r"point 1 has N=-200000000\.0"),
        ([1e8, np.nan, 4e8, 8e8], r"point 1 has N=nan"),
        ([1e8, 2e8, np.inf, 8e8], r"point 2 has N=inf"),
    ],
)
def test_non_positive_or_non_finite_inputs_are_errors(values, message):
    with pytest.raises(FitError, match=message):
        fit("n", {"N": values, "loss": [3.0, 2.9, 2.8, 2.7]}, label="trilm L(N)")


def test_non_finite_loss_is_an_error_naming_the_fit():
    message = r"loss must be positive and finite; point 3 has loss=nan"
    with pytest.raises(FitError, match=message):
        fit("n", {"N": [1e8, 2e8, 4e8, 8e8], "loss": [3.0, 2.9, 2.8, np.nan]}, label="trilm L(N)")


def test_one_size_is_an_error():
    with pytest.raises(FitError, match=r"at least 3 distinct values of N.*got 1"):
        fit("n", {"N": [1e8] * 5, "loss": [3.0, 2.9, 2.8, 2.7, 2.6]})


def test_fit_that_did_not_converge_is_an_error_not_a_number():
    n = np.geomspace(1e7, 1e10, 9)
    with pytest.raises(FitError, match=r"did not converge from any of 150 starts"):
        fit("n", {"N": n, "loss": _law(n=n)}, max_iter=2)


def test_extreme_parameters_give_a_finite_objective_and_gradient():
    # α = 300 spreads the power-law term over ~1,500 nats across the points: the log-sum-exp keeps every
    # value finite, and the gradient agrees with finite differences at a point where the term is tiny.
    law = get_law("additive")
    n, d = np.geomspace(1e7, 1e10, 8), np.geomspace(1e9, 1e12, 8)
    data = {"N": n, "D": d, "loss": _law(n=n, d=d)}
    objective = HuberLog(law, law.design(data), np.log(data["loss"]))
    theta = np.array([[6000.0, 300.0, 7.0, 0.3, 0.5], [6.0, 0.34, 6.0, 0.28, 0.5]])
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        f, g = objective.fun_grad(theta)
    assert np.isfinite(f).all() and np.isfinite(g).all()
    step = np.zeros(5)
    step[4] = 1e-6
    numeric = (objective.fun_grad(theta + step)[0] - objective.fun_grad(theta - step)[0]) / 2e-6
    np.testing.assert_allclose(g[:, 4], numeric, rtol=1e-4, atol=1e-10)
