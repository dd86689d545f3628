"""The Huber δ and the error of every fit, under the module name :mod:`trilm.scaling.curve` and
``benchmarks/scaling/curve_forecast.py`` import them from. The objective, the fitter and its result are
:mod:`trilm.scaling.fitter` (one for every law of :mod:`trilm.scaling.laws`); the error is
:mod:`trilm.scaling.errors`'s."""

from trilm.scaling.errors import FitError
from trilm.scaling.fitter import HUBER_DELTA

__all__ = ["HUBER_DELTA", "FitError"]
