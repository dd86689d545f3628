"""One curve law over several models at once: each model its own parameters, the named ones shared.

Why: a run still in its stable phase has seen no decrease of its rate, so its annealing parameters are not
identified by its own curve; a small run has too few checkpoints to pin its floor and exponent. Luo et al.
(2025) find the annealing part of the loss curve nearly constant across model sizes, and Tissue et al.
predict any schedule from one or two curves of a model. Fitting a suite's models together, with the
parameters they share tied, lets every model borrow what the others have seen: a run's end is forecast
from its own stable phase and the annealing the suite's cooldown branches or finished runs showed.

:class:`JointCurveLaw` is a law of the registry's kind (its θ is the shared parameters followed by each
model's own), fitted by :func:`trilm.scaling.fitter.fit` like any other; :func:`fit_jointly` fits it and
gives back one ordinary :class:`trilm.scaling.fitter.Fit` per model, whose bootstrap refits are the joint
refits (so a model's interval counts what it borrowed).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from trilm.scaling.curves import LossCurve
from trilm.scaling.errors import FitError
from trilm.scaling.fitter import Fit, fit
from trilm.scaling.laws import CurveLaw, Law, get_law

JOINT_MAX_ITER = 20000
"""L-BFGS iterations a joint fit may take: its parameters (a floor, scale and exponent per model) are many
and strongly coupled, and a suite of twelve runs needs several thousand iterations to converge."""


def _natural_name(theta_name: str) -> str:
    return theta_name[3:] if theta_name.startswith("ln ") else theta_name


def size_offsets(sizes: Sequence[float]) -> np.ndarray:
    """Each model's ln size about the models' mean ln size: the covariate of a size trend."""
    log_size = np.log(np.asarray(sizes, float))
    return log_size - log_size.mean()


class JointCurveLaw(Law):
    """``base`` over ``models`` (data: ``{model: [LossCurve, …]}``) with the natural parameters ``shared``
    tied across models. Made by :func:`joint_law`, which gives each joint its own class attributes.

    A shared parameter named in ``trended`` is tied through a power of model size instead of a constant:
    its fitted coordinate is ``θ + slope·ln(size / mean size)`` (for C, fitted as ln C, that is
    C ∝ size^slope). Why: on the cooldown suite the annealing coefficient fitted on each finished run grows
    with size in all three families (about 0.003 at 33k non-embedding parameters, 0.008–0.011 at 853k;
    ``docs/results/cooldown/forecasts.md``), so one constant C under-forecasts a larger run's cooldown
    gain."""

    kind = "curve"

    def __init__(
        self,
        base: CurveLaw,
        models: Sequence[str],
        shared: Sequence[str],
        sizes: Sequence[float] | None = None,
        trended: Sequence[str] = (),
    ) -> None:
        names = [_natural_name(t) for t in base.theta_names]
        unknown = [s for s in shared if s not in names]
        if unknown:
            raise FitError(f"{base.name}: cannot share {unknown}: its parameters are {names}")
        if not models:
            raise FitError(f"{base.name}: a joint fit needs at least one model")
        loose = [t for t in trended if t not in shared]
        if loose:
            raise FitError(f"{base.name}: a size trend ties shared parameters only, {loose} are not shared")
        if trended and (sizes is None or len(sizes) != len(models) or min(sizes) <= 0):
            raise FitError(f"{base.name}: a size trend needs one positive size per model, got {sizes}")
        self.base, self.models = base, list(models)
        self.shared_index = [i for i, n in enumerate(names) if n in shared]
        self.own_index = [i for i, n in enumerate(names) if n not in shared]
        self.trend_of = [j for j, i in enumerate(self.shared_index) if names[i] in trended]
        self.offsets = size_offsets(sizes) if trended and sizes is not None else np.zeros(len(self.models))

    def model_theta(self, theta: np.ndarray, m: int) -> np.ndarray:
        """The base law's θ ``(B, P)`` of model ``m`` from joint θ ``(B, P_joint)``."""
        theta = np.atleast_2d(theta)
        out = np.empty((theta.shape[0], self.base.n_params))
        k, t, o = len(self.shared_index), len(self.trend_of), len(self.own_index)
        out[:, self.shared_index] = theta[:, :k]
        for r, j in enumerate(self.trend_of):
            out[:, self.shared_index[j]] += theta[:, k + r] * self.offsets[m]
        out[:, self.own_index] = theta[:, k + t + m * o : k + t + (m + 1) * o]
        return out

    def joint_theta(self, thetas: Sequence[np.ndarray]) -> np.ndarray:
        """Joint θ from one base θ per model; shared entries are their median, trends start flat."""
        stack = np.array(thetas, float)
        shared = np.median(stack[:, self.shared_index], axis=0)
        slopes = np.zeros(len(self.trend_of))
        return np.concatenate([shared, slopes, *[t[self.own_index] for t in stack]])

    def natural(self, theta: np.ndarray) -> dict[str, float]:
        out: dict[str, float] = {}
        for m, model in enumerate(self.models):
            for k, v in self.base.natural(self.model_theta(theta, m)[0]).items():
                out[f"{k} [{model}]"] = v
        return out

    def theta(self, params: Mapping[str, float]) -> np.ndarray:
        raise NotImplementedError("a joint law is fitted from data, not built from natural parameters")

    def grid(self) -> np.ndarray:
        raise FitError("a joint fit starts from its models' own fits: use fit_jointly")

    def _split(self, data: Any) -> list[list[LossCurve]]:
        if not isinstance(data, Mapping) or list(data) != self.models:
            raise FitError(f"{self.name}: joint data must map each of {self.models} to its curves, in order")
        return [list(data[m]) for m in self.models]

    def design(self, data: Any) -> list[Any]:
        return [self.base.design(curves) for curves in self._split(data)]

    def observed(self, data: Any) -> np.ndarray:
        return np.concatenate([self.base.observed(curves) for curves in self._split(data)])

    def units(self, data: Any) -> list[Any]:
        return [(m, u) for m, curves in zip(self.models, self._split(data)) for u in self.base.units(curves)]

    def check_fittable(self, data: Any) -> None:
        if self.observed(data).size <= self.n_params:
            raise FitError(f"{self.name}: too few points for a joint fit of {len(self.models)} models")

    def log_predict_jac(self, theta: np.ndarray, design: list[Any]) -> tuple[np.ndarray, np.ndarray]:
        theta = np.atleast_2d(theta)
        n = sum(d.n for d in design)
        pred = np.empty((theta.shape[0], n))
        jac = np.zeros((theta.shape[0], self.n_params, n))
        k, t, o, start = len(self.shared_index), len(self.trend_of), len(self.own_index), 0
        for m, d in enumerate(design):
            p, j = self.base.log_predict_jac(self.model_theta(theta, m), d)
            cols = slice(start, start + d.n)
            pred[:, cols] = p
            jac[:, :k, cols] = j[:, self.shared_index]
            for r, jj in enumerate(self.trend_of):
                jac[:, k + r, cols] = self.offsets[m] * j[:, self.shared_index[jj]]
            jac[:, k + t + m * o : k + t + (m + 1) * o, cols] = j[:, self.own_index]
            start += d.n
        return pred, jac

    def plausibility(self, theta: np.ndarray, design: Any, loss: np.ndarray) -> list[str]:
        out, start = [], 0
        for m, d in enumerate(design):
            mine = loss[start : start + d.n]
            reasons = self.base.plausibility(self.model_theta(theta, m)[0], d, mine)
            shared_only = "no point after any decrease of the rate: what annealing buys is not seen"
            out += [f"{self.models[m]}: {r}" for r in reasons if r != shared_only]
            start += d.n
        if all(float(np.max(d.s2)) == 0.0 for d in design):
            out.append("no model has a point after any decrease of the rate: what annealing buys is not seen")
        return out


TREND_BOX = (-2.0, 2.0)
"""How far a trended parameter's coordinate may move per unit of ln size (for ln C: C ∝ size^±2)."""
TREND_START = 0.25
"""A second start for every trend's slope besides flat: about how fast C grows with size on the cooldown
suite (0.003 → 0.008–0.011 over 26x the non-embedding parameters)."""


def joint_law(
    base: CurveLaw,
    models: Sequence[str],
    shared: Sequence[str],
    sizes: Sequence[float] | None = None,
    trended: Sequence[str] = (),
) -> JointCurveLaw:
    """The joint law of ``base`` over ``models`` sharing ``shared`` (``trended`` ones as a power of
    ``sizes``): a class of its own whose parameter names, box and exponents are those of every model's copy
    of ``base``."""
    names = [_natural_name(t) for t in base.theta_names]
    shared_index = [i for i, n in enumerate(names) if n in shared]
    own_index = [i for i, n in enumerate(names) if n not in shared]
    trend = [i for i in shared_index if names[i] in trended]
    own = [f"{base.theta_names[i]} [{m}]" for m in models for i in own_index]
    attrs = {
        "name": base.name,
        "formula": base.formula,
        "exponents": tuple(f"{e} [{m}]" for m in models for e in base.exponents),
        "theta_names": tuple(
            [base.theta_names[i] for i in shared_index]
            + [f"d {base.theta_names[i]} / d ln size" for i in trend]
            + own
        ),
        "box": tuple(
            [base.box[i] for i in shared_index]
            + [TREND_BOX for _ in trend]
            + [base.box[i] for _ in models for i in own_index]
        ),
    }
    cls = type(f"Joint{base.name.title()}", (JointCurveLaw,), attrs)
    return cls(base, models, shared, sizes, trended)


def fit_jointly(
    law: str,
    data: Mapping[str, Sequence[LossCurve]],
    shared: Sequence[str],
    *,
    sizes: Mapping[str, float] | None = None,
    trended: Sequence[str] = (),
    bootstrap: int = 0,
    seed: int = 0,
    level: float = 0.95,
) -> dict[str, Fit]:
    """Fit curve law ``law`` to every model of ``data`` with ``shared`` parameters tied; one Fit per model.
    Those of them in ``trended`` vary as a power of each model's size (``sizes``: model → size, for example
    non-embedding parameters); with fewer than two distinct sizes they stay constant.

    Starts: each model's own fit (from the law's grid; a model that cannot be fitted alone starts from the
    law's first start), the shared entries at their median over the models whose points include a decrease
    of the rate (those that identify them), else over all; with a size trend, also that start with every
    slope at :data:`TREND_START`.
    """
    base = get_law(law)
    if not isinstance(base, CurveLaw):
        raise FitError(f"{law} is not a curve law: a joint fit shares parameters between loss curves")
    models = list(data)
    size_list: list[float] | None = None
    if trended and len(models) >= 2:
        missing = [m for m in models if sizes is None or m not in sizes]
        if missing or sizes is None:
            raise FitError(f"{law}: a size trend of {list(trended)} needs the size of {missing}")
        size_list = [float(sizes[m]) for m in models]
    if size_list is None or len(set(size_list)) < 2:
        trended, size_list = (), None
    joint = joint_law(base, models, shared, size_list, trended)
    solo, annealed = [], []
    for name in models:
        try:
            solo.append(fit(base, list(data[name]), starts="coarse", label=name).theta)
            annealed.append(float(np.max(base.design(list(data[name])).s2)) > 0)
        except FitError:
            solo.append(base.grid()[0])
            annealed.append(False)
    start = joint.joint_theta(solo)
    informed = [t for t, a in zip(solo, annealed) if a]
    if informed:
        start[: len(joint.shared_index)] = np.median(np.array(informed)[:, joint.shared_index], axis=0)
    starts = np.array([start, joint.joint_theta(solo)])
    if joint.trend_of:
        sloped = start.copy()
        sloped[len(joint.shared_index) : len(joint.shared_index) + len(joint.trend_of)] = TREND_START
        starts = np.vstack([starts, sloped])
    result = fit(
        joint,
        dict(data),
        starts=starts,
        bootstrap=bootstrap,
        seed=seed,
        level=level,
        max_iter=JOINT_MAX_ITER,
        label="joint",
    )
    # where no model has seen the rate fall, the annealing coefficient had no gradient and sits at its
    # start: it is set to 0, so the forecast is the loss without annealing (an upper estimate), and the
    # fit's reasons say why
    unseen = all(float(np.max(base.design(list(data[m])).s2)) == 0.0 for m in models)
    anneal = base.theta_names.index(base.anneal_theta)
    out = {}
    sharing = ", ".join(f"{s} ∝ size^k" if s in trended else s for s in shared) or "nothing"
    for m, model in enumerate(models):
        theta = joint.model_theta(result.theta, m)[0]
        boots = None if result.boot_thetas is None else joint.model_theta(result.boot_thetas, m)
        if unseen:
            theta[anneal] = -np.inf
            if boots is not None:
                boots[:, anneal] = -np.inf
        design = base.design(list(data[model]))
        loss = base.observed(list(data[model]))
        with np.errstate(invalid="ignore"):
            resid = base.log_predict(theta, design)[0] - np.log(loss)
        out[model] = Fit(
            law=base.name,
            params=base.natural(theta),
            theta=theta,
            objective=result.objective,
            n_points=int(loss.size),
            log_residuals=resid,
            status=result.status,
            n_starts=result.n_starts,
            n_starts_converged=result.n_starts_converged,
            level=level,
            delta=result.delta,
            boot_thetas=boots,
            bootstrap=dict(result.bootstrap, shared=list(shared), models=len(models)),
            reasons=tuple(r[len(model) + 2 :] for r in result.reasons if r.startswith(f"{model}: "))
            + tuple(r for r in result.reasons if not any(r.startswith(f"{other}: ") for other in models)),
            label=f"{model} (joint with {len(models) - 1} other model(s), sharing {sharing})",
        )
    return out


__all__ = ["JointCurveLaw", "fit_jointly", "joint_law"]
