"""Alias of :mod:`experiments.ladder.adopt` for one release: ``python -m benchmarks.scaling.ladder.adopt``
runs ``python -m experiments.ladder.adopt`` with the same arguments."""

import sys

from experiments.ladder.adopt import main

if __name__ == "__main__":
    sys.argv[0] = "python -m experiments.ladder.adopt"
    raise SystemExit(main())
