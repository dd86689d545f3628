"""Aliases of the CPU ladder's commands (:mod:`experiments.ladder`) for one release."""
