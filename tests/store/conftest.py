"""The store tests use the export tests' tokenizer and run-shaped snapshot fixtures."""

from tests.export.conftest import make_snapshot, tokenizer

__all__ = ["make_snapshot", "tokenizer"]
