"""SmolLM2-135M-Instruct made ternary by continued training (``docs/results/ternarize-real/``): the driver
and its report (``run``). Its model, data and evaluation are those of :mod:`experiments.posthoc_real`, whose
helpers it imports, so that its float row is that experiment's float row."""
