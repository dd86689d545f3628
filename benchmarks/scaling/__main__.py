"""``python -m benchmarks.scaling``: the area's main benchmark, :mod:`benchmarks.scaling.fitter`,
with the same arguments (the command the docs quoted before the areas were packages)."""

from benchmarks.scaling.fitter import main

if __name__ == "__main__":
    raise SystemExit(main())
