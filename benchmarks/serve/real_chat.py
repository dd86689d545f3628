"""Alias of :mod:`experiments.posthoc_real.serve_chat` for one release:
``python -m benchmarks.serve.real_chat`` runs ``python -m experiments.posthoc_real.serve_chat`` with the
same arguments."""

import sys

from experiments.posthoc_real.serve_chat import main

if __name__ == "__main__":
    sys.argv[0] = "python -m experiments.posthoc_real.serve_chat"
    raise SystemExit(main())
