"""``python -m benchmarks.data``: the area's main benchmark, :mod:`benchmarks.data.prepare`, with the same
arguments (the command the docs quoted before the areas were packages)."""

from benchmarks.data.prepare import main

if __name__ == "__main__":
    raise SystemExit(main())
