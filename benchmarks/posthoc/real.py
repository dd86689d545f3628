"""Alias of :mod:`experiments.posthoc_real.run` for one release: ``python -m benchmarks.posthoc.real`` runs
``python -m experiments.posthoc_real`` with the same arguments."""

import sys

from experiments.posthoc_real.run import main

if __name__ == "__main__":
    sys.argv[0] = "python -m experiments.posthoc_real"
    raise SystemExit(main())
