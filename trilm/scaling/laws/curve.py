"""Laws of the loss along a run under any learning-rate schedule, fitted on loss curves.

=================  ======================================================  ===================================
name               law                                                     fitted parameters θ
=================  ======================================================  ===================================
``tissue``         L0 + A·S1^(−α) − C·S2 (Tissue et al. 2024)              ln L0, ln A, α, ln C
``tissue_lambda``  the same with its momentum λ fitted                     ln L0, ln A, α, ln C, ln h
                   (h = 1/(1 − λ), the annealing memory in steps)
``multipower``     L0 + A·S1^(−α) − B·Σ_k (η_{k−1} − η_k)·G(η_k^(−γ)·S_k)   ln L0, ln A, α, ln B, ln C, β, γ
                   with G(x) = 1 − (C·x + 1)^(−β) (Luo et al. 2025)
=================  ======================================================  ===================================

Both write the curve through sums of the run's own learning rate η, normalised by its peak:

- the forward area ``S1(t) = Σ_{i≤t} η_i``, how far the optimizer has moved; warm-up steps count at the peak
  rate (Tissue et al.'s protocol; it also stands in for Luo et al.'s warm-up area S_W);
- Tissue's annealing area ``S2(t) = Σ_{i≤t} m_i`` with ``m_i = λ·m_{i−1} + (η_{i−1} − η_i)`` (λ = 0.999):
  how much of the rate has been taken away, with momentum;
- Luo's loss drop weighs each decrease of the rate by how far the run has moved since, ``S_k(t) =
  Σ_{τ=k..t} η_τ``, through a saturating G.

Why λ fitted: with λ fixed at 0.999 the annealing area of a cooldown much shorter than 1/(1 − λ) = 1000 steps
grows linearly with its length, so C fitted on short cooldown branches over-forecasts a run's longer
cooldown; on the cooldown suite (runs of 2,048 steps, cooldowns of 51 to 410 steps) the gain saturates
sooner. ``tissue_lambda`` fits the memory where cooldowns of several lengths (or a decaying schedule) show
it; with S2 = Σ_k (η_{k−1} − η_k)·(1 − λ^(t−k+1))/(1 − λ) it is the same law.

Why two families: Tissue's law has one annealing parameter and fits a few checkpoints; the multi-power
law's shape of the drop (β, γ, C nearly constant across sizes in Luo et al.) is what a run still in its
stable phase can borrow from runs that have decayed (:mod:`trilm.scaling.forecast`). Data are a list of
:class:`trilm.scaling.curves.LossCurve` of one model; its points are every step with a loss.

The multi-power drop and the fitted-λ annealing area are sums over every step where the rate fell. A schedule
that falls at more than :data:`MAX_DROPS` steps (a cosine over a long run) is summed over that many
consecutive blocks of steps, each block's decrease placed at its middle step: the laws' own quadrature, exact
where the rate falls at few steps (a WSD cooldown of up to that many steps, a step schedule).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from trilm.scaling.curves import LossCurve
from trilm.scaling.errors import FitError
from trilm.scaling.laws.base import Law, product_grid, register

MOMENTUM = 0.999
"""Tissue's λ."""
MAX_DROPS = 128
MIN_ETA = 1e-6
"""η_k below this (a rate decayed to 0) is taken as this in η_k^(−γ): G is then 1 to within rounding."""


def normalised_rates(lr: np.ndarray) -> np.ndarray:
    """η / peak, with the warm-up (every step before the first peak) at the peak."""
    eta = np.asarray(lr, float) / float(np.max(lr))
    eta[: int(np.argmax(eta))] = 1.0
    return eta


def areas(lr: np.ndarray, momentum: float = MOMENTUM) -> tuple[np.ndarray, np.ndarray]:
    """``(S1, S2)`` after each step (index ``s − 1`` for step ``s``) of a schedule's per-step rates."""
    eta = normalised_rates(lr)
    drop = np.concatenate([[0.0], eta[:-1] - eta[1:]])
    m = np.empty_like(eta)
    acc = 0.0
    for i, d in enumerate(drop):
        acc = momentum * acc + d
        m[i] = acc
    return np.cumsum(eta), np.cumsum(m)


def _curves(data: Any, law: str) -> list[LossCurve]:
    if isinstance(data, LossCurve):
        return [data]
    if not isinstance(data, Sequence) or not data or not all(isinstance(c, LossCurve) for c in data):
        raise FitError(f"{law}: data must be one or more loss curves (trilm.scaling.curves.LossCurve)")
    return list(data)


@dataclasses.dataclass
class CurveDesign:
    """Per point: its curve, step, forward area S1 and annealing area S2; for the multi-power law and a
    fitted λ the (point, drop) pairs: the point, the decrease of η there, ln η, the area and steps since."""

    curve: np.ndarray
    step: np.ndarray
    s1: np.ndarray
    s2: np.ndarray
    pair_point: np.ndarray
    pair_drop: np.ndarray
    pair_log_eta: np.ndarray
    pair_area: np.ndarray
    pair_steps: np.ndarray
    pair_starts: np.ndarray
    pair_points: np.ndarray

    @property
    def n(self) -> int:
        return int(self.step.size)

    def segment_sum(self, values: np.ndarray) -> np.ndarray:
        """Σ over each point's pairs of ``values (B, pairs)``: ``(B, n)``, 0 where a point has none."""
        out = np.zeros((values.shape[0], self.n))
        if self.pair_starts.size:
            out[:, self.pair_points] = np.add.reduceat(values, self.pair_starts, axis=1)
        return out


def _drop_blocks(eta: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Blocks of steps where η falls: (first step index, last step index, representative index) each."""
    drop = np.concatenate([[0.0], eta[:-1] - eta[1:]])
    where = np.flatnonzero(drop != 0.0)
    if where.size <= MAX_DROPS:
        return where, where, where
    chunks = np.array_split(where, MAX_DROPS)
    first = np.array([c[0] for c in chunks])
    last = np.array([c[-1] for c in chunks])
    return first, last, (first + last) // 2


def curve_design(curves: list[LossCurve], momentum: float = MOMENTUM, pairs: bool = False) -> CurveDesign:
    cols: dict[str, list[np.ndarray]] = {k: [] for k in ("curve", "step", "s1", "s2")}
    pp: dict[str, list[np.ndarray]] = {k: [] for k in ("point", "drop", "log_eta", "area", "steps")}
    offset = 0
    for c, curve in enumerate(curves):
        eta = normalised_rates(curve.lr)
        s1, s2 = areas(curve.lr, momentum)
        idx: np.ndarray = curve.steps - 1
        cols["curve"].append(np.full(idx.size, c))
        cols["step"].append(curve.steps)
        cols["s1"].append(s1[idx])
        cols["s2"].append(s2[idx])
        if pairs:
            drop = np.concatenate([[0.0], eta[:-1] - eta[1:]])
            cum_drop = np.cumsum(drop)
            first, last, mid = _drop_blocks(eta)
            for j, t in enumerate(idx):
                live = first <= t
                if not live.any():
                    continue
                f, e, m = first[live], np.minimum(last[live], t), np.minimum(mid[live], t)
                block = cum_drop[e] - np.where(f > 0, cum_drop[np.maximum(f - 1, 0)], 0.0)
                pp["point"].append(np.full(f.size, offset + j))
                pp["drop"].append(block)
                pp["log_eta"].append(np.log(np.maximum(eta[m], MIN_ETA)))
                pp["area"].append(s1[t] - np.where(m > 0, s1[np.maximum(m - 1, 0)], 0.0))
                pp["steps"].append((t - m + 1).astype(float))
        offset += idx.size
    cat = {k: np.concatenate(v) if v else np.empty(0) for k, v in cols.items()}
    pcat = {k: np.concatenate(v) if v else np.empty(0) for k, v in pp.items()}
    point: np.ndarray = pcat["point"].astype(int)
    starts = (
        np.flatnonzero(np.concatenate([[True], point[1:] != point[:-1]])) if point.size else np.empty(0, int)
    )
    return CurveDesign(
        curve=cat["curve"].astype(int),
        step=cat["step"].astype(int),
        s1=cat["s1"],
        s2=cat["s2"],
        pair_point=point,
        pair_drop=pcat["drop"],
        pair_log_eta=pcat["log_eta"],
        pair_area=pcat["area"],
        pair_steps=pcat["steps"],
        pair_starts=starts,
        pair_points=point[starts] if point.size else np.empty(0, int),
    )


def _stable_terms(theta: np.ndarray, design: CurveDesign) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every curve law's L0 + A·S1^(−α) part, ``(B, n)`` each: the floor, the power term and its derivative
    in α (the derivatives in ln L0 and ln A are the terms themselves)."""
    log_s1 = np.log(design.s1)[None]
    with np.errstate(over="ignore", invalid="ignore"):
        power = np.exp(theta[:, 1, None] - theta[:, 2, None] * log_s1)
        return np.exp(theta[:, 0, None]) + 0.0 * power, power, -power * log_s1


class CurveLaw(Law):
    """A law of the loss along runs of one model: data are loss curves, points are their measured steps."""

    kind = "curve"
    exponents: ClassVar[tuple[str, ...]] = ("alpha",)
    anneal_theta: ClassVar[str]
    """The θ entry that scales what annealing buys: 0 (−∞ in log) where no data saw the rate fall."""
    uses_pairs = False

    def design(self, data: Any) -> CurveDesign:
        curves = _curves(data, self.name)
        return curve_design(curves, pairs=self.uses_pairs)

    def observed(self, data: Any) -> np.ndarray:
        curves = _curves(data, self.name)
        return np.concatenate([c.loss for c in curves]) if curves else np.empty(0)

    def units(self, data: Any) -> list[Any]:
        """Each curve is a unit; with fewer than three curves, blocks of consecutive points within each
        curve (eight per curve), so that refits see whole stretches of the curve missing, not single
        points."""
        curves = _curves(data, self.name)
        out: list[Any] = []
        for c, curve in enumerate(curves):
            if len(curves) >= 3:
                out += [c] * curve.steps.size
            else:
                blocks: np.ndarray = np.arange(curve.steps.size) * 8 // max(curve.steps.size, 1)
                out += [(c, int(b)) for b in blocks]
        return out

    def check_fittable(self, data: Any) -> None:
        loss = self.observed(data)
        if loss.size <= self.n_params:
            raise FitError(
                f"{self.name}: {loss.size} points for {self.n_params} parameters: too early to fit"
            )

    def extra_reasons(self, params: dict[str, float], design: Any, loss: np.ndarray) -> list[str]:
        """L0 is the floor of the curve at a constant rate, so annealing may take a loss below it: the rule
        is that L0 lies below every measured loss with the fitted annealing gain added back."""
        out = []
        steady = params["L0"] + params["A"] * design.s1 ** -params["alpha"]
        with np.errstate(over="ignore", invalid="ignore"):
            gain = steady - np.exp(self.log_predict(self.theta(params), design)[0])
        lowest = float(np.nanmin(loss + gain))
        if params["L0"] < 0.01 * lowest:
            out.append(f"L0 = {params['L0']:.3g} ≈ 0 (the floor is not identified)")
        elif params["L0"] >= lowest:
            out.append(
                f"L0 = {params['L0']:.4g} is not below the lowest loss without annealing, {lowest:.4f}"
            )
        if float(np.max(design.s2)) == 0.0:
            out.append("no point after any decrease of the rate: what annealing buys is not seen")
        return out


@register
class Tissue(CurveLaw):
    name = "tissue"
    formula = "L0 + A·S1^(−α) − C·S2"
    theta_names: ClassVar[tuple[str, ...]] = ("ln L0", "ln A", "alpha", "ln C")
    anneal_theta = "ln C"
    box: ClassVar[tuple[tuple[float, float], ...]] = ((-3.0, 3.0), (-5.0, 12.0), (0.0, 2.0), (-30.0, 5.0))

    def natural(self, theta: np.ndarray) -> dict[str, float]:
        t = np.asarray(theta, float)
        with np.errstate(over="ignore"):
            return {
                "L0": float(np.exp(t[0])),
                "A": float(np.exp(t[1])),
                "alpha": float(t[2]),
                "C": float(np.exp(t[3])),
            }

    def theta(self, params: Mapping[str, float]) -> np.ndarray:
        c = params["C"]
        return np.array(
            [np.log(params["L0"]), np.log(params["A"]), params["alpha"], np.log(c) if c > 0 else -np.inf],
            float,
        )

    def grid(self) -> np.ndarray:
        return product_grid([0.0, 0.75, 1.5], [0.0, 1.5, 3.0, 4.5], [0.2, 0.5, 1.0], [-10.0, -7.0, -4.0])

    def log_predict_jac(self, theta: np.ndarray, design: CurveDesign) -> tuple[np.ndarray, np.ndarray]:
        theta = np.atleast_2d(theta)
        floor, power, d_alpha = _stable_terms(theta, design)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            anneal = np.exp(theta[:, 3, None]) * design.s2[None]
            value = floor + power - anneal
            value = np.where(value > 0, value, np.nan)
            jac = np.stack([floor, power, d_alpha, -anneal], axis=1) / value[:, None]
            return np.log(value), jac


@register
class MultiPower(CurveLaw):
    name = "multipower"
    formula = "L0 + A·S1^(−α) − B·Σ_k (η_{k−1} − η_k)·(1 − (C·η_k^(−γ)·S_k + 1)^(−β))"
    theta_names = ("ln L0", "ln A", "alpha", "ln B", "ln C", "beta", "gamma")
    anneal_theta = "ln B"
    exponents = ("alpha", "beta")
    box = ((-3.0, 3.0), (-5.0, 12.0), (0.0, 2.0), (-12.0, 5.0), (-15.0, 8.0), (0.0, 2.0), (-0.5, 3.0))
    uses_pairs = True

    def natural(self, theta: np.ndarray) -> dict[str, float]:
        t = np.asarray(theta, float)
        with np.errstate(over="ignore"):
            return {
                "L0": float(np.exp(t[0])),
                "A": float(np.exp(t[1])),
                "alpha": float(t[2]),
                "B": float(np.exp(t[3])),
                "C": float(np.exp(t[4])),
                "beta": float(t[5]),
                "gamma": float(t[6]),
            }

    def theta(self, params: Mapping[str, float]) -> np.ndarray:
        return np.array(
            [
                np.log(params["L0"]),
                np.log(params["A"]),
                params["alpha"],
                np.log(params["B"]),
                np.log(params["C"]),
                params["beta"],
                params["gamma"],
            ],
            float,
        )

    def grid(self) -> np.ndarray:
        return product_grid(
            [0.0, 1.0], [1.0, 3.0], [0.3, 0.6], [-2.0, -0.5], [-5.0, -2.0], [0.4, 0.8], [0.3, 0.6]
        )

    def coarse_grid(self) -> np.ndarray:
        return product_grid([0.5], [2.0], [0.4], [-1.0], [-4.0, -1.0], [0.6], [0.3, 0.6])

    def log_predict_jac(self, theta: np.ndarray, design: CurveDesign) -> tuple[np.ndarray, np.ndarray]:
        theta = np.atleast_2d(theta)
        b = theta.shape[0]
        floor, power, d_alpha = _stable_terms(theta, design)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            coef_b, coef_c = np.exp(theta[:, 3, None]), np.exp(theta[:, 4, None])
            beta, gamma = theta[:, 5, None], theta[:, 6, None]
            cx = coef_c * np.exp(-gamma * design.pair_log_eta[None]) * design.pair_area[None]
            log_u = np.log1p(cx)
            u_neg_beta = np.exp(-beta * log_u)
            g = 1.0 - u_neg_beta
            d = design.pair_drop[None]
            slope = d * beta * u_neg_beta / (1.0 + cx) * cx
            drop = coef_b * design.segment_sum(d * g)
            d_lnc = coef_b * design.segment_sum(slope)
            d_beta = coef_b * design.segment_sum(d * u_neg_beta * log_u)
            d_gamma = coef_b * design.segment_sum(-slope * design.pair_log_eta[None])
            value = floor + power - drop
            value = np.where(value > 0, value, np.nan)
            jac = np.empty((b, 7, design.n))
            jac[:, 0], jac[:, 1], jac[:, 2] = floor, power, d_alpha
            jac[:, 3], jac[:, 4], jac[:, 5], jac[:, 6] = -drop, -d_lnc, -d_beta, -d_gamma
            return np.log(value), jac / value[:, None]


@register
class TissueLambda(Tissue):
    name = "tissue_lambda"
    formula = "L0 + A·S1^(−α) − C·Σ_k (η_{k−1} − η_k)·(1 − λ^(t−k+1))/(1 − λ)"
    theta_names = (*Tissue.theta_names, "ln h")
    box = (*Tissue.box, (0.7, 11.5))
    uses_pairs = True

    def natural(self, theta: np.ndarray) -> dict[str, float]:
        t = np.asarray(theta, float)
        with np.errstate(over="ignore"):
            return super().natural(t[:4]) | {"h": float(np.exp(t[4]))}

    def theta(self, params: Mapping[str, float]) -> np.ndarray:
        return np.append(super().theta(params), np.log(params["h"]))

    def grid(self) -> np.ndarray:
        tissue = super().grid()
        memory = np.tile([[4.0], [6.9]], (len(tissue), 1))
        return np.hstack([np.repeat(tissue, 2, axis=0), memory])

    def coarse_grid(self) -> np.ndarray:
        return self.grid()[::4]

    def plausibility(self, theta: np.ndarray, design: Any, loss: np.ndarray) -> list[str]:
        """A memory at the top of its box is Tissue's own regime (λ → 1, S2 linear in the cooldown), not
        an implausible fit; every other rule is the law's."""
        return [r for r in super().plausibility(theta, design, loss) if not r.startswith("ln h =")]

    def log_predict_jac(self, theta: np.ndarray, design: CurveDesign) -> tuple[np.ndarray, np.ndarray]:
        theta = np.atleast_2d(theta)
        floor, power, d_alpha = _stable_terms(theta, design)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            coef_c = np.exp(theta[:, 3, None])
            h = np.exp(theta[:, 4, None])
            kept = np.exp(design.pair_steps[None] * np.log1p(-1.0 / h))
            d = design.pair_drop[None]
            s2 = design.segment_sum(d * h * (1.0 - kept))
            ds2 = design.segment_sum(d * h * (1.0 - kept - design.pair_steps[None] * kept / (h - 1.0)))
            anneal = coef_c * s2
            value = floor + power - anneal
            value = np.where(value > 0, value, np.nan)
            jac = np.stack([floor, power, d_alpha, -anneal, -coef_c * ds2], axis=1)
            return np.log(value), jac / value[:, None]


__all__ = [
    "MOMENTUM",
    "CurveDesign",
    "CurveLaw",
    "MultiPower",
    "Tissue",
    "TissueLambda",
    "areas",
    "curve_design",
    "normalised_rates",
]
