"""``python -m benchmarks.kernels``: the area's main benchmark, :mod:`benchmarks.kernels.gpu`, with the same
arguments (the command the docs quoted before the areas were packages)."""

from benchmarks.kernels.gpu import main

if __name__ == "__main__":
    raise SystemExit(main())
