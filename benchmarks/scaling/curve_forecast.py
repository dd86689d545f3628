"""Alias of :mod:`experiments.cooldown.forecasts` for one release: ``python -m
benchmarks.scaling.curve_forecast`` runs ``python -m experiments.cooldown.forecasts`` with the same
arguments."""

import sys

from experiments.cooldown.forecasts import main

if __name__ == "__main__":
    sys.argv[0] = "python -m experiments.cooldown.forecasts"
    raise SystemExit(main())
