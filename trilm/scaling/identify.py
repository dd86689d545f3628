"""Whether a fitted law is *identified*: whether the data pin down a curve that falls with its variable.

A fit always returns numbers. Through three losses that rise with size, ``E + A/N^α`` still converges,
to a negative α; through exactly three sizes it passes through every point and a bootstrap over sizes
can only redraw the same three, so its interval has zero width. Printing such a fit as a law tells a
story the data do not. A law counts as identified only when all of these hold:

- its exponents are positive (above :data:`MIN_EXPONENT`): the loss falls with N (or D); and at most
  :data:`MAX_EXPONENT` (the top of Hoffmann's grid of starts): a larger one is a step, all of the decrease
  before the second point and none after, not a power law;
- the loss reaches a new low at no fewer than :data:`MIN_NEW_LOWS` distinct values of the variable (a size
  counts when its loss is below that of every smaller size): a decrease seen once is a difference, not a
  trend;
- there are more distinct values than the law has parameters (three points fix ``E + A/N^α`` exactly,
  so nothing tests it);
- the irreducible loss E is pinned: a fit whose E collapses towards 0 (below :data:`MIN_E_FRACTION` of the
  lowest loss) is a bare power law through the points, with E not identified;
- E lies below the lowest loss, and with a bootstrap its interval does too: a floor the lowest point already
  reaches (within the interval) is that point, not a limit the data show. Such a law puts every lower loss of
  another family "below anything it reaches" and says the largest model has nothing left to gain, both
  artefacts of a decrease that flattened at the last sizes (the quickstart's FloatLM of 2026-12-02:
  E = 4.197, interval [4.191, 4.201], against 4.1996 at its largest size);
- its parameters lie inside the search box, not at its edge (:data:`BOX`, Hoffmann's grid of starts): an
  exponent within :data:`EDGE` of its top, a log-coefficient within :data:`EDGE` of :data:`MAX_LOG_COEF`,
  or a term too small to matter at any point, is a number the optimizer ran to, not one the data chose;
- for L(N, D): at least 3 distinct values of each variable (the fit refuses fewer) and more points than
  its 5 parameters;
- with a bootstrap: the interval of every exponent is finite, lies above zero and has width — unless the
  law passes exactly through more points than it has parameters (data made from a law), where every
  resample rightly finds the same curve.

What is not identified is reported as such, with the reasons and the loss by size that show them; it is
not drawn, not printed as a law, and not used to match sizes between families.
"""

from __future__ import annotations

import numpy as np

from trilm.scaling.fit import get_form
from trilm.scaling.results import Identification, LawFit

MIN_EXPONENT = 1e-3
MAX_EXPONENT = 2.0
MIN_E_FRACTION = 0.01
EXACT = 1e-7
"""Largest |log residual| of a fit that passes exactly through its points."""
MIN_NEW_LOWS = 3
MAX_LOG_COEF = 25.0
BOX = {"exponent": (MIN_EXPONENT, MAX_EXPONENT), "log_coefficient": (0.0, MAX_LOG_COEF)}
"""The search box of a plausible fit: Hoffmann's grid of starts (exponents 0…2, log-coefficients 0…25)."""
TINY_TERM = 1e-3
"""A power-law term smaller than this fraction of the loss at every point is not seen by the data."""
EDGE = 0.02
"""How close to a bound of :data:`BOX` (relative to the box's width) counts as at its edge."""
SYMBOLS = {"alpha": "α", "beta": "β"}


def exponent_interval_reason(
    label: str, lo: float, hi: float, value: float, exact: bool, pct: int
) -> str | None:
    """Why an exponent's bootstrap interval makes a fit implausible (not finite, zero width on data the
    law does not fit exactly, or reaching 0: the term may be absent), or None."""
    cell = f"{label} interval [{lo:.3g}, {hi:.3g}]"
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return f"{cell} not finite"
    if hi - lo <= 1e-9 * max(1.0, abs(value)) and not exact:
        return f"zero-width {cell} (every usable resample is the same data)"
    if lo <= MIN_EXPONENT:
        return f"{pct}% {cell} reaches 0"
    return None


def new_lows(x: np.ndarray, loss: np.ndarray) -> int:
    """How many distinct x have a (lowest) loss below that at every smaller x; the smallest counts."""
    best: dict[float, float] = {}
    for xi, li in zip(np.asarray(x, float), np.asarray(loss, float)):
        best[xi] = min(li, best.get(xi, np.inf))
    count, low = 0, np.inf
    for xi in sorted(best):
        if best[xi] < low:
            count, low = count + 1, best[xi]
    return count


def identify(law: LawFit, unit: str = "sizes", variable: str | None = None) -> Identification:
    """Check ``law`` against the rules in the module docstring. ``unit`` names its points in the reasons
    (``sizes`` along N, ``checkpoints`` along D), ``variable`` its first variable (default: the form's)."""
    form = get_form(law.fit.form)
    params = law.fit.params
    names = dict(zip(form.variables, form.variables))
    if variable is not None:
        names[form.variables[0]] = variable
    reasons = []
    for name in form.exp_names:
        symbol, var = SYMBOLS[name], names[form.variables[form.exp_names.index(name)]]
        if params[name] <= MIN_EXPONENT:
            reasons.append(f"{symbol} = {params[name]:.3g} ≤ 0 (the loss does not fall with {var})")
        elif params[name] > MAX_EXPONENT:
            reasons.append(
                f"{symbol} = {params[name]:.3g} > {MAX_EXPONENT:g} (nearly all of the decrease is between the"
                " first two points: the exponent is not pinned down)"
            )
    if params["E"] < MIN_E_FRACTION * float(np.min(law.loss)):
        reasons.append(f"E = {params['E']:.3g} ≈ 0 (the irreducible loss is not identified)")
    reasons += edge_reasons(form, params, law.inputs, law.loss)
    lowest = int(np.argmin(law.loss))
    low, low_label = float(law.loss[lowest]), law.labels[lowest]
    if params["E"] >= low:
        reasons.append(
            f"E = {params['E']:.4g} is not below the lowest loss, {low:.4f} ({low_label}):"
            " the data show no floor"
        )
    x = law.inputs[form.variables[0]]
    distinct = np.unique(x).size
    if len(form.variables) == 1:
        lows = new_lows(x, law.loss)
        if lows < MIN_NEW_LOWS:
            reasons.append(f"a new low at only {lows} of {distinct} {unit}")
        if distinct <= form.n_params:
            reasons.append(
                f"{distinct} {unit} for {form.n_params} parameters"
                + (" (an exact fit: nothing tests it, no interval)" if distinct == form.n_params else "")
            )
    else:
        if law.loss.size <= form.n_params:
            reasons.append(f"{law.loss.size} points for {form.n_params} parameters")
    boot = law.bootstrap
    exact = distinct > form.n_params and float(np.max(np.abs(law.fit.log_residuals))) < EXACT
    if boot is not None:
        summary = boot.summary()
        for name in form.exp_names:
            lo, hi = summary[name]["lo"], summary[name]["hi"]
            why = exponent_interval_reason(SYMBOLS[name], lo, hi, params[name], exact, int(boot.level * 100))
            if why:
                reasons.append(why)
        e_lo, e_hi = summary["E"]["lo"], summary["E"]["hi"]
        if params["E"] < low <= e_hi and not exact:
            reasons.append(
                f"the {int(boot.level * 100)}% E interval [{e_lo:.4g}, {e_hi:.4g}] reaches the lowest loss,"
                f" {low:.4f} ({low_label}): the data do not show the loss levelling off below that point,"
                " so E is that point's loss, not a floor"
            )
    return Identification(not reasons, tuple(dict.fromkeys(reasons)))


def edge_reasons(
    form, params: dict[str, float], inputs: dict[str, np.ndarray], loss: np.ndarray
) -> list[str]:
    """Why a fit's parameters sit at the edge of :data:`BOX` (empty when inside): an exponent pinned at the
    top, a log-coefficient at the top, or a term that is nothing at every point (below :data:`TINY_TERM` of
    the loss), whose coefficient and exponent the data cannot see. Exponents beyond the box are reported by
    :func:`identify` itself."""
    out = []
    lo, hi = BOX["exponent"]
    for name in form.exp_names:
        value = params[name]
        if lo < value <= hi and hi - value < EDGE * (hi - lo):
            out.append(f"{SYMBOLS[name]} = {value:.3g} is pinned at the top of the search box ({hi:g})")
    clo, chi = BOX["log_coefficient"]
    top = chi - EDGE * (chi - clo)
    floor = TINY_TERM * float(np.min(loss))
    for coef, exp, var in zip(form.coef_names, form.exp_names, form.variables):
        value = params[coef]
        log = float(np.log(value)) if value > 0 and np.isfinite(value) else float("inf")
        if log > top:
            out.append(
                f"{coef} = {value:.3g} is at the edge of the search box (ln {coef} = {log:.3g} > {top:.3g})"
            )
            continue
        with np.errstate(over="ignore"):
            term = value / np.asarray(inputs[var], dtype=float) ** params[exp]
        if params[exp] > MIN_EXPONENT and float(np.max(term)) < floor:
            out.append(
                f"the {coef}/{var}^{SYMBOLS[exp]} term is below {TINY_TERM:.0e} of the loss at every point"
                f" ({coef} = {value:.3g}): {coef} and {SYMBOLS[exp]} are at the edge of the search box"
            )
    return out


def implausible_family(fits: dict[str, LawFit], sizes: dict[str, float], tol: float = 0.0) -> dict[str, str]:
    """Runs of one family whose L(D) fits are not physical together: E along a run is the loss that run's
    model would reach with unlimited data, so it cannot rise with model size. Every run of a pair where it
    does is named, with the pair (``{run: reason}``); ``sizes`` gives each run's N."""
    ordered = sorted((sizes[r], r) for r in fits)
    out: dict[str, str] = {}
    for i, (n_a, a) in enumerate(ordered):
        for n_b, b in ordered[i + 1 :]:
            e_a, e_b = fits[a].fit.params["E"], fits[b].fit.params["E"]
            if n_b > n_a and e_b > e_a + tol:
                why = (
                    f"E rises with N in the family ({a}: E = {e_a:.4g} → the larger {b}: E = {e_b:.4g}; a"
                    " larger model cannot have a higher loss at unlimited data)"
                )
                out.setdefault(a, why)
                out.setdefault(b, why)
    return out


def loss_by_point(law: LawFit) -> str:
    """``nano 4.894, mini 5.095, tiny 5.085``: the losses that show why (lowest per label, by x)."""
    first = get_form(law.fit.form).variables[0]
    order = np.argsort(law.inputs[first], kind="stable")
    seen: dict[str, float] = {}
    for i in order:
        label = law.labels[i]
        seen[label] = min(float(law.loss[i]), seen.get(label, np.inf))
    return ", ".join(f"{label} {loss:.4f}" for label, loss in seen.items())
