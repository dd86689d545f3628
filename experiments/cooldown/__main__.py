"""``python -m experiments.cooldown``: the experiment's driver, :mod:`experiments.cooldown.run`, with the same
arguments (``run`` trains, ``report`` writes docs/results/cooldown/). Its usage line names this command rather
than ``__main__.py``."""

import sys

from experiments.cooldown.run import main

if __name__ == "__main__":
    sys.argv[0] = "python -m experiments.cooldown"
    main()
