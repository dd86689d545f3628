"""The experiments behind ``docs/results/``: one package per evidence folder, holding its driver
(``python -m experiments.NAME``), its report writer and its ``commands.sh`` (README.md). Checkout-only: the
wheel ships ``trilm`` alone, and no library module or test imports an experiment."""
