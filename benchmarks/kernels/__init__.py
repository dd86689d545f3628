"""Kernel benchmarks and offline kernel tools: GPU and CPU low-bit kernels (README.md)."""
