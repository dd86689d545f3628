"""Bootstrap intervals and leave-one-size-out extrapolation error for scaling-law fits.

The bootstrap resamples *units* with replacement (a unit is a point, a run, or a model size) and refits
every resample; all resamples are optimized together as one batch (:mod:`trilm.scaling.optim`), each from
the full-data fit as Epoch AI did, and for the 3-parameter forms also from a coarse grid of starts, since
with a handful of sizes the Huber objective has several local minima. Intervals are percentile intervals
of the refitted parameters. Resampling the same size labels for several families (``unit_counts``
shared between them) gives a *paired* bootstrap, the right way to compare two families measured at the
same sizes.

Leave-one-size-out refits without each size and reports how well the fit predicts it; for the largest
size that is the honest extrapolation error of the law.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Sequence
from typing import Any, Protocol

import numpy as np

from trilm.scaling import optim
from trilm.scaling.fit import (
    HUBER_DELTA,
    FitError,
    FitResult,
    Form,
    HuberObjective,
    fit_many,
    get_form,
    pad_datasets,
    predict_log,
    validate_inputs,
)

SCREEN_ITER = 25
SCREEN_KEEP = 3


def unit_counts(labels: Sequence[Hashable], n_resamples: int, seed: int) -> tuple[np.ndarray, list[Hashable]]:
    """Draw ``n_resamples`` resamples of the distinct ``labels`` with replacement.

    Returns ``(counts (R, U), units)``: how often each distinct unit (in ``units`` order) was drawn.
    """
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
    """Per-point weights ``(R, n)``: each point gets the draw count of its unit (0 if it was not drawn)."""
    where = {u: i for i, u in enumerate(units)}
    missing = [u for u in point_units if u not in where]
    if missing:
        raise FitError(f"bootstrap: unit {missing[0]!r} of a point is not among the resampled units")
    return counts[:, [where[u] for u in point_units]]


@dataclasses.dataclass
class BootstrapResult:
    """Refitted parameters of the accepted resamples and how many were rejected and why.

    ``indices`` are the resample numbers (rows of the weight matrix) that were accepted: two results made
    from shared counts are paired on the indices they have in common.
    """

    form: str
    thetas: np.ndarray
    indices: np.ndarray
    n_resamples: int
    n_degenerate: int
    n_failed: int
    seed: int
    level: float = 0.95

    @property
    def n_ok(self) -> int:
        return int(self.thetas.shape[0])

    def params(self) -> dict[str, np.ndarray]:
        form = get_form(self.form)
        nat = [form.natural(t) for t in self.thetas]
        return {k: np.array([p[k] for p in nat]) for k in (nat[0] if nat else {})}

    def interval(self, values: np.ndarray) -> tuple[float, float]:
        tail = 100 * (1 - self.level) / 2
        lo, hi = np.percentile(values, [tail, 100 - tail])
        return float(lo), float(hi)

    def summary(self) -> dict[str, dict[str, float]]:
        """Per parameter: standard error (std over resamples) and the percentile interval."""
        out = {}
        for name, values in self.params().items():
            if not np.isfinite(values).all():
                out[name] = {"se": float("nan"), "lo": float(np.min(values)), "hi": float(np.max(values))}
                continue
            lo, hi = self.interval(values)
            out[name] = {
                "se": float(np.std(values, ddof=1)) if values.size > 1 else float("nan"),
                "lo": lo,
                "hi": hi,
            }
        return out

    def predict(self, **inputs: Any) -> np.ndarray:
        """Predicted loss of every accepted resample at the inputs: ``(n_ok, *shape)``."""
        form = get_form(self.form)
        arrays = np.broadcast_arrays(*[np.asarray(inputs[v], dtype=float) for v in form.variables])
        log_x = np.stack([np.log(a.ravel()) for a in arrays])
        return np.exp(predict_log(form, self.thetas, log_x)).reshape(self.n_ok, *arrays[0].shape)

    def band(self, **inputs: Any) -> tuple[np.ndarray, np.ndarray]:
        """Pointwise percentile band of the predicted loss at the inputs."""
        tail = 100 * (1 - self.level) / 2
        lo, hi = np.percentile(self.predict(**inputs), [tail, 100 - tail], axis=0)
        return lo, hi

    def to_dict(self) -> dict[str, Any]:
        return {
            "n_resamples": self.n_resamples,
            "n_accepted": self.n_ok,
            "n_degenerate": self.n_degenerate,
            "n_not_converged": self.n_failed,
            "seed": self.seed,
            "level": self.level,
            "method": "percentile",
            "params": self.summary(),
        }


def bootstrap_fit(
    fit: FitResult,
    inputs: dict[str, Any],
    loss: Any,
    *,
    n_resamples: int = 1000,
    seed: int = 0,
    level: float = 0.95,
    units: Sequence[Hashable] | None = None,
    weights: np.ndarray | None = None,
    restart_grid: bool | None = None,
    delta: float = HUBER_DELTA,
    label: str = "",
) -> BootstrapResult:
    """Refit ``fit`` on bootstrap resamples of its data.

    Resampling is over ``units`` (one label per point; default: every point is its own unit) unless
    ``weights (R, n)`` are given directly (e.g. paired counts shared with another family). A resample is
    *degenerate*, and dropped, when it has fewer distinct values of some input than the form needs; one
    whose best start did not converge is dropped as *not converged*. Both counts are reported.
    ``restart_grid`` (default: only for forms with ≤ 3 parameters) adds screened starts from the form's
    coarse grid.
    """
    if weights is None:
        n = np.asarray(loss).size
        point_units = list(range(n)) if units is None else list(units)
        counts, unit_list = unit_counts(point_units, n_resamples, seed)
        weights = point_weights(point_units, counts, unit_list)
    result = bootstrap_many(
        [fit],
        [(inputs, loss)],
        [weights],
        seed=seed,
        level=level,
        restart_grid=restart_grid,
        delta=delta,
        labels=[label],
    )[0]
    if isinstance(result, FitError):
        raise result
    return result


def bootstrap_many(
    fits: list[FitResult],
    datasets: list[tuple[dict[str, Any], Any]],
    weights: list[np.ndarray],
    *,
    seed: int = 0,
    level: float = 0.95,
    restart_grid: bool | None = None,
    delta: float = HUBER_DELTA,
    labels: list[str] | None = None,
) -> list[BootstrapResult | FitError]:
    """Bootstrap several fits of one form together: one batch for all their resamples.

    ``weights[i]`` is ``(R_i, n_i)``, the resample counts of dataset ``i``'s points. Returns, per fit, its
    :class:`BootstrapResult`, or the :class:`FitError` saying why it has none (every resample degenerate,
    or none converged).
    """
    if not 0 < level < 1:
        raise FitError(f"bootstrap: level must be in (0, 1), got {level}")
    if not fits:
        return []
    form: Form = get_form(fits[0].form)
    labels = list(labels) if labels is not None else [""] * len(fits)
    logs, goods, counts = [], [], []
    results: list[BootstrapResult | FitError | None] = [None] * len(fits)
    for i, ((inputs, loss), w, label) in enumerate(zip(datasets, weights, labels)):
        log_x, log_y = validate_inputs(form, inputs, loss, label=label)
        w = np.asarray(w, dtype=float)
        if w.ndim != 2 or w.shape[1] != log_y.size:
            raise FitError(
                f"{label or form.title}: bootstrap weights must be (resamples, {log_y.size}), got {w.shape}"
            )
        good = np.flatnonzero(_identifiable(form, log_x, w))
        if good.size == 0:
            results[i] = FitError(
                f"{label or form.title}: every bootstrap resample is degenerate (fewer than 3 distinct"
                " values of an input); there are too few sizes for a bootstrap"
            )
        logs.append((log_x, log_y))
        goods.append(good)
        counts.append(w)
    live = [i for i in range(len(fits)) if results[i] is None]
    if live:
        if len(live) == 1:
            log_x, log_y = logs[live[0]]  # one dataset: shared data, no padding
        else:
            log_x, log_y, _ = pad_datasets([logs[i] for i in live])
        n_max = log_y.shape[-1]
        row_w = np.zeros((sum(goods[i].size for i in live), n_max))
        row_data: np.ndarray = np.repeat(np.arange(len(live)), [goods[i].size for i in live])
        at = 0
        for i in live:
            n_i = logs[i][1].size
            row_w[at : at + goods[i].size, :n_i] = counts[i][goods[i]]
            at += goods[i].size
        warm = np.concatenate([np.tile(fits[i].theta, (goods[i].size, 1)) for i in live])
        if restart_grid is None:
            restart_grid = form.n_params <= 3
        thetas, converged = _refit(form, log_x, log_y, row_w, row_data, warm, restart_grid, delta)
        at = 0
        for i in live:
            part = slice(at, at + goods[i].size)
            at += goods[i].size
            ok = converged[part]
            n_failed = int((~ok).sum())
            if not ok.any():
                results[i] = FitError(
                    f"{labels[i] or form.title}: no bootstrap resample converged ({n_failed} tried)"
                )
                continue
            results[i] = BootstrapResult(
                form=form.name,
                thetas=thetas[part][ok],
                indices=goods[i][ok],
                n_resamples=int(counts[i].shape[0]),
                n_degenerate=int(counts[i].shape[0] - goods[i].size),
                n_failed=n_failed,
                seed=seed,
                level=level,
            )
    return [r for r in results if r is not None]


class HasParams(Protocol):
    """Any law with a parameter count (a :class:`Form` or a :mod:`trilm.scaling.laws` law)."""

    @property
    def n_params(self) -> int: ...


def _identifiable(form: Form | HasParams, log_x: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Resamples with enough drawn points and at least 3 distinct values of every input."""
    drawn = weights > 0
    ok = drawn.sum(axis=1) >= form.n_params
    for j in range(log_x.shape[0]):
        values, inverse = np.unique(log_x[j], return_inverse=True)
        present = np.zeros((weights.shape[0], values.size))
        np.add.at(present.T, inverse, drawn.T.astype(float))
        ok &= (present > 0).sum(axis=1) >= 3
    return ok


def _refit(
    form: Form,
    log_x: np.ndarray,
    log_y: np.ndarray,
    weights: np.ndarray,
    data_rows: np.ndarray,
    warm: np.ndarray,
    restart_grid: bool,
    delta: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Best converged refit per weight row: from its ``warm`` start, and with ``restart_grid`` the grid too.

    Row ``r`` fits dataset ``data_rows[r]`` of the padded ``log_x (K, M, n)``, ``log_y (M, n)`` (or of the one
    shared dataset ``log_x (K, n)``, ``log_y (n,)``) with point
    weights ``weights[r]``. Grid starts (the form's coarse grid) are screened: every start runs
    ``SCREEN_ITER`` iterations, then the ``SCREEN_KEEP`` lowest per row continue to convergence. A few sizes
    give a rugged objective (a Huber kink per point), so the warm start alone sometimes stops in a worse
    local minimum; screening keeps the grid's protection at a fraction of its cost.
    """
    n_rows = weights.shape[0]
    rows = np.arange(n_rows)

    def objective(row_of_problem: np.ndarray) -> HuberObjective:
        return HuberObjective(
            form,
            log_x,
            log_y,
            delta=delta,
            weights=weights,
            data_index=data_rows[row_of_problem],
            weight_index=row_of_problem,
        )

    warm_res = optim.minimize_batched(objective(rows).fun_grad, warm)
    cand_x = warm_res.x[:, None, :]
    cand_f = np.where(warm_res.converged, warm_res.fun, np.inf)[:, None]
    if restart_grid:
        grid = form.coarse_grid()
        n_start = grid.shape[0]
        screen_rows: np.ndarray = np.repeat(rows, n_start)
        screen = optim.minimize_batched(
            objective(screen_rows).fun_grad, np.tile(grid, (n_rows, 1)), max_iter=SCREEN_ITER
        )
        screen_f = np.where(np.isfinite(screen.fun), screen.fun, np.inf).reshape(n_rows, n_start)
        keep = np.argsort(screen_f, axis=1)[:, :SCREEN_KEEP]
        picked = (rows[:, None] * n_start + keep).ravel()
        cont = optim.minimize_batched(objective(np.repeat(rows, keep.shape[1])).fun_grad, screen.x[picked])
        cont_f = np.where(cont.converged & np.isfinite(cont.fun), cont.fun, np.inf).reshape(n_rows, -1)
        cand_x = np.concatenate([cand_x, cont.x.reshape(n_rows, keep.shape[1], -1)], axis=1)
        cand_f = np.concatenate([cand_f, cont_f], axis=1)
    best = np.argmin(cand_f, axis=1)
    return cand_x[rows, best], np.isfinite(cand_f[rows, best])


def leave_one_out(
    fit: FitResult,
    inputs: dict[str, Any],
    loss: Any,
    groups: Sequence[Hashable],
    *,
    delta: float = HUBER_DELTA,
    label: str = "",
) -> list[dict[str, Any]]:
    """Refit without each group (e.g. a model size) and compare its predicted and observed losses.

    Each entry: the group, how many points it had, the mean observed and predicted loss, the relative error
    ``predicted / observed − 1`` (mean over the group's points), whether the group lay outside the range of
    the remaining sizes (a true extrapolation), or ``skipped`` with the reason the refit was impossible.
    All refits run as one batch, each from the full-data fit (removing one size moves the optimum a little)
    and from the form's coarse grid.
    """
    form = get_form(fit.form)
    y = np.asarray(loss, dtype=float).ravel()
    cols = {v: np.asarray(inputs[v], dtype=float).ravel() for v in form.variables}
    groups = list(groups)
    if len(groups) != y.size:
        raise FitError(f"{label or form.title}: {len(groups)} group labels for {y.size} points")
    distinct = list(dict.fromkeys(groups))
    held = [np.array([g == group for g in groups]) for group in distinct]
    refits = fit_many(
        form,
        [({v: c[~h] for v, c in cols.items()}, y[~h]) for h in held],
        labels=[f"{label} without {group}" for group in distinct],
        delta=delta,
        grid=form.coarse_grid(),
        warm=np.tile(fit.theta, (len(distinct), 1)),
        errors="return",
    )
    out = []
    first = form.variables[0]
    for group, h, refit in zip(distinct, held, refits):
        entry: dict[str, Any] = {"group": group, "n_points": int(h.sum())}
        if isinstance(refit, FitError):
            entry["skipped"] = str(refit)
        else:
            pred = refit.predict(**{v: c[h] for v, c in cols.items()})
            entry.update(
                observed=float(np.mean(y[h])),
                predicted=float(np.mean(pred)),
                rel_error=float(np.mean(pred / y[h] - 1.0)),
                extrapolation=bool(
                    np.all(cols[first][h] > cols[first][~h].max())
                    or np.all(cols[first][h] < cols[first][~h].min())
                ),
            )
        out.append(entry)
    return out
