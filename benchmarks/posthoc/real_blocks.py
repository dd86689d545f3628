"""Alias of :mod:`experiments.posthoc_real.blocks` for one release:
``python -m benchmarks.posthoc.real_blocks`` runs ``python -m experiments.posthoc_real.blocks`` with the
same arguments."""

import sys

from experiments.posthoc_real.blocks import main

if __name__ == "__main__":
    sys.argv[0] = "python -m experiments.posthoc_real.blocks"
    raise SystemExit(main())
