"""Serving benchmarks: latency and throughput of the engine, under load, on CPU and GPU (README.md)."""
