"""Exports of trilm snapshots to other ecosystems (Hugging Face now; packed and GGUF build on the codec)."""
