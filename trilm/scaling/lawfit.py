"""Fit any law of :mod:`trilm.scaling.laws` to L(N, D) points, bootstrap it, judge it, and choose between laws
by how well each predicts points it did not see.

:func:`fit_nd_law` is :func:`trilm.scaling.nd.fit_nd` for every law: the Huber-in-log objective (Besiroglu et
al. 2024) summed over points, multi-start batched L-BFGS, a bootstrap that resamples *units* (lineages: a run
with its cooldown branches) and refits each resample from the full-data fit, and the plausibility rules of
:mod:`trilm.scaling.identify` (exponents inside (0, 2], parameters off the edges of the search box, E a floor
below the data, bootstrap intervals finite and off zero). For the additive law it computes exactly what
``fit_nd`` does.

:func:`select_law` chooses per family by *held-out* error: each candidate is fitted without the points of the
largest D and scored on them, the direction in which a suite's law is asked to predict. An in-sample fit
would favour the law with most freedom; the cooldown experiment's Kaplan fits had smaller residuals than
the additive ones and predicted worse.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Sequence
from typing import Any, Literal

import numpy as np

from trilm.config import Config, require
from trilm.scaling import optim
from trilm.scaling.bootstrap import SCREEN_ITER, SCREEN_KEEP, _identifiable, point_weights, unit_counts
from trilm.scaling.fit import HUBER_DELTA, FitError
from trilm.scaling.identify import EXACT, MAX_EXPONENT, MIN_E_FRACTION, MIN_EXPONENT, exponent_interval_reason
from trilm.scaling.laws import LAWS, Law, get_law

MIN_RESAMPLES = 10
"""Fewer accepted bootstrap refits than this give no interval (as :func:`trilm.scaling.nd.predict`)."""


@dataclasses.dataclass
class LawFitConfig(Config):
    """How to fit one law: which, the bootstrap, the Huber δ and the starts (``full``: the law's grid, for
    the additive law Hoffmann's 4,500; ``coarse``: the few starts bootstrap refits use, for quick fits)."""

    law: str = "additive"
    starts: Literal["full", "coarse"] = "full"
    bootstrap: int = 1000
    seed: int = 0
    level: float = 0.95
    delta: float = HUBER_DELTA
    max_iter: int = 2000

    def validate(self) -> None:
        require(self.law in LAWS, f"law: {self.law!r} is not one of {list(LAWS)}")
        require(self.bootstrap >= 0, f"bootstrap: must be ≥ 0, got {self.bootstrap}")
        require(0 < self.level < 1, f"level: must be in (0, 1), got {self.level}")
        require(self.delta > 0, f"delta: must be > 0, got {self.delta}")
        require(self.max_iter >= 1, f"max_iter: must be ≥ 1, got {self.max_iter}")


@dataclasses.dataclass
class SelectionConfig(Config):
    """Which laws compete and on which held-out points: ``largest_d`` scores each law, fitted without the
    points of the largest D, on those points."""

    laws: list[str] = dataclasses.field(default_factory=lambda: list(LAWS))
    holdout: Literal["largest_d"] = "largest_d"
    starts: Literal["full", "coarse"] = "full"
    delta: float = HUBER_DELTA

    def validate(self) -> None:
        require(bool(self.laws), "laws: name at least one law")
        for name in self.laws:
            require(name in LAWS, f"laws: {name!r} is not one of {list(LAWS)}")
        require(len(set(self.laws)) == len(self.laws), f"laws: {self.laws} names a law twice")
        require(self.delta > 0, f"delta: must be > 0, got {self.delta}")


@dataclasses.dataclass
class NDLawFit:
    """A fitted law, its bootstrap refits and whether the data pin it down (``reasons`` say why not)."""

    law: str
    theta: np.ndarray
    params: dict[str, float]
    objective: float
    log_residuals: np.ndarray
    status: str
    n_starts: int
    n_starts_converged: int
    level: float
    boot_thetas: np.ndarray | None = None
    boot_counts: dict[str, int] = dataclasses.field(default_factory=dict)
    reasons: tuple[str, ...] = ()

    @property
    def identified(self) -> bool:
        return not self.reasons

    def predict(self, n, d) -> np.ndarray:
        """The fitted loss at ``(n, d)`` (broadcast)."""
        return _predict(get_law(self.law), self.theta, n, d)[0]

    def samples(self, n, d) -> np.ndarray | None:
        """Every accepted bootstrap refit's loss at ``(n, d)``: ``(resamples, *shape)``, None without one."""
        if self.boot_thetas is None or len(self.boot_thetas) < MIN_RESAMPLES:
            return None
        return _predict(get_law(self.law), self.boot_thetas, n, d)

    def interval(self, n, d) -> tuple[np.ndarray, np.ndarray] | None:
        """The percentile interval (at the fit's level) of the bootstrap refits' losses at ``(n, d)``."""
        samples = self.samples(n, d)
        if samples is None:
            return None
        tail = 100 * (1 - self.level) / 2
        lo, hi = np.percentile(samples, [tail, 100 - tail], axis=0)
        return lo, hi

    def param_intervals(self) -> dict[str, list[float]]:
        if self.boot_thetas is None or not len(self.boot_thetas):
            return {}
        law = get_law(self.law)
        nat = [law.natural(t) for t in self.boot_thetas]
        tail = 100 * (1 - self.level) / 2
        out: dict[str, list[float]] = {}
        for k in self.params:
            bounds = np.asarray(np.percentile([p[k] for p in nat], [tail, 100 - tail]), dtype=float)
            out[k] = [float(bounds[0]), float(bounds[1])]
        return out

    def to_dict(self) -> dict[str, Any]:
        r = self.log_residuals
        return {
            "law": self.law,
            "formula": get_law(self.law).formula,
            "params": self.params,
            "param_intervals": self.param_intervals(),
            "objective": self.objective,
            "status": self.status,
            "n_starts": self.n_starts,
            "n_starts_converged": self.n_starts_converged,
            "log_residual_rms": float(np.sqrt(np.mean(r * r))),
            "bootstrap": self.boot_counts,
            "identified": self.identified,
            "not_identified_because": list(self.reasons),
        }


def _predict(law: Law, theta: np.ndarray, n, d) -> np.ndarray:
    n, d = np.broadcast_arrays(np.asarray(n, float), np.asarray(d, float))
    log_x = np.stack([np.log(n.ravel()), np.log(d.ravel())])
    with np.errstate(over="ignore", invalid="ignore"):
        out = np.exp(law.log_predict(np.atleast_2d(theta), log_x))
    return out.reshape(-1, *n.shape)


def _inputs(law: Law, n, d, loss, label: str) -> tuple[np.ndarray, np.ndarray]:
    where = f"{label}: " if label else ""
    cols = [np.asarray(v, float).ravel() for v in (n, d, loss)]
    for name, col in zip(("N", "D", "loss"), cols):
        if col.shape != cols[2].shape:
            raise FitError(f"{where}{name} has {col.size} values but loss has {cols[2].size}")
        bad = np.flatnonzero(~np.isfinite(col) | (col <= 0))
        if bad.size:
            raise FitError(f"{where}{name} must be positive and finite; point {bad[0]} has {col[bad[0]]!r}")
    if cols[2].size < law.n_params:
        raise FitError(f"{where}{law.formula} has {law.n_params} parameters but only {cols[2].size} points")
    for name, col in zip(("N", "D"), cols):
        if np.unique(col).size < 3:
            raise FitError(f"{where}{law.formula} needs at least 3 distinct values of {name}")
    return np.log(np.stack(cols[:2])), np.log(cols[2])


def fit_nd_law(
    cfg: LawFitConfig, n, d, loss, *, units: Sequence[Hashable] | None = None, label: str = ""
) -> NDLawFit:
    """Fit ``cfg.law`` to the points, bootstrap it over ``units`` (one label per point; default: each point)
    and judge it. Raises :class:`FitError` on bad input or when no start converged."""
    law = get_law(cfg.law)
    label = label or law.formula
    log_x, log_y = _inputs(law, n, d, loss, label)
    starts = law.grid() if cfg.starts == "full" else law.coarse_grid()
    res = optim.minimize_batched(
        law.objective(log_x, log_y, delta=cfg.delta).fun_grad, starts, max_iter=cfg.max_iter
    )
    fun = np.where(np.isfinite(res.fun) & res.converged, res.fun, np.inf)
    if not np.isfinite(fun).any():
        raise FitError(f"{label}: the fit did not converge from any of {len(starts)} starts")
    best = int(np.argmin(fun))
    theta = res.x[best].copy()
    result = NDLawFit(
        law=law.name,
        theta=theta,
        params=law.natural(theta),
        objective=float(fun[best]),
        log_residuals=law.log_predict(theta[None], log_x)[0] - log_y,
        status=optim.STATUS_TEXT[int(res.status[best])],
        n_starts=len(starts),
        n_starts_converged=int(res.converged.sum()),
        level=cfg.level,
    )
    if cfg.bootstrap:
        point_units = list(range(log_y.size)) if units is None else list(units)
        if len(point_units) != log_y.size:
            raise FitError(f"{label}: {len(point_units)} unit labels for {log_y.size} points")
        counts, unit_list = unit_counts(point_units, cfg.bootstrap, cfg.seed)
        weights = point_weights(point_units, counts, unit_list)
        good = np.flatnonzero(_identifiable(law, log_x, weights))
        thetas, ok = _refit(law, log_x, log_y, weights[good], theta, cfg.delta)
        result.boot_thetas = thetas[ok]
        result.boot_counts = {
            "n_resamples": cfg.bootstrap,
            "n_accepted": int(ok.sum()),
            "n_degenerate": int(cfg.bootstrap - good.size),
            "n_not_converged": int((~ok).sum()),
            "seed": cfg.seed,
        }
    result.reasons = plausibility(law, result, log_x, np.exp(log_y))
    return result


def _refit(
    law: Law, log_x: np.ndarray, log_y: np.ndarray, weights: np.ndarray, theta: np.ndarray, delta: float
) -> tuple[np.ndarray, np.ndarray]:
    """The best converged refit per resample (row of ``weights``), from the full-data fit and, for laws with
    ``restart_grid``, from the screened coarse grid (as :func:`trilm.scaling.bootstrap._refit`)."""
    n_rows = weights.shape[0]
    rows = np.arange(n_rows)
    if n_rows == 0:
        return np.empty((0, theta.size)), np.zeros(0, bool)

    def fun_grad(row_of_problem: np.ndarray):
        return law.objective(log_x, log_y, delta=delta, weights=weights, weight_index=row_of_problem).fun_grad

    warm = optim.minimize_batched(fun_grad(rows), np.tile(theta, (n_rows, 1)))
    cand_x = warm.x[:, None, :]
    cand_f = np.where(warm.converged & np.isfinite(warm.fun), warm.fun, np.inf)[:, None]
    if law.restart_grid:
        grid = law.coarse_grid()
        n_start = grid.shape[0]
        screen = optim.minimize_batched(
            fun_grad(np.repeat(rows, n_start)), np.tile(grid, (n_rows, 1)), max_iter=SCREEN_ITER
        )
        screen_f = np.where(np.isfinite(screen.fun), screen.fun, np.inf).reshape(n_rows, n_start)
        keep = np.argsort(screen_f, axis=1)[:, :SCREEN_KEEP]
        picked = (rows[:, None] * n_start + keep).ravel()
        cont = optim.minimize_batched(fun_grad(np.repeat(rows, keep.shape[1])), screen.x[picked])
        cont_f = np.where(cont.converged & np.isfinite(cont.fun), cont.fun, np.inf).reshape(n_rows, -1)
        cand_x = np.concatenate([cand_x, cont.x.reshape(n_rows, keep.shape[1], -1)], axis=1)
        cand_f = np.concatenate([cand_f, cont_f], axis=1)
    best = np.argmin(cand_f, axis=1)
    return cand_x[rows, best], np.isfinite(cand_f[rows, best])


def plausibility(law: Law, fit: NDLawFit, log_x: np.ndarray, loss: np.ndarray) -> tuple[str, ...]:
    """Why ``fit`` is not a law the data support (empty: it is): the rules of
    :mod:`trilm.scaling.identify`, applied to whichever exponents, scales and floor the law has."""
    params, reasons = fit.params, []
    for name in law.exponents:
        if params[name] <= MIN_EXPONENT:
            reasons.append(f"{name} = {params[name]:.3g} ≤ 0 (the loss does not fall with it)")
        elif params[name] > MAX_EXPONENT:
            reasons.append(
                f"{name} = {params[name]:.3g} > {MAX_EXPONENT:g} (nearly all of the decrease is between the"
                " first two points: the exponent is not pinned down)"
            )
    low = float(np.min(loss))
    if law.has_e:
        if params["E"] < MIN_E_FRACTION * low:
            reasons.append(f"E = {params['E']:.3g} ≈ 0 (the irreducible loss is not identified)")
        if params["E"] >= low:
            reasons.append(f"E = {params['E']:.4g} is not below the lowest loss, {low:.4f}: no floor")
    reasons += law.edge_reasons(params, log_x, loss)
    if loss.size <= law.n_params:
        reasons.append(f"{loss.size} points for {law.n_params} parameters")
    exact = float(np.max(np.abs(fit.log_residuals))) < EXACT
    intervals = fit.param_intervals()
    if fit.boot_thetas is not None and len(fit.boot_thetas) < MIN_RESAMPLES:
        reasons.append(f"only {len(fit.boot_thetas)} bootstrap refits converged: no interval")
    elif intervals:
        pct = round(fit.level * 100)
        for name in law.exponents:
            lo, hi = intervals[name]
            why = exponent_interval_reason(name, lo, hi, params[name], exact, pct)
            if why:
                reasons.append(why)
        if law.has_e and params["E"] < low <= intervals["E"][1] and not exact:
            reasons.append(
                f"the {pct}% E interval [{intervals['E'][0]:.4g}, {intervals['E'][1]:.4g}] reaches the lowest"
                f" loss, {low:.4f}: the data do not show the loss levelling off below it"
            )
    return tuple(dict.fromkeys(reasons))


@dataclasses.dataclass
class Selection:
    """Each candidate's error on the held-out points and the law chosen by it."""

    chosen: str | None
    scores: dict[str, dict[str, Any]]
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"chosen": self.chosen, "note": self.note, "validation": self.scores}


def select_law(cfg: SelectionConfig, n, d, loss) -> Selection:
    """Fit every law of ``cfg`` without the points of the largest D and score it on them: the median and
    largest absolute error. The chosen law has the lowest median among the laws whose fit is plausible
    (:func:`plausibility`, without a bootstrap); if none is, the lowest median overall, and ``note`` says so.
    """
    n, d, loss = (np.asarray(v, float).ravel() for v in (n, d, loss))
    held = d >= d.max()
    scores: dict[str, dict[str, Any]] = {}
    for name in cfg.laws:
        lcfg = LawFitConfig(law=name, bootstrap=0, delta=cfg.delta, starts=cfg.starts)
        try:
            fit = fit_nd_law(lcfg, n[~held], d[~held], loss[~held], label=f"{name} without the largest D")
        except FitError as exc:
            scores[name] = {"median_abs_error": float("inf"), "error": str(exc)}
            continue
        err = fit.predict(n[held], d[held]) - loss[held]
        scores[name] = {
            "median_abs_error": float(np.median(np.abs(err))),
            "max_abs_error": float(np.max(np.abs(err))),
            "held_out_points": int(held.sum()),
            "fit_points": int((~held).sum()),
            "plausible": fit.identified,
            "not_plausible_because": list(fit.reasons),
        }
    plausible = {k: v for k, v in scores.items() if v.get("plausible")}
    pool, note = plausible, ""
    if not plausible:
        pool = {k: v for k, v in scores.items() if np.isfinite(v["median_abs_error"])}
        note = "no candidate's fit without the largest D is plausible; chosen by held-out error alone"
    chosen = min(pool, key=lambda k: pool[k]["median_abs_error"]) if pool else None
    if chosen is None:
        note = "no candidate could be fitted without the largest D"
    return Selection(chosen, scores, note)


__all__ = [
    "LawFitConfig",
    "NDLawFit",
    "Selection",
    "SelectionConfig",
    "fit_nd_law",
    "plausibility",
    "select_law",
]
