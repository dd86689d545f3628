"""Scaling-law tools: fit L(N), L(D), L(N, D) over results tables, bootstrap them, compare families, plot.

Every law is one class of :data:`trilm.scaling.laws.LAWS`, fitted by :func:`trilm.scaling.fitter.fit` into a
:class:`trilm.scaling.fitter.Fit`. Pure numpy/matplotlib (no torch). The one-call entry point is
:func:`analyse`::

    from trilm.scaling import analyse
    report = analyse(["runs/suite/results.csv"], "runs/suite/scaling", form="auto", bootstrap=1000, seed=0)

and the command line is ``trilm scaling fit RESULTS… --out DIR`` (see :mod:`trilm.scaling.cli`).
"""

from trilm.scaling.analyse import LAW_OF_FORM, analyse, leave_one_out
from trilm.scaling.errors import FitError
from trilm.scaling.fitter import HUBER_DELTA, Fit, Prediction
from trilm.scaling.laws import LAWS, get_law
from trilm.scaling.report_types import AnalysisConfig, FittedPoints, Report
from trilm.scaling.table import (
    TERNARY_BITS,
    ResultRow,
    TableError,
    append_rows,
    default_linear_bits,
    model_bits,
    quantized_linear_bits,
    read_table,
    write_table,
)

analyze = analyse
"""The American spelling of :func:`analyse`, kept for callers written against it (as ``trilm suite analyze``
stays beside ``trilm suite analyse``)."""

__all__ = [
    "HUBER_DELTA",
    "LAWS",
    "LAW_OF_FORM",
    "TERNARY_BITS",
    "AnalysisConfig",
    "Fit",
    "FitError",
    "FittedPoints",
    "Prediction",
    "Report",
    "ResultRow",
    "TableError",
    "analyse",
    "analyze",
    "append_rows",
    "default_linear_bits",
    "get_law",
    "leave_one_out",
    "model_bits",
    "quantized_linear_bits",
    "read_table",
    "write_table",
]
