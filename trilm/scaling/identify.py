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
SYMBOLS = {"alpha": "α", "beta": "β"}


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
    boot = law.bootstrap
    exact = distinct > form.n_params and float(np.max(np.abs(law.fit.log_residuals))) < EXACT
    if boot is not None:
        summary = boot.summary()
        for name in form.exp_names:
            lo, hi = summary[name]["lo"], summary[name]["hi"]
            cell = f"{SYMBOLS[name]} interval [{lo:.3g}, {hi:.3g}]"
            if not (np.isfinite(lo) and np.isfinite(hi)):
                reasons.append(f"{cell} not finite")
            elif hi - lo <= 1e-9 * max(1.0, abs(params[name])) and not exact:
                reasons.append(f"zero-width {cell} (every usable resample is the same data)")
            elif lo <= MIN_EXPONENT:
                reasons.append(f"{int(boot.level * 100)}% {cell} reaches 0")
    return Identification(not reasons, tuple(dict.fromkeys(reasons)))


def loss_by_point(law: LawFit) -> str:
    """``nano 4.894, mini 5.095, tiny 5.085``: the losses that show why (lowest per label, by x)."""
    first = get_form(law.fit.form).variables[0]
    order = np.argsort(law.inputs[first], kind="stable")
    seen: dict[str, float] = {}
    for i in order:
        label = law.labels[i]
        seen[label] = min(float(law.loss[i]), seen.get(label, np.inf))
    return ", ".join(f"{label} {loss:.4f}" for label, loss in seen.items())
