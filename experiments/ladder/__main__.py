"""``python -m experiments.ladder``: the experiment's driver, the report (:mod:`experiments.ladder.report`),
with the same arguments. Its usage line names this command rather than ``__main__.py``."""

import sys

from experiments.ladder.report import main

if __name__ == "__main__":
    sys.argv[0] = "python -m experiments.ladder"
    raise SystemExit(main())
