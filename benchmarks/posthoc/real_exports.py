"""Alias of :mod:`experiments.posthoc_real.exports` for one release:
``python -m benchmarks.posthoc.real_exports`` runs ``python -m experiments.posthoc_real.exports`` with the
same arguments."""

import sys

from experiments.posthoc_real.exports import main

if __name__ == "__main__":
    sys.argv[0] = "python -m experiments.posthoc_real.exports"
    raise SystemExit(main())
