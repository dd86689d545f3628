"""Alias of :mod:`experiments.ladder.pilots` for one release: ``python -m benchmarks.scaling.ladder.pilots``
runs ``python -m experiments.ladder.pilots`` with the same arguments."""

import sys

from experiments.ladder.pilots import main

if __name__ == "__main__":
    sys.argv[0] = "python -m experiments.ladder.pilots"
    raise SystemExit(main())
