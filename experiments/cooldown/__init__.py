"""The cooldown experiment (``docs/results/cooldown/``): does L(N, D) fitted on cooldown branches predict runs
it has not seen? Its driver (``run``: ``python -m experiments.cooldown run|report``), the held-out fits and
comparisons (``heldout``), why the additive law misses (``diagnosis``), every law of
:mod:`trilm.scaling.laws` on the same split (``laws``: ``python -m experiments.cooldown.laws``), every
run's end forecast from its first checkpoints (``forecasts``: ``python -m experiments.cooldown.forecasts``)
and ``commands.sh``, every command behind the evidence."""
