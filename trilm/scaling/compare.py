"""Family comparison on one-variable laws L(x): where two curves cross, and which size of a reference
family matches a model's loss.

Spectra's question is whether TriLM approaches FloatLM at equal parameters and beats it at equal size in
bits. With ``x`` the parameter count this answers the first, with ``x`` the model size in bits the second.
Uncertainty comes from paired bootstrap resamples (the same sizes drawn for both families, paired on
:attr:`trilm.scaling.fitter.Fit.boot_index`): every derived number is recomputed on each resample pair and
reported as its percentile interval (:func:`trilm.scaling.fitter.percentile_interval`).
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from trilm.scaling.fitter import Fit, percentile_interval
from trilm.scaling.laws import get_law

EXTRAPOLATE = 10.0
"""A fitted law is read at most this factor (one decade) beyond its data: curves are drawn that far, and a
size matched further out is reported as beyond the reference's reach, not as a ratio."""


def _curve_log(thetas: np.ndarray, log_x: np.ndarray) -> np.ndarray:
    """log L̂ of the one-input law ``n`` (θ = [ln A, α, ln E]) for ``thetas (B, 3)`` at ``log_x (n,)``."""
    return get_law("n").log_predict(thetas, log_x[None, :])


def crossings_theta(
    theta_a: np.ndarray, theta_b: np.ndarray, lo: float, hi: float, n_grid: int = 512
) -> list[float]:
    """All x in [lo, hi] where two one-variable laws (log-space vectors ``[a, α, e]``) predict equal loss.

    Sign changes of log L_a − log L_b on a log-spaced grid are refined by bisection to 1e-10 in log x.
    """
    log_x = np.linspace(np.log(lo), np.log(hi), n_grid)
    diff = _curve_log(theta_a[None], log_x)[0] - _curve_log(theta_b[None], log_x)[0]
    out = []
    for i in np.flatnonzero(np.sign(diff[:-1]) * np.sign(diff[1:]) < 0):
        left, right = log_x[i], log_x[i + 1]
        d_left = diff[i]
        while right - left > 1e-10:
            mid = 0.5 * (left + right)
            d_mid = (
                _curve_log(theta_a[None], np.array([mid]))[0, 0]
                - _curve_log(theta_b[None], np.array([mid]))[0, 0]
            )
            if np.sign(d_mid) == np.sign(d_left):
                left, d_left = mid, d_mid
            else:
                right = mid
        out.append(float(np.exp(0.5 * (left + right))))
    return out


def matched_x(theta_ref: np.ndarray, loss: np.ndarray | float) -> np.ndarray | float:
    """The x at which the reference law reaches ``loss``: (A / (L − E))^(1/α); inf when L ≤ E.

    ``theta_ref`` is one vector ``[a, α, e]`` (with a scalar loss: returns a float) or ``(R, 3)`` with one
    loss per row.
    """
    theta = np.asarray(theta_ref, dtype=float)
    single = theta.ndim == 1 and np.ndim(loss) == 0
    theta = np.atleast_2d(theta)
    a, alpha, e = theta[:, 0], theta[:, 1], theta[:, 2]
    excess = np.asarray(loss, dtype=float) - np.exp(e)
    reachable = (excess > 0) & (alpha > 0)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        x = np.exp((a - np.log(np.where(reachable, excess, 1.0))) / np.where(reachable, alpha, 1.0))
    x = np.where(reachable, x, np.inf)
    return float(x[0]) if single else x


def _paired(fit_a: Fit, fit_b: Fit) -> tuple[np.ndarray, np.ndarray] | None:
    """The two fits' refits of the resamples both accepted, row by row (None without refits)."""
    if fit_a.boot_thetas is None or fit_b.boot_thetas is None:
        return None
    if fit_a.boot_index is None or fit_b.boot_index is None:
        return None
    common, ia, ib = np.intersect1d(fit_a.boot_index, fit_b.boot_index, return_indices=True)
    if common.size == 0:
        return None
    return fit_a.boot_thetas[ia], fit_b.boot_thetas[ib]


def _interval(values: np.ndarray, level: float) -> list[float]:
    lo, hi = percentile_interval(values, level)
    return [float(lo), float(hi)]


def compare_pair(
    reference: str,
    family: str,
    fit_ref: Fit,
    fit_fam: Fit,
    points: list[dict[str, Any]],
    x_ref: np.ndarray,
    *,
    axis: str = "params",
    level: float = 0.95,
) -> dict[str, Any]:
    """Compare ``family`` with ``reference`` on one axis.

    ``points`` are the family's models (``{"size", "x", "loss"}``), ``x_ref`` the reference's data x values.
    Returns the crossings of the two fitted curves (searched from a tenth of the smallest to a thousand
    times the largest model of either family; ``within_data`` when both fits interpolate there), which
    family is lower between crossings, and for each model of ``family`` the reference x whose fitted loss
    equals the family's fitted loss at the model's x, with paired-bootstrap intervals (from the fits'
    refits, where both have them).
    """
    x_fam = np.array([p["x"] for p in points], dtype=float)
    lo = 0.1 * min(x_fam.min(), np.min(x_ref))
    hi = 1000.0 * max(x_fam.max(), np.max(x_ref))
    both_lo, both_hi = max(x_fam.min(), np.min(x_ref)), min(x_fam.max(), np.max(x_ref))
    cross = crossings_theta(fit_fam.theta, fit_ref.theta, lo, hi)
    edges = [lo, *cross, hi]
    segments = []
    for left, right in itertools.pairwise(edges):
        mid = np.sqrt(left * right)
        lower = family if fit_fam.predict(N=mid).value < fit_ref.predict(N=mid).value else reference
        segments.append({"from": float(left), "to": float(right), "lower": lower})
    out: dict[str, Any] = {
        "axis": axis,
        "reference": reference,
        "family": family,
        "search_range": [float(lo), float(hi)],
        "reference_x_max": float(np.max(x_ref)),
        "reference_E": float(fit_ref.params["E"]),
        "crossings": [{"x": x, "within_data": bool(both_lo <= x <= both_hi)} for x in cross],
        "lower_family_by_range": segments,
    }
    e_interval = fit_ref.param_intervals().get("E")
    if e_interval is not None:
        out["reference_E_interval"] = e_interval
        out["level"] = fit_ref.level
    pairs = _paired(fit_fam, fit_ref)
    if pairs is not None:
        th_fam, th_ref = pairs
        first = np.array(
            [
                (c[0] if (c := crossings_theta(tf, tr, lo, hi, n_grid=128)) else np.nan)
                for tf, tr in zip(th_fam, th_ref)
            ]
        )
        found = np.isfinite(first)
        out["bootstrap_crossing"] = {
            "n_pairs": int(first.size),
            "fraction_with_crossing": float(found.mean()),
            "first_crossing_interval": _interval(first[found], level) if found.sum() >= 2 else None,
        }
    matches = []
    for p in points:
        fam_loss = float(fit_fam.predict(N=p["x"]).value)
        ref_x = matched_x(fit_ref.theta, fam_loss)
        entry = {
            "size": p["size"],
            "x": float(p["x"]),
            "loss": float(p["loss"]),
            "fitted_loss": fam_loss,
            "reference_x": ref_x,
            "ratio": ref_x / float(p["x"]),
            "beyond_reference_data": bool(ref_x > EXTRAPOLATE * float(np.max(x_ref))),
            "reference_loss_at_x": float(fit_ref.predict(N=p["x"]).value),
        }
        if pairs is not None:
            th_fam, th_ref = pairs
            boot_loss = np.exp(_curve_log(th_fam, np.array([np.log(p["x"])]))[:, 0])
            boot_x = matched_x(th_ref, boot_loss)
            finite = np.isfinite(boot_x)
            entry["reference_x_interval"] = _interval(np.asarray(boot_x), level)
            entry["fraction_unreachable"] = float(1 - finite.mean())
        matches.append(entry)
    out["matches"] = matches
    out["gaps"] = fitted_gaps(fit_ref, fit_fam, points, pairs, level)
    return out


def fitted_gaps(
    fit_ref: Fit,
    fit_fam: Fit,
    points: list[dict[str, Any]],
    pairs: tuple[np.ndarray, np.ndarray] | None,
    level: float,
) -> dict[str, Any]:
    """The family's fitted loss minus the reference's at each of the family's x, and how that gap changes
    from the smallest to the largest x: Spectra's "does the gap shrink with size". Intervals come from the
    paired resamples (``pairs`` = the family's and the reference's thetas, resample by resample)."""
    xs = np.array(sorted({float(p["x"]) for p in points}))
    log_x = np.log(xs)
    gap = np.exp(_curve_log(fit_fam.theta[None], log_x)[0]) - np.exp(
        _curve_log(fit_ref.theta[None], log_x)[0]
    )
    out: dict[str, Any] = {
        "x": xs.tolist(),
        "gap": gap.tolist(),
        "change": float(gap[-1] - gap[0]),
    }
    if pairs is not None and xs.size >= 2:
        th_fam, th_ref = pairs
        boot = np.exp(_curve_log(th_fam, log_x)) - np.exp(_curve_log(th_ref, log_x))
        change = boot[:, -1] - boot[:, 0]
        out["gap_interval"] = [_interval(boot[:, k], level) for k in range(xs.size)]
        out["change_interval"] = _interval(change, level)
        out["fraction_shrinking"] = float(np.mean(np.abs(boot[:, -1]) < np.abs(boot[:, 0])))
        out["n_pairs"] = int(change.size)
    return out


def compare_observed(
    reference: str, family: str, ref_points: list[dict[str, Any]], fam_points: list[dict[str, Any]]
) -> dict[str, Any]:
    """Final losses of two families at the sizes both have, without any fit.

    Points are ``{"size", "params", "bits", "loss"}``; with several runs of one size the lowest loss is
    used. Needs no minimum number of sizes, so it is what a tiny suite gets.
    """

    def best(points: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for p in points:
            if p["size"] not in out or p["loss"] < out[p["size"]]["loss"]:
                out[p["size"]] = p
        return out

    ref, fam = best(ref_points), best(fam_points)
    rows = []
    for size in sorted(set(ref) & set(fam), key=lambda s: ref[s]["params"]):
        r, f = ref[size], fam[size]
        rows.append(
            {
                "size": size,
                "params": f["params"],
                "reference_loss": r["loss"],
                "loss": f["loss"],
                "difference": f["loss"] - r["loss"],
                "reference_bits": r["bits"],
                "bits": f["bits"],
            }
        )
    return {"axis": "observed", "reference": reference, "family": family, "shared_sizes": rows}
