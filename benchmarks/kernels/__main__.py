"""``python -m benchmarks.kernels``: the area's main benchmark, :mod:`benchmarks.kernels.gpu`,
with the same arguments (the short command the docs quote). Its usage line names
this command rather than ``__main__.py``; its result records the module's own name, which reruns it too."""

import sys

from benchmarks.kernels.gpu import main

if __name__ == "__main__":
    sys.argv[0] = "python -m benchmarks.kernels"
    raise SystemExit(main())
