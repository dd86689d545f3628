"""The one law registry: what a scaling law is to the fitter, and the rules that say whether a fit is a law.

A law is a class that knows its parameters (a vector ``θ`` in the space it is fitted in, and their natural
names and values), the grid of starts the fitter runs from, a box outside which a fitted value is a number
the optimizer ran to rather than one the data chose, ``log L̂`` and its Jacobian in ``θ``, and its
plausibility rules. Everything else — the Huber-in-log objective, the batched L-BFGS, the bootstrap, the
:class:`trilm.scaling.fitter.Fit` result — is shared, so adding a law is one class and its recovery test
(docs/CONTRIBUTING.md, "Adding a law").

Two kinds of data reach a law: points of a results table (:class:`SizeLaw`: inputs such as N, D and bits
per weight) and loss curves under a learning-rate schedule (:class:`trilm.scaling.laws.curve.CurveLaw`).
Each law turns its data into a *design* once (:meth:`Law.design`), which the objective then evaluates for
thousands of parameter vectors at a time.
"""

from __future__ import annotations

import abc
import itertools
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, TypeVar

import numpy as np

from trilm.scaling.errors import FitError

MIN_EXPONENT = 1e-3
"""An exponent at or below this is no decrease: the term is not identified."""
MAX_EXPONENT = 2.0
"""An exponent above this (the top of Hoffmann's grid) is a step between two points, not a power law."""
MIN_FLOOR_FRACTION = 0.01
"""An irreducible loss below this fraction of the lowest loss has collapsed: the floor is not identified."""
EDGE = 0.02
"""How close to a bound of a law's box (relative to the box's width) counts as at its edge."""
TINY_TERM = 1e-3
"""A term smaller than this fraction of the loss at every point is not seen by the data."""
MIN_NEW_LOWS = 3
"""A one-input law needs the loss to reach a new low at this many distinct values: a decrease seen once is a
difference, not a trend."""
POINT_NAMES = {"N": "sizes", "D": "values of D", "P": "precisions"}
"""What the distinct values of each input are called in a reason."""


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


def product_grid(*axes: Sequence[float]) -> np.ndarray:
    """Every combination of the given axis values, one start per row."""
    return np.array(list(itertools.product(*axes)), dtype=float)


def lse_jac(terms: np.ndarray, dterms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``log Σ_j exp(u_j)`` and its Jacobian for terms ``u (B, J, n)`` with Jacobians ``du (B, J, P, n)``.

    Sums of positive terms (power laws plus a floor) are written this way so that no coefficient needs a
    bound and nothing overflows where a power would.
    """
    top = terms.max(axis=1, keepdims=True)
    weights = np.exp(terms - top)
    total = weights.sum(axis=1, keepdims=True)
    value = (top + np.log(total))[:, 0]
    share = weights / total
    return value, np.einsum("bjn,bjpn->bpn", share, dterms)


class Law(abc.ABC):
    """One scaling law. Subclasses set the class attributes and implement the abstract methods.

    ``theta_names``: the fitted parameters (log-coefficients are fitted as logs so they stay positive).
    ``exponents`` and ``floor``: natural names the common plausibility rules check. ``box``: per θ, the
    range a plausible fit lies inside. ``restart_grid``: bootstrap refits also restart from the screened
    :meth:`coarse_grid` (laws with saddles between regimes), not only from the full-data fit.
    """

    name: ClassVar[str]
    formula: ClassVar[str]
    kind: ClassVar[str]
    theta_names: ClassVar[tuple[str, ...]]
    exponents: ClassVar[tuple[str, ...]] = ()
    floor: ClassVar[str | None] = None
    box: ClassVar[tuple[tuple[float, float], ...]] = ()
    restart_grid: ClassVar[bool] = False

    @property
    def n_params(self) -> int:
        return len(self.theta_names)

    @abc.abstractmethod
    def natural(self, theta: np.ndarray) -> dict[str, float]:
        """Natural parameters (``{"E": …, "A": …, "alpha": …}``) of one θ."""

    @abc.abstractmethod
    def theta(self, params: Mapping[str, float]) -> np.ndarray:
        """The θ of natural parameters: the inverse of :meth:`natural`."""

    @abc.abstractmethod
    def grid(self) -> np.ndarray:
        """The starts of a full fit, ``(S, P)``."""

    def coarse_grid(self) -> np.ndarray:
        """A few starts for refits and quick fits; by default every other start of :meth:`grid`."""
        return self.grid()[::2]

    @abc.abstractmethod
    def design(self, data: Any) -> Any:
        """Check ``data`` and turn it into what :meth:`log_predict_jac` evaluates.

        Raises :class:`FitError` naming what is wrong."""

    @abc.abstractmethod
    def observed(self, data: Any) -> np.ndarray:
        """The measured losses of ``data``, one per point of its design."""

    @abc.abstractmethod
    def log_predict_jac(self, theta: np.ndarray, design: Any) -> tuple[np.ndarray, np.ndarray]:
        """``log L̂ (B, n)`` and ``∂ log L̂ / ∂θ (B, P, n)`` for ``theta (B, P)``."""

    def log_predict(self, theta: np.ndarray, design: Any) -> np.ndarray:
        return self.log_predict_jac(np.atleast_2d(theta), design)[0]

    def units(self, data: Any) -> list[Any]:
        """The label of each point's resampling unit for the bootstrap (default: each point alone)."""
        return list(range(self.observed(data).size))

    def usable(self, design: Any, weights: np.ndarray) -> np.ndarray:
        """Which bootstrap resamples (rows of point ``weights (R, n)``) can pin the law at all; the others are
        dropped as degenerate rather than refitted to an arbitrary answer (default: all)."""
        return np.ones(weights.shape[0], bool)

    def extra_reasons(self, params: dict[str, float], design: Any, loss: np.ndarray) -> list[str]:
        """Law-specific reasons why a fit is not plausible (e.g. a term the data never see)."""
        return []

    def plausibility(self, theta: np.ndarray, design: Any, loss: np.ndarray) -> list[str]:
        """Why this fit is not a law the data support (empty: it is): exponents in (0, 2], a floor below the
        data but not collapsed to 0, parameters off the edges of the box, and the law's own reasons."""
        params = self.natural(theta)
        reasons = []
        for name in self.exponents:
            if params[name] <= MIN_EXPONENT:
                reasons.append(f"{name} = {params[name]:.3g} ≤ 0 (the loss does not fall with it)")
            elif params[name] > MAX_EXPONENT:
                reasons.append(
                    f"{name} = {params[name]:.3g} > {MAX_EXPONENT:g}"
                    " (the decrease is a step, not a power law)"
                )
            elif params[name] > MAX_EXPONENT - EDGE * (MAX_EXPONENT - MIN_EXPONENT):
                reasons.append(
                    f"{name} = {params[name]:.3g} is pinned at the top of the search box ({MAX_EXPONENT:g})"
                )
        low = float(np.min(loss))
        if self.floor is not None:
            value = params[self.floor]
            if value < MIN_FLOOR_FRACTION * low:
                reasons.append(f"{self.floor} = {value:.3g} ≈ 0 (the irreducible loss is not identified)")
            elif value >= low:
                reasons.append(
                    f"{self.floor} = {value:.4g} is not below the lowest loss, {low:.4f}: no floor"
                )
        for name, value, (lo, hi) in zip(self.theta_names, theta, self.box):
            if name in {f"ln {n}" for n in self.exponents} or name in self.exponents:
                continue
            margin = EDGE * (hi - lo)
            if not lo + margin <= float(value) <= hi - margin:
                reasons.append(
                    f"{name} = {float(value):.3g} is at or outside the edge of its box [{lo:g}, {hi:g}]"
                )
        return list(dict.fromkeys(reasons + self.extra_reasons(params, design, loss)))


LAWS: dict[str, Law] = {}
"""Every law by name: ``trilm scaling fit --law NAME`` reaches each."""

L = TypeVar("L", bound=type[Law])


def register(cls: L) -> L:
    """Class decorator: add one instance of the law to :data:`LAWS` under its ``name``."""
    if cls.name in LAWS:
        raise ValueError(f"a law named {cls.name!r} is registered twice")
    law = cls()
    if len(law.box) != law.n_params:
        raise ValueError(f"law {cls.name!r}: box has {len(law.box)} ranges for {law.n_params} parameters")
    LAWS[cls.name] = law
    return cls


def get_law(name: str) -> Law:
    try:
        return LAWS[name]
    except KeyError:
        raise FitError(f"unknown law {name!r}; choose from {', '.join(LAWS)}") from None


def laws_of_kind(kind: str) -> list[str]:
    return [name for name, law in LAWS.items() if law.kind == kind]


def _positive_finite(name: str, values: np.ndarray, where: str) -> None:
    bad = np.flatnonzero(~np.isfinite(values) | (values <= 0))
    if bad.size:
        i = int(bad[0])
        raise FitError(
            f"{where}{name} must be positive and finite; point {i} has {name}={float(values[i])!r}"
        )


class SizeLaw(Law):
    """A law of the loss over points with named inputs (N, D, bits per weight), e.g. final losses of runs.

    Data are a mapping ``{"N": …, "D": …, "loss": …}`` (arrays of one length; optional ``"unit"``: each
    point's resampling unit, such as its lineage). The design is the log inputs ``(K, n)`` in
    :attr:`inputs` order; :meth:`terms` gives the log of each positive term of the sum and its Jacobian.
    """

    kind = "size"
    inputs: ClassVar[tuple[str, ...]]
    log_inputs: ClassVar[tuple[bool, ...] | None] = None
    min_distinct: ClassVar[int] = 3

    def design(self, data: Any) -> np.ndarray:
        where = f"{self.name}: "
        if not isinstance(data, Mapping):
            raise FitError(f"{where}data must map input names to values, got {type(data).__name__}")
        missing = [k for k in (*self.inputs, "loss") if k not in data]
        if missing:
            raise FitError(
                f"{where}{self.formula} needs the input{'s' if len(missing) > 1 else ''} {', '.join(missing)}"
            )
        loss = np.asarray(data["loss"], float).ravel()
        cols = []
        logs = self.log_inputs or (True,) * len(self.inputs)
        for name, take_log in zip(self.inputs, logs):
            col = np.asarray(data[name], float).ravel()
            if col.shape != loss.shape:
                raise FitError(f"{where}{name} has {col.size} values but loss has {loss.size}")
            _positive_finite(name, col, where)
            cols.append(np.log(col) if take_log else col)
        _positive_finite("loss", loss, where)
        return np.stack(cols) if cols else np.empty((0, loss.size))

    def observed(self, data: Any) -> np.ndarray:
        return np.asarray(data["loss"], float).ravel()

    def units(self, data: Any) -> list[Any]:
        if "unit" in data:
            return list(data["unit"])
        return super().units(data)

    def usable(self, design: np.ndarray, weights: np.ndarray) -> np.ndarray:
        """Resamples that draw at least as many points as the law has parameters and
        :attr:`min_distinct` distinct values of every varying input."""
        drawn = weights > 0
        ok = drawn.sum(axis=1) >= self.n_params
        for j, name in enumerate(self.inputs):
            if name not in self.varying_inputs():
                continue
            values, inverse = np.unique(design[j], return_inverse=True)
            present = np.zeros((weights.shape[0], values.size))
            np.add.at(present.T, inverse, drawn.T.astype(float))
            ok &= (present > 0).sum(axis=1) >= self.min_distinct
        return ok

    def check_fittable(self, data: Any) -> None:
        """Refuse data that cannot pin the law: fewer points than parameters or too few distinct values."""
        loss = self.observed(data)
        if loss.size < self.n_params:
            raise FitError(
                f"{self.name}: {self.formula} has {self.n_params} parameters but only {loss.size} points"
            )
        for name in self.inputs:
            distinct = np.unique(np.asarray(data[name], float)).size
            if distinct < self.min_distinct and name in self.varying_inputs():
                raise FitError(
                    f"{self.name}: {self.formula} needs at least {self.min_distinct} distinct values"
                    f" of {name},"
                    f" got {distinct}"
                )

    def varying_inputs(self) -> tuple[str, ...]:
        """The inputs whose exponents the data must pin (all by default)."""
        return self.inputs

    @abc.abstractmethod
    def terms(self, theta: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Log terms ``u (B, J, n)`` with ``log L̂ = LSE_j u_j`` and their Jacobians ``(B, J, P, n)``."""

    def log_predict_jac(self, theta: np.ndarray, design: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return lse_jac(*self.terms(np.atleast_2d(theta), design))

    def loss(self, params: Mapping[str, float], **inputs: Any) -> np.ndarray:
        """The law's loss at ``inputs`` for natural ``params``: for drawing data from a law."""
        arrays = np.broadcast_arrays(*[np.asarray(inputs[k], float) for k in self.inputs])
        data = {k: a.ravel() for k, a in zip(self.inputs, arrays)}
        data["loss"] = np.ones(arrays[0].size)
        value = np.exp(self.log_predict(self.theta(params), self.design(data))[0])
        return value.reshape(arrays[0].shape)

    def extra_reasons(self, params: dict[str, float], design: np.ndarray, loss: np.ndarray) -> list[str]:
        """A term the data never see; and what the points cannot show: a one-input law whose loss reaches a
        new low at fewer than :data:`MIN_NEW_LOWS` values, or with no more distinct values (more points, for
        several inputs) than parameters, which the law passes through exactly and nothing tests."""
        out = []
        if len(self.inputs) == 1:
            distinct, what = np.unique(design[0]).size, POINT_NAMES.get(self.inputs[0], "values")
            lows = new_lows(design[0], loss)
            if lows < MIN_NEW_LOWS:
                out.append(f"a new low at only {lows} of {distinct} {what}")
            if distinct <= self.n_params:
                exact = " (an exact fit: nothing tests it, no interval)" if distinct == self.n_params else ""
                out.append(f"{distinct} {what} for {self.n_params} parameters{exact}")
        elif loss.size <= self.n_params:
            out.append(f"{loss.size} points for {self.n_params} parameters")
        theta = self.theta(params)[None]
        terms, _ = self.terms(theta, design)
        share = np.exp(terms[0] - self.log_predict(theta, design)[0][None])
        for j in range(terms.shape[1]):
            if float(np.max(share[j])) < TINY_TERM:
                out.append(
                    f"term {j + 1} of {self.formula} is below {TINY_TERM:.0e} of the loss at every point:"
                    " its coefficient and exponent are not seen by the data"
                )
        return out


__all__ = [
    "EDGE",
    "LAWS",
    "MAX_EXPONENT",
    "MIN_EXPONENT",
    "MIN_FLOOR_FRACTION",
    "MIN_NEW_LOWS",
    "TINY_TERM",
    "FitError",
    "Law",
    "SizeLaw",
    "get_law",
    "laws_of_kind",
    "lse_jac",
    "new_lows",
    "product_grid",
    "register",
]
