"""Exports of trilm snapshots that real clients load: Hugging Face (with tokenizer files), packed snapshots,
GGUF for llama.cpp, whole suites; and the Hugging Face import (``trilm export`` / ``trilm import``;
docs/export.md)."""
