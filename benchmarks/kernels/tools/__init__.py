"""Offline tools, never imported at run time: ahead-of-time compilation of every config for a GPU target
without a GPU (:mod:`.compile_check`, a sweep of :mod:`trilm.kernels.aot`), the launch-plan table
(:mod:`.launch_table`, of :mod:`trilm.kernels.launch_plans`), SASS instruction counts per weight
(:mod:`.instructions`, over :mod:`._sass`) and the storage bits per weight of every format
(:mod:`.bits_table`). Random packed weights of every format, which they compile and the benchmarks time, are
:mod:`trilm.formats.samples`."""
