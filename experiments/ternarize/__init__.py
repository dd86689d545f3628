"""Ternarizing a float model against training a TriLM from scratch, at equal tokens
(``docs/results/ternarize/``): the driver of the split experiment and of the crossover grid (``run``,
``crossover``), and their report (``report``)."""
