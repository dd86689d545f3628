"""Evaluation of checkpoint suites; writes the results table the scaling tools read."""
