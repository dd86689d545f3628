"""Offline tools, never imported at run time: ahead-of-time compilation for a GPU target without a GPU
(:mod:`.compile_check`) and SASS instruction counts (:mod:`._instructions`, :mod:`._sass`). Random packed
weights of every format, which they compile and the benchmarks time, are :mod:`trilm.formats.samples`."""
