"""``python -m experiments.ternarize``: the experiment's driver, :mod:`experiments.ternarize.driver` (the
split experiment, or with ``crossover`` first the crossover grid). Its usage line names this command rather
than ``__main__.py``."""

import sys

from experiments.ternarize.driver import main

if __name__ == "__main__":
    sys.argv[0] = "python -m experiments.ternarize"
    raise SystemExit(main())
