"""The CPU ladder's analysis: sweeps, pilots, the report and the finals it adopts (docs/results/ladder/)."""
