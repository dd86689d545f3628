"""Chinchilla approach-3 fits of L(N), L(D) and L(N, D).

The forms are sums of power laws plus an irreducible loss::

    L(N)    = E + A / N^α
    L(D)    = E + B / D^β
    L(N, D) = E + A / N^α + B / D^β

Following Hoffmann et al. (2022) as replicated by Epoch AI, each is fitted in log space with the log-sum-exp
parametrization ``log L̂ = LSE(a − α·log N, b − β·log D, e)`` (``A = eᵃ``, ``B = eᵇ``, ``E = eᵉ``), so every
coefficient stays positive without bounds. The objective is the Huber loss (δ = 1e-3) of the log-residuals
``log L̂ − log L``, **summed** over points (a mean makes it so small that L-BFGS stops on its tolerance
before it has converged). L-BFGS with the analytic gradient runs from every start of a grid (Hoffmann's
4,500 for L(N, D)); all starts are optimized together by :mod:`trilm.scaling.optim`, and the best is kept.

A fit that cannot be trusted raises :class:`FitError` with a message naming what is wrong: too few points
or distinct sizes for the number of parameters, non-positive or non-finite inputs, or no start converged.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import numpy as np

from trilm.scaling import optim
from trilm.scaling.errors import FitError

HUBER_DELTA = 1e-3
BLOCK_ELEMENTS = 65536
UNDERFLOW = 1e-280


@dataclasses.dataclass(frozen=True)
class Form:
    """One scaling-law form: which inputs it uses and how its log-space parameters are ordered.

    The parameter vector is ``[a_1, α_1, …, a_K, α_K, e]``: one (log-coefficient, exponent) pair per power-law
    term, then the log irreducible loss.
    """

    name: str
    variables: tuple[str, ...]
    coef_names: tuple[str, ...]
    exp_names: tuple[str, ...]

    @property
    def n_params(self) -> int:
        return 2 * len(self.variables) + 1

    @property
    def title(self) -> str:
        return f"L({', '.join(self.variables)})"

    def natural(self, theta: np.ndarray) -> dict[str, float]:
        """Map a log-space parameter vector to ``{"E":…, "A":…, "alpha":…, …}`` (a coefficient beyond float
        range, as a step-like fit gives, becomes inf)."""
        with np.errstate(over="ignore"):
            out = {"E": float(np.exp(theta[-1]))}
            for k, (c, x) in enumerate(zip(self.coef_names, self.exp_names)):
                out[c] = float(np.exp(theta[2 * k]))
                out[x] = float(theta[2 * k + 1])
        return out

    def theta_from_natural(self, params: dict[str, float]) -> np.ndarray:
        theta = []
        for c, x in zip(self.coef_names, self.exp_names):
            theta += [np.log(params[c]), params[x]]
        return np.array([*theta, np.log(params["E"])])

    def default_grid(self) -> np.ndarray:
        """Hoffmann's grid: exponents 0…2 by 0.5, e −1…1 by 0.5, log-coefficients 0…25 by 5."""
        coefs = np.arange(0.0, 30.0, 5.0)
        exps = np.arange(0.0, 2.5, 0.5)
        es = np.arange(-1.0, 1.5, 0.5)
        axes = [axis for _ in self.variables for axis in (coefs, exps)] + [es]
        return np.array(list(itertools.product(*axes)), dtype=float)

    def coarse_grid(self) -> np.ndarray:
        """Three values per axis (log-coefficients 0, 10, 20; exponents 0.25, 0.75, 1.5; e −1, 0, 1).

        Used to restart bootstrap refits, where Hoffmann's full grid would cost 150 starts per resample.
        """
        coefs = np.array([0.0, 10.0, 20.0])
        exps = np.array([0.25, 0.75, 1.5])
        es = np.array([-1.0, 0.0, 1.0])
        axes = [axis for _ in self.variables for axis in (coefs, exps)] + [es]
        return np.array(list(itertools.product(*axes)), dtype=float)


FORMS: dict[str, Form] = {
    "N": Form("N", ("N",), ("A",), ("alpha",)),
    "D": Form("D", ("D",), ("B",), ("beta",)),
    "ND": Form("ND", ("N", "D"), ("A", "B"), ("alpha", "beta")),
}


def get_form(name: str) -> Form:
    try:
        return FORMS[name]
    except KeyError:
        raise FitError(f"unknown form {name!r}; choose from {', '.join(FORMS)}") from None


def predict_log(form: Form, theta: np.ndarray, log_x: np.ndarray) -> np.ndarray:
    """log L̂ for parameters ``theta (B, P)`` or ``(P,)`` at log inputs ``log_x (K, n)``."""
    theta = np.atleast_2d(theta)
    k = len(form.variables)
    terms = np.empty((theta.shape[0], k + 1, log_x.shape[1]))
    for j in range(k):
        terms[:, j] = theta[:, 2 * j, None] - theta[:, 2 * j + 1, None] * log_x[j]
    terms[:, k] = theta[:, -1, None]
    top = terms.max(axis=1)
    return top + np.log(np.exp(terms - top[:, None]).sum(axis=1))


class HuberObjective:
    """Σᵢ wᵢ·Huber_δ(log L̂ᵢ − log Lᵢ) and its analytic gradient, for a batch of parameter vectors.

    Data are shared by all problems (``log_x (K, n)``, ``log_y (n,)``) or given per data row
    (``log_x (K, M, n)``, ``log_y (M, n)``: several datasets padded to one length, the padding weighted 0).
    ``weights`` is ``None`` (every point once) or ``(R, n)``: bootstrap counts or padding masks.
    ``data_index`` and ``weight_index`` map each problem to its data row and weight row (default: problem
    ``i`` uses row ``i``), so many starts share one dataset without copying it.
    """

    def __init__(
        self,
        form: Form,
        log_x: np.ndarray,
        log_y: np.ndarray,
        *,
        delta: float = HUBER_DELTA,
        weights: np.ndarray | None = None,
        data_index: np.ndarray | None = None,
        weight_index: np.ndarray | None = None,
    ) -> None:
        self.form = form
        self.log_x = np.asarray(log_x, dtype=float)
        self.log_y = np.asarray(log_y, dtype=float)
        self.per_row = self.log_y.ndim == 2
        self.delta = float(delta)
        self.weights = None if weights is None else np.asarray(weights, dtype=float)
        self.data_index = None if data_index is None else np.asarray(data_index)
        self.weight_index = None if weight_index is None else np.asarray(weight_index)

    def fun_grad(self, theta: np.ndarray, idx: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Objective ``(B,)`` and gradient ``(B, P)`` of problems ``idx`` (default: 0…B−1) at ``theta``."""
        theta = np.atleast_2d(theta)
        if idx is None:
            idx = np.arange(theta.shape[0])
        # Blocks of ~64k elements keep the temporaries in cache: about 4x faster than one big batch.
        rows = max(1, BLOCK_ELEMENTS // max(1, self.log_y.shape[-1]))
        if theta.shape[0] <= rows:
            return self._block(theta, idx)
        f = np.empty(theta.shape[0])
        g = np.empty_like(theta)
        for s in range(0, theta.shape[0], rows):
            f[s : s + rows], g[s : s + rows] = self._block(theta[s : s + rows], idx[s : s + rows])
        return f, g

    def _workspace(self, b: int) -> np.ndarray:
        """Reused ``(slots, b, n)`` scratch arrays. Allocating the block temporaries afresh on every call
        made glibc hand them back to the kernel and fault them in again, which doubled the time."""
        k = len(self.form.variables)
        slots = 2 * k + 7
        n = self.log_y.shape[-1]
        if getattr(self, "_work", None) is None or self._work.shape[1] < b:
            rows = max(b, min(BLOCK_ELEMENTS // max(1, n), 1 << 20))
            self._work: np.ndarray = np.empty((slots, rows, n))
        return self._work[:, :b]

    def _block(self, theta: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        k = len(self.form.variables)
        work = self._workspace(theta.shape[0])
        if self.per_row:
            rows = idx if self.data_index is None else self.data_index[idx]
            log_x = work[k + 5 : 2 * k + 5]
            np.take(self.log_x, rows, axis=1, out=log_x)
            log_y = np.take(self.log_y, rows, axis=0, out=work[2 * k + 5])
        else:
            log_x, log_y = self.log_x, self.log_y
        w = None
        if self.weights is not None:
            wrows = idx if self.weight_index is None else self.weight_index[idx]
            w = np.take(self.weights, wrows, axis=0, out=work[2 * k + 6])
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            f, g, underflow = self._eval(theta, log_x, log_y, w, work, per_problem_shift=True)
        if underflow.any():
            sub = np.flatnonzero(underflow)
            f[sub], g[sub], _ = self._eval(
                theta[sub],
                log_x[:, sub] if self.per_row else log_x,
                log_y[sub] if self.per_row else log_y,
                None if w is None else w[sub],
                np.empty((k + 5, sub.size, work.shape[2])),
                per_problem_shift=False,
            )
        return f, g

    def _eval(
        self,
        theta: np.ndarray,
        log_x: np.ndarray,
        log_y: np.ndarray,
        w: np.ndarray | None,
        work: np.ndarray,
        *,
        per_problem_shift: bool,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Objective and gradient via log-sum-exp shifted by a per-problem max (one exp fewer, about 4x
        faster) or, for the rare problems where that underflows, by the per-point max. ``work`` holds at
        least ``k + 5`` scratch arrays of the block's shape."""
        k = len(self.form.variables)
        us, total, resid, clipped = work[:k], work[k], work[k + 1], work[k + 2]
        e = theta[:, -1]
        # Power-law terms u_j = a_j − α_j·x_j; the constant term is e.
        for j in range(k):
            np.multiply(theta[:, 2 * j + 1, None], log_x[j], out=us[j])
            np.subtract(theta[:, 2 * j, None], us[j], out=us[j])
        if per_problem_shift:
            top = e.copy()
            for j in range(k):
                np.maximum(top, us[j].max(axis=1), out=top)
            top = top[:, None]
            p_e = np.exp(e[:, None] - top)
        else:
            top = np.maximum(us[0], e[:, None], out=work[k + 3])
            for j in range(1, k):
                np.maximum(top, us[j], out=top)
            p_e = np.subtract(e[:, None], top, out=work[k + 4])
            np.exp(p_e, out=p_e)
        for j in range(k):
            us[j] -= top
            np.exp(us[j], out=us[j])
        np.add(us[0], p_e, out=total)
        for j in range(1, k):
            total += us[j]
        # Rows where some point's terms all (nearly) underflowed are redone with the per-point shift.
        underflow = ~(total.min(axis=1) > UNDERFLOW)
        np.log(total, out=resid)
        resid += top
        resid -= log_y
        d = self.delta
        np.clip(resid, -d, d, out=clipped)
        # Huber(r) = c·(2r − c)/2 with c = clip(r, −δ, δ): r²/2 inside the band, δ(|r| − δ/2) outside.
        resid *= 2.0
        resid -= clipped
        resid *= clipped
        if w is not None:
            resid *= w
            clipped *= w
        f = 0.5 * resid.sum(axis=1)
        clipped /= total  # dHuber/dlogL̂ divided by the softmax normaliser
        g = np.empty_like(theta)
        for j in range(k):
            us[j] *= clipped
            g[:, 2 * j] = us[j].sum(axis=1)
            g[:, 2 * j + 1] = (
                -np.einsum("bn,bn->b", us[j], log_x[j]) if log_x.ndim == 3 else -(us[j] @ log_x[j])
            )
        if per_problem_shift:
            g[:, -1] = clipped.sum(axis=1) * p_e[:, 0]
        else:
            p_e *= clipped
            g[:, -1] = p_e.sum(axis=1)
        return f, g, underflow


def pad_datasets(logs: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Stack datasets ``[(log_x (K, n_d), log_y (n_d,)), …]`` into padded ``(K, M, n)``, ``(M, n)`` and a
    0/1 mask ``(M, n)``; padding repeats each dataset's first point so every value stays finite."""
    n_max = max(ly.size for _, ly in logs)
    k = logs[0][0].shape[0]
    log_x = np.empty((k, len(logs), n_max))
    log_y = np.empty((len(logs), n_max))
    mask = np.zeros((len(logs), n_max))
    for i, (lx, ly) in enumerate(logs):
        log_x[:, i] = lx[:, :1]
        log_y[i] = ly[0]
        log_x[:, i, : ly.size] = lx
        log_y[i, : ly.size] = ly
        mask[i, : ly.size] = 1.0
    return log_x, log_y, mask


@dataclasses.dataclass
class FitResult:
    """A fitted law: natural parameters, the log-space vector, objective, residuals and how it converged."""

    form: str
    params: dict[str, float]
    theta: np.ndarray
    objective: float
    n_points: int
    log_residuals: np.ndarray
    converged: bool
    status: str
    n_starts: int
    n_starts_converged: int
    n_iter: int
    delta: float = HUBER_DELTA
    notes: list[str] = dataclasses.field(default_factory=list)

    def predict(self, **inputs: Any) -> np.ndarray:
        """Loss at the given inputs, e.g. ``fit.predict(N=1e9, D=2e10)``."""
        form = get_form(self.form)
        missing = [v for v in form.variables if v not in inputs]
        if missing:
            raise FitError(f"{form.title} needs {', '.join(missing)} to predict")
        arrays = np.broadcast_arrays(*[np.asarray(inputs[v], dtype=float) for v in form.variables])
        shape = arrays[0].shape
        log_x = np.stack([np.log(a.ravel()) for a in arrays])
        return np.exp(predict_log(form, self.theta, log_x))[0].reshape(shape)

    def to_dict(self) -> dict[str, Any]:
        r = self.log_residuals
        return {
            "form": self.form,
            "params": self.params,
            "objective": self.objective,
            "huber_delta": self.delta,
            "n_points": self.n_points,
            "converged": self.converged,
            "status": self.status,
            "n_starts": self.n_starts,
            "n_starts_converged": self.n_starts_converged,
            "n_iter": self.n_iter,
            "log_residuals": [float(v) for v in r],
            "log_residual_rms": float(np.sqrt(np.mean(r * r))),
            "log_residual_max_abs": float(np.max(np.abs(r))),
            "notes": list(self.notes),
        }


def validate_inputs(
    form: Form, inputs: dict[str, Any], loss: Any, *, label: str = ""
) -> tuple[np.ndarray, np.ndarray]:
    """Check and log-transform the inputs of a fit; return ``(log_x (K, n), log_y (n,))``.

    Raises :class:`FitError` naming the fit (``label``), the variable and the first bad point.
    """
    where = f"{label}: " if label else ""
    y = np.asarray(loss, dtype=float).ravel()
    cols = []
    for v in form.variables:
        if v not in inputs:
            raise FitError(f"{where}{form.title} needs the input {v}")
        cols.append(np.asarray(inputs[v], dtype=float).ravel())
    for name, arr in [*zip(form.variables, cols), ("loss", y)]:
        if arr.shape != y.shape:
            raise FitError(f"{where}{name} has {arr.size} values but loss has {y.size}")
        bad = np.flatnonzero(~np.isfinite(arr) | (arr <= 0))
        if bad.size:
            i = int(bad[0])
            raise FitError(
                f"{where}{name} must be positive and finite; point {i} has {name}={float(arr[i])!r}"
                f" ({bad.size} bad value{'s' if bad.size > 1 else ''})"
            )
    if y.size < form.n_params:
        raise FitError(
            f"{where}{form.title} has {form.n_params} parameters but only {y.size} point"
            f"{'s' if y.size != 1 else ''}; need at least {form.n_params}"
        )
    for name, arr in zip(form.variables, cols):
        distinct = np.unique(arr).size
        if distinct < 3:
            raise FitError(
                f"{where}{form.title} needs at least 3 distinct values of {name} to identify a power"
                f" law plus a constant; got {distinct} ({', '.join(f'{v:.4g}' for v in np.unique(arr))})"
            )
    return np.log(np.stack(cols)), np.log(y)


def fit_law(
    form: str | Form,
    inputs: dict[str, Any],
    loss: Any,
    *,
    delta: float = HUBER_DELTA,
    grid: np.ndarray | None = None,
    max_iter: int = 2000,
    label: str = "",
) -> FitResult:
    """Fit ``form`` to ``loss`` at ``inputs`` (``{"N": …, "D": …}``) by multi-start L-BFGS; see module doc.

    ``grid`` is an ``(S, P)`` array of log-space starts (default: Hoffmann's grid for the form). Raises
    :class:`FitError` on bad input or when the best start did not converge.
    """
    result = fit_many(form, [(inputs, loss)], labels=[label], delta=delta, grid=grid, max_iter=max_iter)[0]
    assert isinstance(result, FitResult)
    return result


def fit_many(
    form: str | Form,
    datasets: list[tuple[dict[str, Any], Any]],
    *,
    labels: list[str] | None = None,
    delta: float = HUBER_DELTA,
    grid: np.ndarray | None = None,
    warm: np.ndarray | None = None,
    max_iter: int = 2000,
    errors: str = "raise",
) -> list[FitResult | FitError]:
    """Fit one form to several datasets ``[(inputs, loss), …]`` in one batched optimization.

    Every dataset gets the grid's starts (and its row of ``warm (n_datasets, P)`` as one more start); the
    datasets are padded to a common length, so one L-BFGS batch serves them all and the per-iteration
    overhead is paid once. With ``errors="return"`` a dataset that is invalid or does not converge yields
    its :class:`FitError` in the list instead of raising.
    """
    form = get_form(form) if isinstance(form, str) else form
    labels = list(labels) if labels is not None else [""] * len(datasets)
    starts = form.default_grid() if grid is None else np.atleast_2d(np.asarray(grid, dtype=float))
    if starts.shape[1] != form.n_params:
        raise FitError(f"{form.title}: grid has {starts.shape[1]} columns, the form has {form.n_params}")
    results: list[FitResult | FitError | None] = [None] * len(datasets)
    valid, logs = [], []
    for i, ((inputs, loss), label) in enumerate(zip(datasets, labels)):
        try:
            logs.append(validate_inputs(form, inputs, loss, label=label))
            valid.append(i)
        except FitError as exc:
            if errors == "raise":
                raise
            results[i] = exc
    if valid:
        n_start = starts.shape[0] + (warm is not None)
        x0 = np.concatenate(
            [np.vstack([starts, warm[i][None]]) if warm is not None else starts for i in valid]
        )
        if len(valid) == 1:
            objective = HuberObjective(form, logs[0][0], logs[0][1], delta=delta)
        else:
            log_x, log_y, mask = pad_datasets(logs)
            rows: np.ndarray = np.repeat(np.arange(len(valid)), n_start)
            objective = HuberObjective(
                form, log_x, log_y, delta=delta, weights=mask, data_index=rows, weight_index=rows
            )
        res = optim.minimize_batched(objective.fun_grad, x0, max_iter=max_iter)
        for j, i in enumerate(valid):
            part = slice(j * n_start, (j + 1) * n_start)
            sub = optim.BatchResult(
                x=res.x[part],
                fun=res.fun[part],
                grad=res.grad[part],
                n_iter=res.n_iter[part],
                status=res.status[part],
            )
            try:
                results[i] = _best_of(form, sub, logs[j][0], logs[j][1], delta=delta, label=labels[i])
            except FitError as exc:
                if errors == "raise":
                    raise
                results[i] = exc
    return [r for r in results if r is not None]


def _best_of(
    form: Form, res: optim.BatchResult, log_x: np.ndarray, log_y: np.ndarray, *, delta: float, label: str
) -> FitResult:
    fun = np.where(np.isfinite(res.fun), res.fun, np.inf)
    conv = res.converged
    if not conv.any():
        best = int(np.argmin(fun))
        counts = {optim.STATUS_TEXT[s]: int(c) for s, c in zip(*np.unique(res.status, return_counts=True))}
        raise FitError(
            f"{label or form.title}: the fit did not converge from any of {fun.size} start"
            f"{'s' if fun.size > 1 else ''} ({counts}); best objective {fun[best]:.6g} after"
            f" {res.n_iter[best]} iterations. Check the data, or raise max_iter"
        )
    best_conv = int(np.flatnonzero(conv)[np.argmin(fun[conv])])
    best_any = int(np.argmin(fun))
    notes = []
    if fun[best_any] < fun[best_conv] * (1 - 1e-9):
        notes.append(
            f"a start that did not converge ({optim.STATUS_TEXT[int(res.status[best_any])]}) reached a lower"
            f" objective ({fun[best_any]:.6g} vs {fun[best_conv]:.6g}); the converged one is reported"
        )
    theta = res.x[best_conv]
    resid = predict_log(form, theta, log_x)[0] - log_y
    params = form.natural(theta)
    for c, x in zip(form.coef_names, form.exp_names):
        if params[x] < 1e-3:
            notes.append(
                f"exponent {x} = {params[x]:.3g} is at or below zero: the data show no decrease in"
                f" {form.variables[form.exp_names.index(x)]} and {c} is not identified"
            )
    return FitResult(
        form=form.name,
        params=params,
        theta=theta.copy(),
        objective=float(fun[best_conv]),
        n_points=int(log_y.size),
        log_residuals=resid,
        converged=True,
        status=optim.STATUS_TEXT[int(res.status[best_conv])],
        n_starts=int(fun.size),
        n_starts_converged=int(conv.sum()),
        n_iter=int(res.n_iter[best_conv]),
        delta=delta,
        notes=notes,
    )
