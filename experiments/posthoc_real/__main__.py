"""``python -m experiments.posthoc_real``: the experiment's driver, :mod:`experiments.posthoc_real.run`, with
the same arguments. Its usage line names this command rather than ``__main__.py``."""

import sys

from experiments.posthoc_real.run import main

if __name__ == "__main__":
    sys.argv[0] = "python -m experiments.posthoc_real"
    raise SystemExit(main())
