"""Training benchmarks and experiments: step speed, multi-node drills, parity, ternarization (README.md)."""
