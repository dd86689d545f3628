"""Shared fixtures of the data tests: the embedded corpus prepared once per session, and a writer of small
SlimPajama-shaped corpora (for bad-input and mixture cases)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import zstandard

from trilm.data import embedded_corpus_dir
from trilm.data.pipeline import prepare_embedded


@pytest.fixture(scope="session")
def embedded(tmp_path_factory) -> dict[str, Path]:
    """Tokenizer (vocab 2048) + prepared train and validation splits of the embedded corpus (2 workers)."""
    out = tmp_path_factory.mktemp("embedded")
    return prepare_embedded(out, vocab_size=2048, workers=2, progress=False)


@pytest.fixture(scope="session")
def corpus() -> Path:
    return embedded_corpus_dir()


def write_jsonl_zst(path: Path, lines: list[bytes | str | dict], *, raw: bytes | None = None) -> Path:
    """One SlimPajama file; dicts become JSON lines, str/bytes are written verbatim (to make bad lines)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if raw is None:
        parts = [
            (json.dumps(x) if isinstance(x, dict) else x).encode() if not isinstance(x, bytes) else x
            for x in lines
        ]
        raw = b"\n".join(parts) + b"\n"
    path.write_bytes(zstandard.ZstdCompressor(level=3).compress(raw))
    return path


@pytest.fixture
def jsonl_zst():
    return write_jsonl_zst
