"""Offline tools, never imported at run time: ahead-of-time compilation for a GPU target without a GPU
(:mod:`.compile_check`), SASS instruction counts (:mod:`._instructions`, :mod:`._sass`), and random packed
weights of every format for tests and benchmarks (:mod:`._samples`)."""
