"""``python -m benchmarks.posthoc``: the area's main benchmark, :mod:`benchmarks.posthoc.quantize`,
with the same arguments (the command the docs quoted before the areas were packages)."""

from benchmarks.posthoc.quantize import main

if __name__ == "__main__":
    raise SystemExit(main())
