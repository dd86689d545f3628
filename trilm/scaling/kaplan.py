"""Kaplan et al. (2020)'s interacting form of L(N, D), with an irreducible loss:
``L = E + ((N_c/N)^(α/β) + D_c/D)^β``.

A model is data-limited (all sizes alike) at small D and size-limited at large D, so the loss gap between two
sizes grows with D — what the additive form ``E + A/N^α + B/D^β`` (:mod:`trilm.scaling.nd`) cannot say. The
cooldown report fits it as the alternative that explains the additive law's misses
(:mod:`trilm.scaling.cooldown_diagnosis`).

It is fitted with scipy's least squares (``pip install trilm[bench]``; imported only when a fit runs), with
the Huber loss of the log residuals at trilm's own δ (:data:`trilm.scaling.fit.HUBER_DELTA`) from a grid of
starts, and bootstrapped over lineages like trilm's numpy fits. It stays on scipy because the committed
cooldown report was fitted so; trilm's own laws use numpy only.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from trilm.scaling.fit import HUBER_DELTA


def kaplan_loss(theta: np.ndarray, n: np.ndarray, d: np.ndarray) -> np.ndarray:
    """``E + ((N_c/N)^(α/β) + D_c/D)^β`` for ``theta = [ln E, ln N_c, ln D_c, α, β]``."""
    log_e, log_nc, log_dc, alpha, beta = theta
    with np.errstate(over="ignore", invalid="ignore"):
        inner = np.exp((alpha / beta) * (log_nc - np.log(n))) + np.exp(log_dc - np.log(d))
        return np.exp(log_e) + inner**beta


def _residuals(theta, n, d, log_y, sqrt_w):
    pred = kaplan_loss(theta, n, d)
    r = np.log(np.where(pred > 0, pred, 1e-300)) - log_y
    return np.where(np.isfinite(r), r, 1e3) * sqrt_w


def _fit_kaplan_once(n, d, loss, weights, starts) -> np.ndarray | None:
    from scipy.optimize import least_squares  # optional dependency: scipy (the bench extra)

    bounds = ([-5.0, -5.0, -5.0, 1e-3, 1e-3], [3.0, 60.0, 60.0, 3.0, 3.0])
    log_y, sqrt_w = np.log(loss), np.sqrt(weights)
    best, best_cost = None, np.inf
    for x0 in starts:
        res = least_squares(
            _residuals, x0, args=(n, d, log_y, sqrt_w), bounds=bounds, loss="huber", f_scale=HUBER_DELTA
        )
        if res.success and res.cost < best_cost:
            best, best_cost = res.x, res.cost
    return best


def _grid(loss: np.ndarray) -> list[np.ndarray]:
    low = float(np.log(np.min(loss)))
    return [
        np.array(s)
        for s in itertools.product(
            [low - 0.4, low - 0.1], [5.0, 10.0, 15.0], [8.0, 12.0, 16.0], [0.3, 0.8], [0.3, 0.8]
        )
    ]


def fit_kaplan(points: list, units: list[str], bootstrap: int, seed: int = 0) -> dict[str, Any]:
    """Fit Kaplan's form to ``points`` (N non-embedding, D tokens) and bootstrap it over ``units``: the
    parameters and the resampled parameter vectors (for prediction intervals)."""
    n = np.array([r.nonembedding_params for r in points], float)
    d = np.array([r.tokens for r in points], float)
    loss = np.array([r.loss for r in points], float)
    theta = _fit_kaplan_once(n, d, loss, np.ones_like(loss), _grid(loss))
    if theta is None:
        return {"error": "no start converged"}
    names = sorted(set(units))
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(bootstrap):
        draw = rng.integers(0, len(names), len(names))
        counts = np.bincount(draw, minlength=len(names))
        w = np.array([counts[names.index(u)] for u in units], float)
        if np.count_nonzero(counts) < 2:
            continue
        t = _fit_kaplan_once(n, d, loss, w, [theta, *_grid(loss)[::36]])
        if t is not None:
            samples.append(t)
    return {
        "theta": theta,
        "params": {
            "E": float(np.exp(theta[0])),
            "N_c": float(np.exp(theta[1])),
            "D_c": float(np.exp(theta[2])),
            "alpha": float(theta[3]),
            "beta": float(theta[4]),
        },
        "samples": np.array(samples),
        "rms_log_residual": float(np.sqrt(np.mean((np.log(kaplan_loss(theta, n, d)) - np.log(loss)) ** 2))),
    }


def predict_kaplan(fit: dict[str, Any], n: float, d: float, level: float = 0.95) -> dict[str, Any]:
    """The fitted form at (``n``, ``d``) and, given ten resamples or more, its ``level`` interval."""
    value = float(kaplan_loss(fit["theta"], np.array([n]), np.array([d]))[0])
    samples = fit["samples"]
    interval = None
    if len(samples) >= 10:
        values = np.array([kaplan_loss(t, np.array([n]), np.array([d]))[0] for t in samples])
        tail = 100 * (1 - level) / 2
        interval = [float(v) for v in np.percentile(values[np.isfinite(values)], [tail, 100 - tail])]
    return {"predicted": value, "interval": interval}
