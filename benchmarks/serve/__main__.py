"""``python -m benchmarks.serve``: the area's main benchmark, :mod:`benchmarks.serve.speed`,
with the same arguments (the short command the docs quote). Its usage line names
this command rather than ``__main__.py``; its result records the module's own name, which reruns it too."""

import sys

from benchmarks.serve.speed import main

if __name__ == "__main__":
    sys.argv[0] = "python -m benchmarks.serve"
    raise SystemExit(main())
