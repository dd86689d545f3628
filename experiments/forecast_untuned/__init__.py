"""Curve forecasts tested where nothing was tuned (``docs/results/forecast-untuned/``): the runs of
``configs/suites/forecast-long.yaml`` (4x the cooldown suite's budget) and ``forecast-large.yaml`` (a size
above its largest), their curves as tables, and every run's final loss forecast from 25 % and 50 % of it
with trilm's defaults."""
