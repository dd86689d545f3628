"""Alias of :mod:`experiments.cooldown.laws` for one release: ``python -m benchmarks.scaling.laws`` runs
``python -m experiments.cooldown.laws`` with the same arguments."""

import sys

from experiments.cooldown.laws import main

if __name__ == "__main__":
    sys.argv[0] = "python -m experiments.cooldown.laws"
    main()
