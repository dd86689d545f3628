"""The fitter: analytic gradients, batched L-BFGS, recovery of known laws, clear errors on bad input."""

from __future__ import annotations

import numpy as np
import pytest

from trilm.scaling import optim
from trilm.scaling.fit import FORMS, FitError, HuberObjective, fit_law, validate_inputs

TRUE = {"E": 1.7, "A": 400.0, "alpha": 0.34, "B": 410.0, "beta": 0.28}


def _law(n=None, d=None):
    out = TRUE["E"]
    if n is not None:
        out = out + TRUE["A"] / n ** TRUE["alpha"]
    if d is not None:
        out = out + TRUE["B"] / d ** TRUE["beta"]
    return out


@pytest.mark.parametrize("form_name", ["N", "D", "ND"])
def test_analytic_gradient_matches_finite_differences(form_name):
    rng = np.random.default_rng(0)
    form = FORMS[form_name]
    inputs = {"N": np.geomspace(1e7, 1e10, 12), "D": np.geomspace(1e9, 1e12, 12)[::-1]}
    used = {v: inputs[v] if v in form.variables else None for v in ("N", "D")}
    loss = _law(used["N"], used["D"])
    loss = loss * np.exp(0.02 * rng.standard_normal(12))
    log_x, log_y = validate_inputs(form, inputs, loss)
    weights = rng.integers(0, 3, size=(4, 12)).astype(float)
    objective = HuberObjective(form, log_x, log_y, weights=weights)
    theta = form.default_grid()[rng.integers(0, len(form.default_grid()), 4)] + 0.1 * rng.standard_normal(
        (4, form.n_params)
    )
    theta[:, 1::2][:, : len(form.variables)] = rng.uniform(0.2, 0.5, (4, len(form.variables)))
    f, g = objective.fun_grad(theta)
    eps = 1e-6
    for k in range(form.n_params):
        step = np.zeros(form.n_params)
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
    fit = fit_law("N", {"N": n}, loss)
    assert fit.converged and fit.n_starts == 150
    assert abs(fit.params["alpha"] / TRUE["alpha"] - 1) < 0.05
    assert abs(fit.params["E"] / TRUE["E"] - 1) < 0.05


def test_recovers_l_of_d_exponent_with_one_percent_noise():
    rng = np.random.default_rng(1)
    d = np.geomspace(1e8, 1e14, 40)
    loss = _law(d=d) * np.exp(0.01 * rng.standard_normal(d.size))
    fit = fit_law("D", {"D": d}, loss)
    assert abs(fit.params["beta"] / TRUE["beta"] - 1) < 0.05
    np.testing.assert_allclose(fit.predict(D=d), _law(d=d), rtol=0.01)


def test_recovers_l_of_n_d_exponents_with_one_percent_noise():
    # 12 x 12 separate runs over four decades of N and of D: the exponents' SEs are about 2%.
    rng = np.random.default_rng(0)
    n = np.repeat(np.geomspace(1e7, 1e11, 12), 12)
    d = np.tile(np.geomspace(1e9, 1e13, 12), 12)
    loss = _law(n=n, d=d) * np.exp(0.01 * rng.standard_normal(n.size))
    fit = fit_law("ND", {"N": n, "D": d}, loss)
    assert fit.converged and fit.n_starts == 4500
    assert abs(fit.params["alpha"] / TRUE["alpha"] - 1) < 0.05
    assert abs(fit.params["beta"] / TRUE["beta"] - 1) < 0.05
    assert abs(fit.params["E"] / TRUE["E"] - 1) < 0.05


def test_exact_data_is_recovered_to_high_precision():
    n = np.geomspace(1e7, 1e10, 9)
    fit = fit_law("N", {"N": n}, _law(n=n))
    assert fit.params["alpha"] == pytest.approx(TRUE["alpha"], rel=1e-4)
    assert fit.params["A"] == pytest.approx(TRUE["A"], rel=1e-3)
    assert fit.params["E"] == pytest.approx(TRUE["E"], rel=1e-4)


def test_fewer_points_than_parameters_is_an_error():
    with pytest.raises(FitError, match=r"L\(N, D\) has 5 parameters but only 4 points"):
        fit_law("ND", {"N": [1e8, 2e8, 4e8, 8e8], "D": [1e9, 2e9, 4e9, 8e9]}, [3.0, 2.9, 2.8, 2.7])


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
        fit_law("N", {"N": values}, [3.0, 2.9, 2.8, 2.7], label="trilm L(N)")


def test_non_finite_loss_is_an_error_naming_the_fit():
    message = r"trilm L\(N\): loss must be positive and finite; point 3 has loss=nan"
    with pytest.raises(FitError, match=message):
        fit_law("N", {"N": [1e8, 2e8, 4e8, 8e8]}, [3.0, 2.9, 2.8, np.nan], label="trilm L(N)")


def test_one_size_is_an_error():
    with pytest.raises(FitError, match=r"at least 3 distinct values of N.*got 1"):
        fit_law("N", {"N": [1e8] * 5}, [3.0, 2.9, 2.8, 2.7, 2.6])


def test_fit_that_did_not_converge_is_an_error_not_a_number():
    n = np.geomspace(1e7, 1e10, 9)
    with pytest.raises(FitError, match=r"did not converge from any of 150 starts.*raise max_iter"):
        fit_law("N", {"N": n}, _law(n=n), max_iter=2)


def test_extreme_parameters_fall_back_to_the_per_point_shift():
    # α = 300 spreads the power-law term over ~1,500 nats across the points: a per-problem shift underflows.
    form = FORMS["ND"]
    n, d = np.geomspace(1e7, 1e10, 8), np.geomspace(1e9, 1e12, 8)
    log_x, log_y = validate_inputs(form, {"N": n, "D": d}, _law(n=n, d=d))
    objective = HuberObjective(form, log_x, log_y)
    theta = np.array([[6000.0, 300.0, 7.0, 0.3, 0.5], [6.0, 0.34, 6.0, 0.28, 0.5]])
    f, g = objective.fun_grad(theta)
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        work = np.empty((7, 2, log_y.size))
        f_ref, g_ref, _ = objective._eval(theta, log_x, log_y, None, work, per_problem_shift=False)
    assert np.isfinite(f).all() and np.isfinite(g).all()
    np.testing.assert_allclose(f, f_ref, rtol=1e-12)
    np.testing.assert_allclose(g, g_ref, rtol=1e-10, atol=1e-14)
