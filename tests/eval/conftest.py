"""The evaluation tests use the export tests' tokenizer and snapshot fixtures."""

from tests.export.conftest import make_snapshot, probe_texts, tokenizer

__all__ = ["make_snapshot", "probe_texts", "tokenizer"]
