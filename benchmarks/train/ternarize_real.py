"""Alias of :mod:`experiments.ternarize_real.run` for one release:
``python -m benchmarks.train.ternarize_real`` runs ``python -m experiments.ternarize_real`` with the same
arguments."""

import sys

from experiments.ternarize_real.run import main

if __name__ == "__main__":
    sys.argv[0] = "python -m experiments.ternarize_real"
    raise SystemExit(main())
