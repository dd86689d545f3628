"""Alias of :mod:`experiments.ladder.sweeps` for one release: ``python -m benchmarks.scaling.ladder.sweeps``
runs ``python -m experiments.ladder.sweeps`` with the same arguments."""

import sys

from experiments.ladder.sweeps import main

if __name__ == "__main__":
    sys.argv[0] = "python -m experiments.ladder.sweeps"
    raise SystemExit(main())
