"""The command ``python -m experiments.ternarize``: the split experiment (:mod:`experiments.ternarize.run`),
or with ``crossover`` first the crossover grid (:mod:`experiments.ternarize.crossover`)."""

import sys

from experiments.ternarize import crossover, run


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["crossover"]:
        crossover.main(argv[1:])
    else:
        run.main(argv)
