"""Alias of :mod:`experiments.ladder.finals` for one release: ``python -m benchmarks.scaling.ladder.finals``
runs ``python -m experiments.ladder.finals`` with the same arguments."""

import sys

from experiments.ladder.finals import main

if __name__ == "__main__":
    sys.argv[0] = "python -m experiments.ladder.finals"
    raise SystemExit(main())
