"""``python -m benchmarks.serve``: the area's main benchmark, :mod:`benchmarks.serve.speed`, with the same
arguments (the command the docs quoted before the areas were packages)."""

from benchmarks.serve.speed import main

if __name__ == "__main__":
    raise SystemExit(main())
