"""Data-path benchmarks: tokenization, snapshot integrity at load, export (README.md)."""
