"""Alias of :mod:`experiments.ternarize.driver` for one release: ``python -m benchmarks.train.ternarize`` runs
``python -m experiments.ternarize`` with the same arguments."""

import sys

from experiments.ternarize.driver import main

if __name__ == "__main__":
    sys.argv[0] = "python -m experiments.ternarize"
    raise SystemExit(main())
