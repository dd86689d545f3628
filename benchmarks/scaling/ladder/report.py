"""Alias of :mod:`experiments.ladder.report` for one release: ``python -m benchmarks.scaling.ladder.report``
runs ``python -m experiments.ladder`` with the same arguments."""

import sys

from experiments.ladder.report import main

if __name__ == "__main__":
    sys.argv[0] = "python -m experiments.ladder"
    raise SystemExit(main())
