"""Post-hoc compression evidence: quantization, binarization, pruning, and a real Llama (README.md)."""
