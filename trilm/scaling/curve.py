"""A loss-curve law for any schedule (Tissue et al. 2024): L(s) = L0 + A·S1(s)^(−α) − C·S2(s).

Why: a scaling law in (N, D) says nothing about where a running run will end, and the loss at step s of a
decaying run is not the loss a run of s steps would reach. Tissue et al. write the curve through two sums of
the run's own learning rate: the *forward area* ``S1(s) = Σ_{i≤s} η_i`` (how far the optimizer has moved)
and the *annealing area* ``S2(s) = Σ_{i≤s} m_i`` with ``m_i = λ·m_{i−1} + max(η_{i−1} − η_i, 0)`` (how much
of the rate has been taken away, with momentum λ), both for η normalised by its peak. A WSD cooldown,
Spectra's rate drop and a cosine decay all enter through S2; weight-decay events do not (no term for them).

The fit is the Huber-in-log objective of :mod:`trilm.scaling.fit`, over checkpoints of one or more runs of one
model (a run and its cooldown branches), each with its own schedule's areas; parameters
``[ln L0, ln A, α, ln C]``. :func:`forecast` fits on the checkpoints up to a step and predicts a later one;
it refuses (:class:`FitError`, saying why) with fewer points than :attr:`CurveConfig.min_points`.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

import numpy as np

from trilm.config import Config, require
from trilm.scaling import optim
from trilm.scaling.fit import HUBER_DELTA, FitError
from trilm.scaling.fitter import HuberLog
from trilm.scaling.identify import MAX_EXPONENT, MIN_EXPONENT


@dataclasses.dataclass
class CurveConfig(Config):
    """``momentum``: Tissue's λ (0.999 in the paper). ``min_step``: checkpoints before it are left out (the
    first steps are not yet on a power law). ``min_points``: fewer checkpoints than this is too early."""

    momentum: float = 0.999
    min_step: int = 128
    min_points: int = 5
    delta: float = HUBER_DELTA

    def validate(self) -> None:
        require(0 <= self.momentum < 1, f"momentum: must be in [0, 1), got {self.momentum}")
        require(self.min_step >= 1, f"min_step: must be ≥ 1, got {self.min_step}")
        require(
            self.min_points >= 5, f"min_points: the law has 4 parameters, need ≥ 5, got {self.min_points}"
        )
        require(self.delta > 0, f"delta: must be > 0, got {self.delta}")


def areas(lrs: Sequence[float], momentum: float = 0.999) -> tuple[np.ndarray, np.ndarray]:
    """``(S1, S2)`` after each step for the per-step learning rates ``lrs`` (entry i: the rate of step i),
    normalised by the peak rate."""
    eta = np.asarray(lrs, float)
    if eta.size == 0 or not np.all(np.isfinite(eta)) or eta.max() <= 0:
        raise FitError("areas: the learning rates must be finite with a positive peak")
    eta = eta / eta.max()
    drop = np.maximum(np.concatenate([[0.0], eta[:-1] - eta[1:]]), 0.0)
    m = np.empty_like(eta)
    acc = 0.0
    for i, d in enumerate(drop):
        acc = momentum * acc + d
        m[i] = acc
    return np.cumsum(eta), np.cumsum(m)


def schedule_areas(schedule, momentum: float = 0.999) -> tuple[np.ndarray, np.ndarray]:
    """:func:`areas` of a :class:`trilm.schedule.Schedule` over its whole run; index ``s − 1`` holds the areas
    after ``s`` steps (a checkpoint at step s)."""
    return areas([schedule.lr(i) for i in range(schedule.total)], momentum)


class CurveLaw:
    """log L̂ and its Jacobian for ``theta = [ln L0, ln A, α, ln C]`` at ``x = (S1, S2)``."""

    n_params = 4

    def log_predict_jac(self, theta: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        l0, a, alpha, c = (theta[:, j, None] for j in range(4))
        log_s1 = np.log(x[0])
        power = np.exp(a - alpha * log_s1)
        anneal = np.exp(c) * x[1]
        value = np.exp(l0) + power - anneal
        bad = ~(value > 0)
        value = np.where(bad, np.nan, value)
        jac = np.stack([np.exp(l0) + 0 * value, power, -power * log_s1, -anneal], axis=1) / value[:, None]
        return np.log(value), jac


CURVE = CurveLaw()


@dataclasses.dataclass
class CurveFit:
    theta: np.ndarray
    params: dict[str, float]
    n_points: int
    log_residual_rms: float
    reasons: tuple[str, ...]

    @property
    def identified(self) -> bool:
        return not self.reasons

    def predict(self, s1, s2) -> np.ndarray:
        x = np.stack([np.atleast_1d(np.asarray(s1, float)), np.atleast_1d(np.asarray(s2, float))])
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            return np.exp(CURVE.log_predict_jac(self.theta[None], x)[0][0])


def _grid() -> np.ndarray:
    axes = [[0.5, 1.0, 1.5], [0.0, 1.5, 3.0], [0.2, 0.5, 1.0], [-10.0, -7.0, -4.0]]
    return np.array(list(itertools.product(*axes)), float)


def fit_curve(cfg: CurveConfig, s1, s2, loss) -> CurveFit:
    """Fit the law to checkpoints at areas ``(s1, s2)`` with losses ``loss`` (any mix of runs of one model).
    Raises :class:`FitError` when there are too few points or no start converged."""
    s1, s2, loss = (np.asarray(v, float).ravel() for v in (s1, s2, loss))
    if not (s1.size == s2.size == loss.size):
        raise FitError(f"curve: {s1.size} S1, {s2.size} S2 and {loss.size} losses")
    if loss.size < cfg.min_points:
        raise FitError(f"too early: {loss.size} checkpoints, the curve law needs at least {cfg.min_points}")
    if not (np.all(s1 > 0) and np.all(s2 >= 0) and np.all(loss > 0) and np.all(np.isfinite(loss))):
        raise FitError("curve: S1 and the losses must be positive and finite, S2 non-negative")
    x, log_y = np.stack([s1, s2]), np.log(loss)
    obj = HuberLog(CURVE, x, log_y, delta=cfg.delta)  # type: ignore[arg-type]
    res = optim.minimize_batched(obj.fun_grad, _grid())
    fun = np.where(res.converged & np.isfinite(res.fun), res.fun, np.inf)
    if not np.isfinite(fun).any():
        raise FitError(f"curve: the fit did not converge from any of {fun.size} starts")
    theta = res.x[int(np.argmin(fun))].copy()
    params = {
        "L0": float(np.exp(theta[0])),
        "A": float(np.exp(theta[1])),
        "alpha": float(theta[2]),
        "C": float(np.exp(theta[3])),
    }
    resid = CURVE.log_predict_jac(theta[None], x)[0][0] - log_y
    reasons = []
    if not MIN_EXPONENT < params["alpha"] <= MAX_EXPONENT:
        reasons.append(f"alpha = {params['alpha']:.3g} outside (0, {MAX_EXPONENT:g}]")
    if params["L0"] >= float(loss.min()):
        reasons.append(f"L0 = {params['L0']:.4g} is not below the lowest loss, {loss.min():.4f}")
    if float(s2.max()) == 0.0:
        reasons.append("no checkpoint after any decrease of the rate: C (what annealing buys) is not seen")
    return CurveFit(theta, params, int(loss.size), float(np.sqrt(np.mean(resid**2))), tuple(reasons))


__all__ = ["CurveConfig", "CurveFit", "areas", "fit_curve", "schedule_areas"]
