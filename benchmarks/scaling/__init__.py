"""Scaling-law benchmarks and experiments: the fitter, the ladder, the cooldown laws (README.md)."""
