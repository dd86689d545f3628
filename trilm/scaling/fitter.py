"""One objective, one fitter, one result for every law of :mod:`trilm.scaling.laws`.

The objective is the Huber loss (δ = 1e-3) of the log residuals ``log L̂ − log L``, summed over points
(Hoffmann et al. 2022 as refitted by Besiroglu et al. 2024; Tissue et al. and Luo et al. fit curves the same
way); a mean makes it so small that L-BFGS stops on its tolerance before it converges. Every start of the
law's grid is minimized at once by the batched L-BFGS of :mod:`trilm.scaling.optim`, and the best converged
one is the fit.

The bootstrap is part of the fit: resamples draw *units* with replacement (a lineage of runs, a loss curve,
a stretch of one curve: :meth:`trilm.scaling.laws.base.Law.units`), and each is refitted from the full-data
fit (and, for laws with saddles, from the screened coarse grid). A :class:`Fit`'s prediction interval is
the percentile interval of the refits' predictions: how much the answer depends on which data were seen,
not the residual scatter of one fit.
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from trilm.config import shown
from trilm.scaling import optim
from trilm.scaling.curves import LossCurve
from trilm.scaling.errors import FitError
from trilm.scaling.laws.base import LAWS, MIN_EXPONENT, Law, get_law

HUBER_DELTA = 1e-3
MIN_RESAMPLES = 10
"""Fewer accepted refits than this give no interval."""
SCREEN_ITER = 25
SCREEN_KEEP = 3
CHUNK_ELEMENTS = 1 << 21
"""Parameter vectors are evaluated in chunks of about this many Jacobian entries (B·P·n)."""
EXACT = 1e-7
"""Largest |log residual| of a fit that passes exactly through more points than it has parameters (data
drawn from the law): there a zero-width interval is certainty, not degeneracy."""


class HuberLog:
    """Σᵢ wᵢ·Huber_δ(log L̂ᵢ − log Lᵢ) and its gradient, for a batch of parameter vectors of one law.

    ``weights (R, n)`` are bootstrap counts; ``weight_index`` maps each problem to its row of them.
    """

    def __init__(
        self,
        law: Law,
        design: Any,
        log_y: np.ndarray,
        *,
        delta: float = HUBER_DELTA,
        weights: np.ndarray | None = None,
        weight_index: np.ndarray | None = None,
    ) -> None:
        self.law, self.design, self.log_y, self.delta = law, design, np.asarray(log_y, float), float(delta)
        self.weights, self.weight_index = weights, weight_index

    def fun_grad(self, theta: np.ndarray, idx: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        theta = np.atleast_2d(theta)
        if idx is None:
            idx = np.arange(theta.shape[0])
        rows = max(1, CHUNK_ELEMENTS // max(1, theta.shape[1] * self.log_y.size))
        f = np.empty(theta.shape[0])
        g = np.empty_like(theta)
        for s in range(0, theta.shape[0], rows):
            f[s : s + rows], g[s : s + rows] = self._block(theta[s : s + rows], idx[s : s + rows])
        return f, g

    def _block(self, theta: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        vjp = getattr(self.law, "log_predict_vjp", None)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            if vjp is not None:
                pred, pullback = vjp(theta, self.design)
            else:
                pred, jac = self.law.log_predict_jac(theta, self.design)
            resid = pred - self.log_y
            clipped = np.clip(resid, -self.delta, self.delta)
            huber = clipped * (2.0 * resid - clipped)
            if self.weights is not None:
                w = self.weights[idx if self.weight_index is None else self.weight_index[idx]]
                huber = np.where(w > 0, huber * w, 0.0)
                clipped = np.where(w > 0, clipped * w, 0.0)
            f = 0.5 * huber.sum(axis=1)
            if vjp is not None:
                g = pullback(np.where(np.isfinite(clipped), clipped, 0.0))
            else:
                g = np.einsum("bpn,bn->bp", np.where(np.isfinite(jac), jac, 0.0), clipped)
        bad = ~np.isfinite(f)
        f[bad] = np.inf
        g[bad] = np.nan
        return f, g


def percentile_interval(samples: Any, level: float, axis: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The central ``level`` percentile interval of bootstrap samples along ``axis``: the one rule for every
    interval of a fit, of its predictions and of quantities derived from its refits (a crossing, a matched
    size). NaN samples (refits where the quantity is undefined) are left out; where some are infinite the
    bounds are order statistics, since interpolating towards an infinite value gives NaN."""
    values = np.asarray(samples, float)
    tail = 100 * (1 - level) / 2
    finite = np.isfinite(values[~np.isnan(values)]).all()
    method: Literal["linear", "inverted_cdf"] = "linear" if finite else "inverted_cdf"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN slice has no interval: NaN
        lo, hi = np.nanpercentile(values, [tail, 100 - tail], axis=axis, method=method)
    return np.asarray(lo), np.asarray(hi)


@dataclasses.dataclass
class Prediction:
    """A law's value at some inputs and the percentile interval of its bootstrap refits there (``None``
    without enough refits)."""

    value: np.ndarray
    low: np.ndarray | None
    high: np.ndarray | None

    def contains(self, observed: Any) -> np.ndarray | None:
        if self.low is None or self.high is None:
            return None
        obs = np.asarray(observed, float)
        return (self.low <= obs) & (obs <= self.high)


@dataclasses.dataclass
class Fit:
    """A fitted law: its parameters, how the fit converged, its bootstrap refits and whether the data pin it
    down (``reasons`` say why not)."""

    law: str
    params: dict[str, float]
    theta: np.ndarray
    objective: float
    n_points: int
    log_residuals: np.ndarray
    status: str
    n_starts: int
    n_starts_converged: int
    level: float = 0.95
    delta: float = HUBER_DELTA
    boot_thetas: np.ndarray | None = None
    bootstrap: dict[str, Any] = dataclasses.field(default_factory=dict)
    reasons: tuple[str, ...] = ()
    label: str = ""
    boot_index: np.ndarray | None = None
    """The resample number of each row of ``boot_thetas``: fits bootstrapped over the same units with the
    same seed drew the same resamples, and are paired on the numbers they share."""

    @property
    def identified(self) -> bool:
        return not self.reasons

    @property
    def formula(self) -> str:
        return get_law(self.law).formula

    def _data(self, data: Any, inputs: Mapping[str, Any]) -> tuple[Any, tuple[int, ...]]:
        law = get_law(self.law)
        if law.kind == "curve":
            if data is None:
                raise FitError(f"{self.law}: a curve law predicts along a schedule: pass a LossCurve")
            curves = [data] if isinstance(data, LossCurve) else list(data)
            return law.design(curves), (sum(c.steps.size for c in curves),)
        if data is None:
            names = law.inputs  # type: ignore[attr-defined]
            missing = [k for k in names if k not in inputs]
            if missing:
                raise FitError(f"{law.formula} needs {', '.join(missing)} to predict")
            arrays = np.broadcast_arrays(*[np.asarray(inputs[k], float) for k in names])
            data = {k: a.ravel() for k, a in zip(names, arrays)}
            data["loss"] = np.ones(arrays[0].size)
            return law.design(data), arrays[0].shape
        return law.design({**data, "loss": np.ones(np.asarray(next(iter(data.values()))).size)}), (-1,)

    def predict(self, data: Any = None, **inputs: Any) -> Prediction:
        """The law's loss and interval: ``fit.predict(N=1e9, D=2e10)`` for a size law, or
        ``fit.predict(curve)`` along a :class:`LossCurve`'s schedule at its ``steps`` for a curve law."""
        law = get_law(self.law)
        design, shape = self._data(data, inputs)
        with np.errstate(over="ignore", invalid="ignore"):
            value = np.exp(law.log_predict(self.theta, design)[0]).reshape(shape)
            low = high = None
            if self.boot_thetas is not None and len(self.boot_thetas) >= MIN_RESAMPLES:
                samples = np.exp(law.log_predict(self.boot_thetas, design))
                lo, hi = percentile_interval(samples, self.level)
                low, high = (
                    np.minimum(lo, value.ravel()).reshape(shape),
                    np.maximum(hi, value.ravel()).reshape(shape),
                )
        return Prediction(value, low, high)

    def param_intervals(self, law: Law | None = None) -> dict[str, list[float]]:
        """Percentile intervals of the natural parameters over the bootstrap refits (``law``: the law the
        fit was made with, where it is not the registry's, such as a joint fit)."""
        if self.boot_thetas is None or len(self.boot_thetas) < MIN_RESAMPLES:
            return {}
        out: dict[str, list[float]] = {}
        for k, values in self.boot_params(law).items():
            lo, hi = percentile_interval(values, self.level)
            out[k] = [float(lo), float(hi)]
        return out

    def boot_params(self, law: Law | None = None) -> dict[str, np.ndarray]:
        """Every bootstrap refit's natural parameters, by name (empty without refits)."""
        if self.boot_thetas is None or not len(self.boot_thetas):
            return {}
        law = law or get_law(self.law)
        nat = [law.natural(t) for t in self.boot_thetas]
        return {k: np.array([p[k] for p in nat], float) for k in self.params}

    def to_dict(self) -> dict[str, Any]:
        r = self.log_residuals
        return {
            "law": self.law,
            "formula": self.formula,
            "label": self.label,
            "params": self.params,
            "param_intervals": self.param_intervals(),
            "theta": [float(v) for v in self.theta],
            "objective": self.objective,
            "huber_delta": self.delta,
            "n_points": self.n_points,
            "status": self.status,
            "n_starts": self.n_starts,
            "n_starts_converged": self.n_starts_converged,
            "log_residual_rms": float(np.sqrt(np.mean(r * r))) if r.size else 0.0,
            "log_residual_max_abs": float(np.max(np.abs(r))) if r.size else 0.0,
            "level": self.level,
            "bootstrap": self.bootstrap,
            "boot_thetas": []
            if self.boot_thetas is None
            else [[float(v) for v in t] for t in self.boot_thetas],
            "identified": self.identified,
            "not_identified_because": list(self.reasons),
        }

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=1) + "\n", encoding="utf-8")
        tmp.replace(path)
        return path

    @classmethod
    def from_dict(cls, record: Mapping[str, Any], where: str = "fit") -> Fit:
        """A fit from :meth:`to_dict`'s record; raises :class:`FitError` naming the missing or bad key."""
        if not isinstance(record, Mapping):
            raise FitError(f"{where}: expected a JSON object, got {type(record).__name__}")
        for key in ("law", "theta"):
            if key not in record:
                raise FitError(
                    f"{where}: no {key!r} key (is this a fit.json written by trilm scaling fit --law?)"
                )
        if not isinstance(record["law"], str) or record["law"] not in LAWS:
            raise FitError(f"{where}: 'law' must be one of {', '.join(LAWS)}, got {shown(record['law'])}")
        law = get_law(record["law"])
        try:
            theta = np.asarray(record["theta"], float)
            boot = np.asarray(record.get("boot_thetas") or [], float)
        except (TypeError, ValueError, OverflowError):
            raise FitError(f"{where}: 'theta' and 'boot_thetas' must be lists of numbers") from None
        if theta.shape != (law.n_params,):
            raise FitError(
                f"{where}: 'theta' has {theta.size} values; law {law.name} has {law.n_params} parameters"
            )
        if boot.size and (boot.ndim != 2 or boot.shape[1] != law.n_params):
            raise FitError(f"{where}: 'boot_thetas' must be rows of {law.n_params} values")
        level = record.get("level", 0.95)
        if isinstance(level, bool) or not isinstance(level, int | float) or not 0 < level < 1:
            raise FitError(f"{where}: 'level' must be a number in (0, 1), got {shown(level)}")
        bootstrap = record.get("bootstrap") or {}
        if not isinstance(bootstrap, Mapping):
            raise FitError(f"{where}: 'bootstrap' must be an object, got {shown(bootstrap)}")
        reasons = record.get("not_identified_because") or []
        if not isinstance(reasons, list) or not all(isinstance(r, str) for r in reasons):
            raise FitError(f"{where}: 'not_identified_because' must be a list of strings")
        return cls(
            law=law.name,
            params=law.natural(theta),
            theta=theta,
            objective=float("nan"),
            n_points=0,
            log_residuals=np.empty(0),
            status="",
            n_starts=0,
            n_starts_converged=0,
            level=float(level),
            boot_thetas=boot if boot.size else None,
            bootstrap=dict(bootstrap),
            reasons=tuple(reasons),
            label=str(record.get("label", ""))[:200],
        )

    @classmethod
    def load(cls, path: str | Path) -> Fit:
        path = Path(path)
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise FitError(f"{path}: no such fit file") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise FitError(f"{path}: cannot read the fit ({exc})") from None
        except json.JSONDecodeError as exc:
            raise FitError(f"{path}, line {exc.lineno}: not JSON ({exc.msg})") from None
        return cls.from_dict(record, str(path))


def unit_counts(labels: Sequence[Hashable], n_resamples: int, seed: int) -> tuple[np.ndarray, list[Hashable]]:
    """Draw ``n_resamples`` resamples of the distinct ``labels`` with replacement.

    Returns ``(counts (R, U), units)``: how often each distinct unit was drawn."""
    if n_resamples < 1:
        raise FitError(f"bootstrap: the number of resamples must be ≥ 1, got {n_resamples}")
    units = list(dict.fromkeys(labels))
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(units), size=(n_resamples, len(units)))
    counts = np.zeros((n_resamples, len(units)))
    np.add.at(counts, (np.arange(n_resamples)[:, None], draws), 1.0)
    return counts, units


def point_weights(
    point_units: Sequence[Hashable], counts: np.ndarray, units: Sequence[Hashable]
) -> np.ndarray:
    """Per-point weights ``(R, n)``: each point gets the draw count of its unit."""
    where = {u: i for i, u in enumerate(units)}
    return counts[:, [where[u] for u in point_units]]


CURVE_FTOL = 1e-10
"""Relative change of the objective at which a curve fit stops: its evaluations cost a sum over the schedule's
decreases per point, and below this the fitted losses move by far less than 1e-4 nats."""


def _minimize(objective: HuberLog, starts: np.ndarray, screen: bool, max_iter: int) -> optim.BatchResult:
    """Every start to convergence; with ``screen``, every start for a few iterations, then the best
    ``4·SCREEN_KEEP`` to convergence."""
    ftol = CURVE_FTOL if screen else 1e-13
    if not screen or len(starts) <= 2 * SCREEN_KEEP:
        return optim.minimize_batched(objective.fun_grad, starts, max_iter=max_iter, ftol=ftol)
    first = optim.minimize_batched(objective.fun_grad, starts, max_iter=SCREEN_ITER)
    order = np.argsort(np.where(np.isfinite(first.fun), first.fun, np.inf))[: 4 * SCREEN_KEEP]
    return optim.minimize_batched(objective.fun_grad, first.x[order], max_iter=max_iter, ftol=ftol)


def _best(res: optim.BatchResult, n_starts: int, label: str) -> int:
    fun = np.where(res.converged & np.isfinite(res.fun), res.fun, np.inf)
    if not np.isfinite(fun).any():
        counts = {
            optim.STATUS_TEXT[int(s)]: int(c) for s, c in zip(*np.unique(res.status, return_counts=True))
        }
        raise FitError(f"{label}: the fit did not converge from any of {n_starts} starts ({counts})")
    return int(np.argmin(fun))


def _refit(
    law: Law,
    design: Any,
    log_y: np.ndarray,
    weights: np.ndarray,
    theta: np.ndarray,
    delta: float,
    max_iter: int = 2000,
) -> tuple[np.ndarray, np.ndarray]:
    """The best converged refit per resample (row of ``weights``) and whether it converged."""
    n_rows = weights.shape[0]
    rows = np.arange(n_rows)

    def objective(row_of_problem: np.ndarray) -> HuberLog:
        return HuberLog(law, design, log_y, delta=delta, weights=weights, weight_index=row_of_problem)

    ftol = CURVE_FTOL if law.kind == "curve" else 1e-13
    warm = optim.minimize_batched(
        objective(rows).fun_grad, np.tile(theta, (n_rows, 1)), ftol=ftol, max_iter=max_iter
    )
    cand_x = warm.x[:, None, :]
    cand_f = np.where(warm.converged & np.isfinite(warm.fun), warm.fun, np.inf)[:, None]
    if law.restart_grid:
        grid = law.coarse_grid()
        n_start = grid.shape[0]
        screen = optim.minimize_batched(
            objective(np.repeat(rows, n_start)).fun_grad, np.tile(grid, (n_rows, 1)), max_iter=SCREEN_ITER
        )
        screen_f = np.where(np.isfinite(screen.fun), screen.fun, np.inf).reshape(n_rows, n_start)
        keep = np.argsort(screen_f, axis=1)[:, :SCREEN_KEEP]
        picked = (rows[:, None] * n_start + keep).ravel()
        cont = optim.minimize_batched(
            objective(np.repeat(rows, keep.shape[1])).fun_grad, screen.x[picked], ftol=ftol
        )
        cont_f = np.where(cont.converged & np.isfinite(cont.fun), cont.fun, np.inf).reshape(n_rows, -1)
        cand_x = np.concatenate([cand_x, cont.x.reshape(n_rows, keep.shape[1], -1)], axis=1)
        cand_f = np.concatenate([cand_f, cont_f], axis=1)
    best = np.argmin(cand_f, axis=1)
    return cand_x[rows, best], np.isfinite(cand_f[rows, best])


def interval_reasons(law: Law, fit: Fit, exact: bool, loss: np.ndarray | None = None) -> list[str]:
    """Why the bootstrap says the data do not pin the law: too few refits, an exponent interval that is
    not finite, has no width, or reaches 0 (the term may be absent), or a floor whose interval reaches the
    lowest ``loss`` (that point's loss, not a limit the data show levelling off below it)."""
    if fit.boot_thetas is None:
        return []
    if len(fit.boot_thetas) < MIN_RESAMPLES:
        return [f"only {len(fit.boot_thetas)} bootstrap refits converged: no interval"]
    out = []
    pct = round(fit.level * 100)
    for name, (lo, hi) in fit.param_intervals(law).items():
        if name not in law.exponents:
            continue
        cell = f"{name} interval [{lo:.3g}, {hi:.3g}]"
        if not (np.isfinite(lo) and np.isfinite(hi)):
            out.append(f"{cell} not finite")
        elif hi - lo <= 1e-9 * max(1.0, abs(fit.params[name])) and not exact:
            out.append(f"zero-width {cell} (every usable resample is the same data)")
        elif lo <= MIN_EXPONENT:
            out.append(f"{pct}% {cell} reaches 0")
    if law.floor is not None and loss is not None and loss.size and not exact:
        low = float(np.min(loss))
        f_lo, f_hi = fit.param_intervals(law).get(law.floor, (np.nan, np.nan))
        if fit.params[law.floor] < low <= f_hi:
            out.append(
                f"the {pct}% {law.floor} interval [{f_lo:.4g}, {f_hi:.4g}] reaches the lowest loss,"
                f" {low:.4f}: the data do not show the loss levelling off below it, so {law.floor} is that"
                " point's loss, not a floor"
            )
    return out


def fit(
    law: str | Law,
    data: Any,
    *,
    bootstrap: int = 0,
    seed: int = 0,
    level: float = 0.95,
    delta: float = HUBER_DELTA,
    starts: Literal["full", "coarse"] | np.ndarray = "full",
    units: Sequence[Hashable] | None = None,
    max_iter: int = 2000,
    label: str = "",
) -> Fit:
    """Fit ``law`` to ``data`` (a mapping of inputs and ``loss`` for size laws, loss curves for curve laws),
    bootstrap it over ``units`` (default: the law's own, :meth:`Law.units`) and judge it.

    Raises :class:`FitError` on malformed data, too few points, or when no start converged.
    """
    law = get_law(law) if isinstance(law, str) else law
    label = label or law.name
    if not 0 < level < 1:
        raise FitError(f"{label}: level must be in (0, 1), got {level}")
    if bootstrap < 0:
        raise FitError(f"{label}: bootstrap must be ≥ 0, got {bootstrap}")
    design = law.design(data)
    loss = law.observed(data)
    law.check_fittable(data)  # type: ignore[attr-defined]
    log_y = np.log(loss)
    grid = (
        starts if isinstance(starts, np.ndarray) else (law.grid() if starts == "full" else law.coarse_grid())
    )
    objective = HuberLog(law, design, log_y, delta=delta)
    res = _minimize(objective, np.atleast_2d(grid), screen=law.kind == "curve", max_iter=max_iter)
    best = _best(res, len(grid), label)
    theta = res.x[best].copy()
    with np.errstate(invalid="ignore"):
        resid = law.log_predict(theta, design)[0] - log_y
    result = Fit(
        law=law.name,
        params=law.natural(theta),
        theta=theta,
        objective=float(res.fun[best]),
        n_points=int(loss.size),
        log_residuals=resid,
        status=optim.STATUS_TEXT[int(res.status[best])],
        n_starts=len(grid),
        n_starts_converged=int(res.converged.sum()),
        level=level,
        delta=delta,
        label=label,
    )
    if bootstrap:
        point_units = list(units) if units is not None else law.units(data)
        if len(point_units) != loss.size:
            raise FitError(f"{label}: {len(point_units)} unit labels for {loss.size} points")
        counts, unit_list = unit_counts(point_units, bootstrap, seed)
        weights = point_weights(point_units, counts, unit_list)
        good = np.flatnonzero(((counts > 0).sum(axis=1) >= 2) & law.usable(design, weights))
        weights = weights[good]
        thetas, ok = _refit(law, design, log_y, weights, theta, delta, max_iter)
        result.boot_thetas = thetas[ok]
        result.boot_index = good[ok]
        result.bootstrap = {
            "n_resamples": bootstrap,
            "n_accepted": int(ok.sum()),
            "n_degenerate": int(bootstrap - good.size),
            "n_not_converged": int((~ok).sum()),
            "n_units": len(unit_list),
            "seed": seed,
        }
    exact = resid.size > law.n_params and bool(np.nanmax(np.abs(resid)) < EXACT)
    result.reasons = tuple(
        dict.fromkeys(law.plausibility(theta, design, loss) + interval_reasons(law, result, exact, loss))
    )
    return result


__all__ = [
    "HUBER_DELTA",
    "Fit",
    "HuberLog",
    "Prediction",
    "fit",
    "percentile_interval",
    "point_weights",
    "unit_counts",
]
