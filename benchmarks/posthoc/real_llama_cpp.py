"""Alias of :mod:`experiments.posthoc_real.llama_cpp` for one release:
``python -m benchmarks.posthoc.real_llama_cpp`` runs ``python -m experiments.posthoc_real.llama_cpp`` with
the same arguments."""

import sys

from experiments.posthoc_real.llama_cpp import main

if __name__ == "__main__":
    sys.argv[0] = "python -m experiments.posthoc_real.llama_cpp"
    raise SystemExit(main())
