"""Evaluation: perplexity with rolling windows, trilm's lm-eval model and offline tasks, and the suite
evaluation that writes the results table the scaling tools read (``trilm eval``; docs/evaluation.md)."""
