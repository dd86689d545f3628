"""The CPU ladder (``docs/results/ladder/``): its report (``report``, the driver), the pilots and rate sweeps
that chose its recipe (``pilots``, ``sweeps``), the best rate of each (family, size) (``adopt``), and the
build step that turns its finals into package data (``finals``, run by ``make reference-data``)."""
