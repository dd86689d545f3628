"""Alias of :mod:`experiments.cooldown.run` for one release: ``python -m benchmarks.scaling.cooldown`` runs
``python -m experiments.cooldown`` with the same arguments."""

import sys

from experiments.cooldown.run import main

if __name__ == "__main__":
    sys.argv[0] = "python -m experiments.cooldown"
    main()
