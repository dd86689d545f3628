"""``python -m benchmarks.train``: the area's main benchmark, :mod:`benchmarks.train.speed`, with the same
arguments (the command the docs quoted before the areas were packages)."""

from benchmarks.train.speed import main

if __name__ == "__main__":
    raise SystemExit(main())
