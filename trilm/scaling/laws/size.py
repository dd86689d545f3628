"""Laws of the loss over model size, data and precision: points of a results table.

=============  ========================================================  =====================================
name           law                                                       fitted parameters θ
=============  ========================================================  =====================================
``n``          E + A/N^α                                                 ln A, α, ln E
``d``          E + B/D^β                                                 ln B, β, ln E
``additive``   E + A/N^α + B/D^β (Chinchilla approach 3)                 ln A, α, ln B, β, ln E
``kaplan``     [(N_c/N)^(α_N/α_D) + D_c/D]^α_D (Kaplan et al. 2020)      ln N_c, α_N/α_D, ln D_c, α_D
``kaplan_e``   E + [(N_c/N)^(α_N/α_D) + D_c/D]^α_D                       ln N_c, α_N/α_D, ln D_c, α_D, ln E
``precision``  E + A/N_eff^α + B/D^β, N_eff = N·(1 − e^(−P/γ))           ln A, α, ln B, β, ln E, ln γ
=============  ========================================================  =====================================

Why several: the additive law makes the gap between two sizes the same at every D, while Kaplan's couples N
and D (data-limited sizes alike at small D, size-limited at large D). The precision law (Kumar et al. 2024's
effective parameter count) puts FloatLM, TriLM and BiLM on one surface through their bits per weight P, so
one family's held-out size can be predicted from the other families' runs: a 16-bit model has N_eff ≈ N,
a ternary one (P = log2 3) a fraction of it that γ sets.

Each is ``log L̂ = LSE(terms)`` so that no coefficient needs a bound; Kaplan's bracket is itself a log-sum-exp,
``log[·] = LSE(r·(ln N_c − ln N), ln D_c − ln D)`` with ``r = α_N/α_D`` (the N term depends on r alone).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from trilm.scaling.laws.base import SizeLaw, lse_jac, product_grid, register

COEF_BOX = (0.0, 25.0)
EXP_BOX = (0.0, 2.0)
FLOOR_BOX = (-3.0, 3.0)
SCALE_BOX = (0.0, 60.0)
"""ln N_c and ln D_c: without E, Kaplan's critical scales lie far beyond the data (his N_c = 8.8e13)."""


class PowerSum(SizeLaw):
    """E + Σ_j C_j / X_j^(a_j) over one or more inputs: θ = [ln C_1, a_1, …, ln E]."""

    coef_names: tuple[str, ...]

    def natural(self, theta: np.ndarray) -> dict[str, float]:
        theta = np.asarray(theta, float)
        out = {"E": float(np.exp(theta[-1]))}
        with np.errstate(over="ignore"):
            for k, (c, x) in enumerate(zip(self.coef_names, self.exponents)):
                out[c] = float(np.exp(theta[2 * k]))
                out[x] = float(theta[2 * k + 1])
        return out

    def theta(self, params: Mapping[str, float]) -> np.ndarray:
        out: list[float] = []
        for c, x in zip(self.coef_names, self.exponents):
            out += [float(np.log(params[c])), float(params[x])]
        return np.array([*out, float(np.log(params["E"]))])

    def grid(self) -> np.ndarray:
        """Hoffmann's grid: log-coefficients 0…25 by 5, exponents 0…2 by 0.5, ln E −1…1 by 0.5."""
        axes: list[list[float]] = []
        for _ in self.coef_names:
            axes += [[0.0, 5.0, 10.0, 15.0, 20.0, 25.0], [0.0, 0.5, 1.0, 1.5, 2.0]]
        return product_grid(*axes, [-1.0, -0.5, 0.0, 0.5, 1.0])

    def coarse_grid(self) -> np.ndarray:
        axes: list[list[float]] = []
        for _ in self.coef_names:
            axes += [[0.0, 10.0, 20.0], [0.25, 0.75, 1.5]]
        return product_grid(*axes, [-1.0, 0.0, 1.0])

    def terms(self, theta: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        b, p, n = theta.shape[0], theta.shape[1], x.shape[1]
        k = len(self.coef_names)
        u = np.empty((b, k + 1, n))
        du = np.zeros((b, k + 1, p, n))
        for j in range(k):
            u[:, j] = theta[:, 2 * j, None] - theta[:, 2 * j + 1, None] * x[j]
            du[:, j, 2 * j] = 1.0
            du[:, j, 2 * j + 1] = -x[j]
        u[:, k] = theta[:, -1, None]
        du[:, k, -1] = 1.0
        return u, du

    def _shares(self, theta: np.ndarray, design: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(log L̂ ``(B, n)``, each term's share of the loss ``(B, k + 1, n)``)."""
        k = len(self.coef_names)
        u = np.empty((theta.shape[0], k + 1, design.shape[1]))
        for j in range(k):
            np.multiply(theta[:, 2 * j + 1, None], design[j], out=u[:, j])
            np.subtract(theta[:, 2 * j, None], u[:, j], out=u[:, j])
        u[:, k] = theta[:, -1, None]
        top = u.max(axis=1, keepdims=True)
        u -= top
        np.exp(u, out=u)
        total = u.sum(axis=1, keepdims=True)
        u /= total
        return (top + np.log(total))[:, 0], u

    def log_predict_vjp(self, theta: np.ndarray, design: np.ndarray) -> tuple[np.ndarray, Any]:
        """log L̂ and the map ``v ↦ vᵀ·∂ log L̂/∂θ`` without the ``(B, P, n)`` Jacobian: the objective needs
        only that product, and a Hoffmann grid of 4,500 starts makes the Jacobian the fit's largest array."""
        theta = np.atleast_2d(theta)
        pred, u = self._shares(theta, design)
        k = len(self.coef_names)

        def pullback(v: np.ndarray) -> np.ndarray:
            g = np.empty(theta.shape)
            for j in range(k):
                weighted = u[:, j] * v
                g[:, 2 * j] = weighted.sum(axis=1)
                g[:, 2 * j + 1] = -(weighted @ design[j])
            g[:, -1] = np.einsum("bn,bn->b", u[:, k], v)
            return g

        return pred, pullback

    def log_predict_jac(self, theta: np.ndarray, design: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The log-sum-exp of the terms with its Jacobian written out: each term's share of the loss is the
        derivative in its log-coefficient, minus its share times the log input the one in its exponent."""
        theta = np.atleast_2d(theta)
        pred, u = self._shares(theta, design)
        k = len(self.coef_names)
        jac = np.empty((theta.shape[0], theta.shape[1], design.shape[1]))
        for j in range(k):
            jac[:, 2 * j] = u[:, j]
            np.multiply(u[:, j], -design[j], out=jac[:, 2 * j + 1])
        jac[:, -1] = u[:, k]
        return pred, jac


@register
class PowerN(PowerSum):
    name = "n"
    formula = "E + A/N^α"
    inputs = ("N",)
    theta_names = ("ln A", "alpha", "ln E")
    coef_names = ("A",)
    exponents = ("alpha",)
    floor = "E"
    box = (COEF_BOX, EXP_BOX, FLOOR_BOX)


@register
class PowerD(PowerSum):
    name = "d"
    formula = "E + B/D^β"
    inputs = ("D",)
    theta_names = ("ln B", "beta", "ln E")
    coef_names = ("B",)
    exponents = ("beta",)
    floor = "E"
    box = (COEF_BOX, EXP_BOX, FLOOR_BOX)


@register
class Additive(PowerSum):
    name = "additive"
    formula = "E + A/N^α + B/D^β"
    inputs = ("N", "D")
    theta_names = ("ln A", "alpha", "ln B", "beta", "ln E")
    coef_names = ("A", "B")
    exponents = ("alpha", "beta")
    floor = "E"
    box = (COEF_BOX, EXP_BOX, COEF_BOX, EXP_BOX, FLOOR_BOX)


class KaplanBase(SizeLaw):
    """[(N_c/N)^(α_N/α_D) + D_c/D]^α_D, plus E when :attr:`has_e`."""

    inputs = ("N", "D")
    exponents = ("alpha_N", "alpha_D")
    restart_grid = True
    has_e: bool

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

    def theta(self, params: Mapping[str, float]) -> np.ndarray:
        out = [
            float(np.log(params["N_c"])),
            params["alpha_N"] / params["alpha_D"],
            float(np.log(params["D_c"])),
            params["alpha_D"],
        ]
        if self.has_e:
            out.append(float(np.log(params["E"])))
        return np.array(out, float)

    def grid(self) -> np.ndarray:
        """ln N_c 0…40, α_N/α_D 0.5…4, ln D_c 10…40, α_D 0.05…1 (Kaplan's own α_D is 0.095)."""
        axes = [
            [0.0, 10.0, 20.0, 30.0, 40.0],
            [0.5, 1.0, 2.0, 4.0],
            [10.0, 15.0, 20.0, 30.0, 40.0],
            [0.05, 0.1, 0.3, 0.6, 1.0],
        ]
        return product_grid(*axes, *([[-1.0, 0.0, 0.5, 1.0, 1.5]] if self.has_e else []))

    def coarse_grid(self) -> np.ndarray:
        axes = [[10.0, 25.0], [0.5, 2.0], [15.0, 30.0], [0.1, 0.5]]
        return product_grid(*axes, *([[0.0, 1.0]] if self.has_e else []))

    def terms(self, theta: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        b, p, n = theta.shape[0], theta.shape[1], x.shape[1]
        log_nc, ratio, log_dc, alpha_d = (theta[:, j, None] for j in range(4))
        gap_n = log_nc - x[0]
        inner = np.stack([ratio * gap_n, log_dc - x[1]], axis=1)
        dinner = np.zeros((b, 2, p, n))
        dinner[:, 0, 0] = ratio
        dinner[:, 0, 1] = gap_n
        dinner[:, 1, 2] = 1.0
        s, ds = lse_jac(inner, dinner)
        u = np.empty((b, 2 if self.has_e else 1, n))
        du = np.zeros((b, u.shape[1], p, n))
        u[:, 0] = alpha_d * s
        du[:, 0] = alpha_d[:, None] * ds
        du[:, 0, 3] = s
        if self.has_e:
            u[:, 1] = theta[:, 4, None]
            du[:, 1, 4] = 1.0
        return u, du

    def extra_reasons(self, params: dict[str, float], design: np.ndarray, loss: np.ndarray) -> list[str]:
        out = super().extra_reasons(params, design, loss) if self.has_e else []
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            ratio = params["alpha_N"] / params["alpha_D"]
            u1 = ratio * (np.log(params["N_c"]) - design[0])
            u2 = np.log(params["D_c"]) - design[1]
            share_n = 1.0 / (1.0 + np.exp(np.clip(np.nan_to_num(u2 - u1), -700, 700)))
        for name, share in (("(N_c/N)", share_n), ("D_c/D", 1.0 - share_n)):
            if float(np.max(share)) < 1e-3:
                out.append(
                    f"the {name} term is below 1e-3 of the bracket at every point: its scale is not seen"
                )
        return out


@register
class Kaplan(KaplanBase):
    name = "kaplan"
    formula = "[(N_c/N)^(α_N/α_D) + D_c/D]^α_D"
    theta_names = ("ln N_c", "alpha_N/alpha_D", "ln D_c", "alpha_D")
    has_e = False
    box = (SCALE_BOX, (0.0, 20.0), SCALE_BOX, EXP_BOX)


@register
class KaplanE(KaplanBase):
    name = "kaplan_e"
    formula = "E + [(N_c/N)^(α_N/α_D) + D_c/D]^α_D"
    theta_names = ("ln N_c", "alpha_N/alpha_D", "ln D_c", "alpha_D", "ln E")
    floor = "E"
    has_e = True
    box = (SCALE_BOX, (0.0, 20.0), SCALE_BOX, EXP_BOX, FLOOR_BOX)


@register
class Precision(SizeLaw):
    """E + A/N_eff^α + B/D^β with N_eff = N·(1 − e^(−P/γ)): one law across families of different precision.

    P is the bits per weight of the model's linear layers (16 for a FloatLM, log2 3 ≈ 1.58 for a TriLM,
    1 for a BiLM). With several precisions in the data γ is identified by how far a low-precision family's
    losses sit from the float family's at the same N; with one precision it is not, and the fit says so.
    """

    name = "precision"
    formula = "E + A/(N·(1 − e^(−P/γ)))^α + B/D^β"
    inputs = ("N", "D", "P")
    log_inputs = (True, True, False)
    theta_names = ("ln A", "alpha", "ln B", "beta", "ln E", "ln gamma")
    exponents = ("alpha", "beta")
    floor = "E"
    box = (COEF_BOX, EXP_BOX, COEF_BOX, EXP_BOX, FLOOR_BOX, (-5.0, 5.0))

    def varying_inputs(self) -> tuple[str, ...]:
        return ("N", "D")

    def natural(self, theta: np.ndarray) -> dict[str, float]:
        t = np.asarray(theta, float)
        with np.errstate(over="ignore"):
            return {
                "A": float(np.exp(t[0])),
                "alpha": float(t[1]),
                "B": float(np.exp(t[2])),
                "beta": float(t[3]),
                "E": float(np.exp(t[4])),
                "gamma": float(np.exp(t[5])),
            }

    def theta(self, params: Mapping[str, float]) -> np.ndarray:
        return np.array(
            [
                np.log(params["A"]),
                params["alpha"],
                np.log(params["B"]),
                params["beta"],
                np.log(params["E"]),
                np.log(params["gamma"]),
            ],
            float,
        )

    def grid(self) -> np.ndarray:
        return product_grid(
            [0.0, 5.0, 10.0, 20.0],
            [0.25, 0.5, 1.0],
            [0.0, 5.0, 10.0, 20.0],
            [0.25, 0.5, 1.0],
            [0.0, 1.0],
            [-1.0, 0.0, 1.0],
        )

    def coarse_grid(self) -> np.ndarray:
        return product_grid([5.0, 15.0], [0.3, 0.8], [5.0, 15.0], [0.3, 0.8], [0.5], [-0.5, 0.5])

    def terms(self, theta: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        b, p, n = theta.shape[0], theta.shape[1], x.shape[1]
        q = x[2][None] / np.exp(theta[:, 5, None])
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            log_frac = np.log(-np.expm1(-q))
            dlog_frac = -q * np.exp(-q) / -np.expm1(-q)
        log_neff = x[0][None] + log_frac
        u = np.empty((b, 3, n))
        du = np.zeros((b, 3, p, n))
        alpha = theta[:, 1, None]
        u[:, 0] = theta[:, 0, None] - alpha * log_neff
        du[:, 0, 0] = 1.0
        du[:, 0, 1] = -log_neff
        du[:, 0, 5] = -alpha * dlog_frac
        u[:, 1] = theta[:, 2, None] - theta[:, 3, None] * x[1]
        du[:, 1, 2] = 1.0
        du[:, 1, 3] = -x[1]
        u[:, 2] = theta[:, 4, None]
        du[:, 2, 4] = 1.0
        return u, du

    def extra_reasons(self, params: dict[str, float], design: np.ndarray, loss: np.ndarray) -> list[str]:
        out = super().extra_reasons(params, design, loss)
        if np.unique(design[2]).size < 2:
            out.append("one precision in the data: γ (the cost of fewer bits) is not identified")
        return out


__all__ = ["Additive", "Kaplan", "KaplanE", "PowerD", "PowerN", "Precision"]
