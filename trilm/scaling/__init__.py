"""Scaling-law tools: fit L(N), L(D), L(N, D) over results tables, bootstrap them, compare families, plot.

Pure numpy/matplotlib (no torch). The one-call entry point is :func:`analyse`::

    from trilm.scaling import analyse
    report = analyse(["runs/suite/results.csv"], "runs/suite/scaling", form="auto", bootstrap=1000, seed=0)

and the command line is ``trilm scaling fit RESULTS… --out DIR`` (see :mod:`trilm.scaling.cli`).
"""

from trilm.scaling.analyse import analyse
from trilm.scaling.bootstrap import BootstrapResult, bootstrap_fit, leave_one_out
from trilm.scaling.fit import FORMS, HUBER_DELTA, FitError, FitResult, fit_law
from trilm.scaling.results import AnalysisConfig, Report
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
    "FORMS",
    "HUBER_DELTA",
    "TERNARY_BITS",
    "AnalysisConfig",
    "BootstrapResult",
    "FitError",
    "FitResult",
    "Report",
    "ResultRow",
    "TableError",
    "analyse",
    "analyze",
    "append_rows",
    "bootstrap_fit",
    "default_linear_bits",
    "fit_law",
    "leave_one_out",
    "model_bits",
    "quantized_linear_bits",
    "read_table",
    "write_table",
]
