"""Alias of :mod:`experiments.ternarize.report` for one release:
``python -m benchmarks.train.ternarize_report`` runs ``python -m experiments.ternarize.report`` with the same
arguments."""

import sys

from experiments.ternarize.report import main

if __name__ == "__main__":
    sys.argv[0] = "python -m experiments.ternarize.report"
    raise SystemExit(main())
