"""``python -m experiments.ternarize``: the experiment's driver, :mod:`experiments.ternarize.run`, with the
same arguments; ``crossover`` first runs the crossover grid instead (:mod:`experiments.ternarize.crossover`).
Its usage line names this command rather than ``__main__.py``."""

import sys

from experiments.ternarize import crossover, run

if __name__ == "__main__":
    sys.argv[0] = "python -m experiments.ternarize"
    if sys.argv[1:2] == ["crossover"]:
        raise SystemExit(crossover.main(sys.argv[2:]))
    raise SystemExit(run.main())
