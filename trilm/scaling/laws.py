"""A registry of L(N, D) laws, the additive one and two in which size and data interact.

Why more than one: ``E + A/N^α + B/D^β`` makes the loss gap between two sizes the same at every D. In the
cooldown experiment (``docs/results/cooldown/``), where runs see 1–60 tokens per parameter, that gap grows
from 0.18 to 0.48 nats as D grows 8x, and the additive law fitted on short budgets misses the long ones.
Kaplan et al. (2020)'s form couples N and D: a model is data-limited (sizes alike) at small D and
size-limited at large D.

=============  =====================================================  ===================================
name           law                                                    log-space parameters
=============  =====================================================  ===================================
``additive``   E + A/N^α + B/D^β (Chinchilla approach 3)              ln A, α, ln B, β, ln E
``kaplan``     [(N_c/N)^(α_N/α_D) + D_c/D]^α_D (Kaplan 2020, eq. 1.5) ln N_c, α_N/α_D, ln D_c, α_D
``kaplan_e``   E + [(N_c/N)^(α_N/α_D) + D_c/D]^α_D                    ln N_c, α_N/α_D, ln D_c, α_D, ln E
=============  =====================================================  ===================================

Every law is fitted the same way (:mod:`trilm.scaling.lawfit`): the Huber loss (δ = 1e-3) of the log
residuals, summed over points, minimized by the batched L-BFGS of :mod:`trilm.scaling.optim` from a grid of
starts. Kaplan's forms are written with log-sum-exp, ``log [·] = LSE(r·(ln N_c − ln N), ln D_c − ln D)``
with ``r = α_N/α_D``, so they stay finite where the powers would overflow; ``r`` rather than ``α_N`` is
the free parameter because the bracket's N term depends on it alone.
"""

from __future__ import annotations

import abc
import dataclasses
import itertools
from typing import Protocol

import numpy as np

from trilm.scaling.fit import FORMS, HUBER_DELTA, FitError, HuberObjective, predict_log
from trilm.scaling.identify import EDGE, MAX_EXPONENT, MIN_EXPONENT, TINY_TERM, edge_reasons

MAX_LOG_SCALE = 60.0
"""Top of the search box of ln N_c and ln D_c. Without E, Kaplan's critical scales are far beyond the data
(his N_c = 8.8e13, D_c = 5.4e13: ln ≈ 32) and grow as α_D shrinks; 60 leaves room for that."""


class Objective(Protocol):
    def fun_grad(self, theta: np.ndarray, idx: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]: ...


class JacobianLaw(Protocol):
    """What :class:`JacobianHuber` needs of a law: log predictions and their Jacobian in θ."""

    def log_predict_jac(self, theta: np.ndarray, log_x: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...


class JacobianHuber:
    """Σᵢ wᵢ·Huber_δ(log L̂ᵢ − log Lᵢ) for any law that gives log L̂ and its Jacobian.

    The same objective as :class:`trilm.scaling.fit.HuberObjective` (which is specialised to sums of power
    laws); data are shared by every problem, ``weights (R, n)`` are bootstrap counts and ``weight_index``
    maps each problem to its row of them.
    """

    def __init__(
        self,
        law: JacobianLaw,
        log_x: np.ndarray,
        log_y: np.ndarray,
        *,
        delta: float = HUBER_DELTA,
        weights: np.ndarray | None = None,
        weight_index: np.ndarray | None = None,
    ) -> None:
        self.law, self.log_x, self.log_y, self.delta = law, log_x, log_y, float(delta)
        self.weights, self.weight_index = weights, weight_index

    def fun_grad(self, theta: np.ndarray, idx: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        theta = np.atleast_2d(theta)
        if idx is None:
            idx = np.arange(theta.shape[0])
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            pred, jac = self.law.log_predict_jac(theta, self.log_x)
            resid = pred - self.log_y
            clipped = np.clip(resid, -self.delta, self.delta)
            huber = clipped * (2.0 * resid - clipped)
            if self.weights is not None:
                rows = idx if self.weight_index is None else self.weight_index[idx]
                w = self.weights[rows]
                huber *= w
                clipped = clipped * w
            f = 0.5 * huber.sum(axis=1)
            g = np.einsum("bpn,bn->bp", jac, clipped)
        return f, g


@dataclasses.dataclass(frozen=True)
class Law(abc.ABC):
    """One L(N, D) law: its parameters, grids of starts, prediction and plausibility box.

    ``restart_grid``: whether bootstrap refits also start from the screened :meth:`coarse_grid` (besides
    the full-data fit). The additive law does not, as ``trilm.scaling.bootstrap`` never did for its five
    parameters; Kaplan's bracket has a saddle between its data- and size-limited regimes, so its refits do.
    """

    name: str
    formula: str
    theta_names: tuple[str, ...]
    exponents: tuple[str, ...]
    has_e: bool
    restart_grid: bool

    @property
    def n_params(self) -> int:
        return len(self.theta_names)

    @abc.abstractmethod
    def natural(self, theta: np.ndarray) -> dict[str, float]: ...

    @abc.abstractmethod
    def grid(self) -> np.ndarray: ...

    @abc.abstractmethod
    def coarse_grid(self) -> np.ndarray: ...

    @abc.abstractmethod
    def log_predict(self, theta: np.ndarray, log_x: np.ndarray) -> np.ndarray:
        """log L̂ ``(B, n)`` for ``theta (B, P)`` at ``log_x (2, n)`` (ln N, ln D)."""

    @abc.abstractmethod
    def objective(
        self,
        log_x: np.ndarray,
        log_y: np.ndarray,
        *,
        delta: float = HUBER_DELTA,
        weights: np.ndarray | None = None,
        weight_index: np.ndarray | None = None,
    ) -> Objective:
        """The robust objective this law is fitted with (one problem per bootstrap row of ``weights``)."""

    @abc.abstractmethod
    def edge_reasons(self, params: dict[str, float], log_x: np.ndarray, loss: np.ndarray) -> list[str]:
        """Why the fitted parameters sit at the edge of the search box, or a term is unseen (empty: none)."""


class Additive(Law):
    """E + A/N^α + B/D^β, evaluated by :class:`trilm.scaling.fit.HuberObjective` itself, so its fits are
    exactly those of :func:`trilm.scaling.nd.fit_nd`."""

    form = FORMS["ND"]

    def natural(self, theta: np.ndarray) -> dict[str, float]:
        return self.form.natural(np.asarray(theta))

    def grid(self) -> np.ndarray:
        return self.form.default_grid()

    def coarse_grid(self) -> np.ndarray:
        return self.form.coarse_grid()

    def log_predict(self, theta: np.ndarray, log_x: np.ndarray) -> np.ndarray:

        return predict_log(self.form, theta, log_x)

    def objective(self, log_x, log_y, *, delta=HUBER_DELTA, weights=None, weight_index=None) -> Objective:
        return HuberObjective(
            self.form, log_x, log_y, delta=delta, weights=weights, weight_index=weight_index
        )

    def edge_reasons(self, params: dict[str, float], log_x: np.ndarray, loss: np.ndarray) -> list[str]:

        return edge_reasons(self.form, params, {"N": np.exp(log_x[0]), "D": np.exp(log_x[1])}, loss)


class Kaplan(Law):
    """[(N_c/N)^(α_N/α_D) + D_c/D]^α_D, optionally plus E: see the module docstring."""

    def natural(self, theta: np.ndarray) -> dict[str, float]:
        log_nc, ratio, log_dc, alpha_d = (float(v) for v in theta[:4])
        with np.errstate(over="ignore"):
            out = {
                "N_c": float(np.exp(log_nc)),
                "D_c": float(np.exp(log_dc)),
                "alpha_N": ratio * alpha_d,
                "alpha_D": alpha_d,
            }
            if self.has_e:
                out["E"] = float(np.exp(theta[4]))
        return out

    def _axes(self, coarse: bool) -> list[np.ndarray]:
        if coarse:
            axes = [[10.0, 25.0], [0.5, 2.0], [15.0, 30.0], [0.1, 0.5]] + ([[0.0, 1.0]] if self.has_e else [])
        else:
            axes = [
                [0.0, 10.0, 20.0, 30.0, 40.0],
                [0.5, 1.0, 2.0, 4.0],
                [10.0, 15.0, 20.0, 30.0, 40.0],
                [0.05, 0.1, 0.3, 0.6, 1.0],
            ] + ([[-1.0, 0.0, 0.5, 1.0, 1.5]] if self.has_e else [])
        return [np.array(a) for a in axes]

    def grid(self) -> np.ndarray:
        """5 × 4 × 5 × 5 starts (× 5 values of ln E): ln N_c 0…40, α_N/α_D 0.5…4, ln D_c 10…40, α_D
        0.05…1 (Kaplan's own α_D is 0.095; fits with E give larger ones)."""
        return np.array(list(itertools.product(*self._axes(False))), dtype=float)

    def coarse_grid(self) -> np.ndarray:
        return np.array(list(itertools.product(*self._axes(True))), dtype=float)

    def log_predict(self, theta: np.ndarray, log_x: np.ndarray) -> np.ndarray:
        return self.log_predict_jac(np.atleast_2d(theta), log_x)[0]

    def objective(
        self,
        log_x: np.ndarray,
        log_y: np.ndarray,
        *,
        delta: float = HUBER_DELTA,
        weights: np.ndarray | None = None,
        weight_index: np.ndarray | None = None,
    ) -> Objective:
        return JacobianHuber(self, log_x, log_y, delta=delta, weights=weights, weight_index=weight_index)

    def log_predict_jac(self, theta: np.ndarray, log_x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        log_nc, ratio, log_dc, alpha_d = (theta[:, j, None] for j in range(4))
        gap_n = log_nc - log_x[0]
        u1 = ratio * gap_n
        u2 = log_dc - log_x[1]
        top = np.maximum(u1, u2)
        s = top + np.log(np.exp(u1 - top) + np.exp(u2 - top))
        p1, p2 = np.exp(u1 - s), np.exp(u2 - s)
        bracket = alpha_d * s
        jac = np.empty((theta.shape[0], self.n_params, log_x.shape[1]))
        jac[:, 0] = alpha_d * p1 * ratio
        jac[:, 1] = alpha_d * p1 * gap_n
        jac[:, 2] = alpha_d * p2
        jac[:, 3] = s
        if not self.has_e:
            return bracket, jac
        e = theta[:, 4, None]
        top = np.maximum(bracket, e)
        pred = top + np.log(np.exp(bracket - top) + np.exp(e - top))
        q = np.exp(bracket - pred)
        jac[:, :4] *= q[:, None]
        jac[:, 4] = 1.0 - q
        return pred, jac

    def edge_reasons(self, params: dict[str, float], log_x: np.ndarray, loss: np.ndarray) -> list[str]:
        out = []
        lo, hi = MIN_EXPONENT, MAX_EXPONENT
        for name in ("alpha_N", "alpha_D"):
            if lo < params[name] <= hi and hi - params[name] < EDGE * (hi - lo):
                out.append(f"{name} = {params[name]:.3g} is pinned at the top of the search box ({hi:g})")
        top = MAX_LOG_SCALE - EDGE * MAX_LOG_SCALE
        for name in ("N_c", "D_c"):
            log = float(np.log(params[name])) if params[name] > 0 else float("-inf")
            if not np.isfinite(log) or not 0.0 <= log <= top:
                out.append(
                    f"{name} = {params[name]:.3g} is outside the search box or at its edge"
                    f" (ln {name} = {log:.3g}, box 0…{MAX_LOG_SCALE:g})"
                )
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            ratio = params["alpha_N"] / params["alpha_D"]
            u1 = ratio * (np.log(params["N_c"]) - log_x[0])
            u2 = np.log(params["D_c"]) - log_x[1]
            share_n = 1.0 / (1.0 + np.exp(np.clip(np.nan_to_num(u2 - u1), -700, 700)))
        for name, share in (("(N_c/N)", share_n), ("D_c/D", 1.0 - share_n)):
            if float(np.max(share)) < TINY_TERM:
                out.append(
                    f"the {name} term is below {TINY_TERM:.0e} of the bracket at every point: its scale and"
                    " exponent are not seen by the data"
                )
        return out


LAWS: dict[str, Law] = {
    "additive": Additive(
        "additive", "E + A/N^α + B/D^β", ("ln A", "α", "ln B", "β", "ln E"), ("alpha", "beta"), True, False
    ),
    "kaplan": Kaplan(
        "kaplan",
        "[(N_c/N)^(α_N/α_D) + D_c/D]^α_D",
        ("ln N_c", "α_N/α_D", "ln D_c", "α_D"),
        ("alpha_N", "alpha_D"),
        False,
        True,
    ),
    "kaplan_e": Kaplan(
        "kaplan_e",
        "E + [(N_c/N)^(α_N/α_D) + D_c/D]^α_D",
        ("ln N_c", "α_N/α_D", "ln D_c", "α_D", "ln E"),
        ("alpha_N", "alpha_D"),
        True,
        True,
    ),
}
"""Every law :mod:`trilm.scaling.lawfit` can fit, by name."""


def get_law(name: str) -> Law:
    try:
        return LAWS[name]
    except KeyError:
        raise FitError(f"unknown law {name!r}; choose from {', '.join(LAWS)}") from None


def law_loss(name: str, params: dict[str, float], n, d) -> np.ndarray:
    """The loss of law ``name`` with natural ``params`` at ``(n, d)``: for drawing synthetic data."""
    n, d = np.broadcast_arrays(np.asarray(n, float), np.asarray(d, float))
    if name == "additive":
        return params["E"] + params["A"] / n ** params["alpha"] + params["B"] / d ** params["beta"]
    get_law(name)
    bracket = (params["N_c"] / n) ** (params["alpha_N"] / params["alpha_D"]) + params["D_c"] / d
    return params.get("E", 0.0) * (name == "kaplan_e") + bracket ** params["alpha_D"]


__all__ = ["LAWS", "JacobianHuber", "Law", "get_law", "law_loss"]
