"""Data path: SlimPajama reader → SentencePiece tokenizer → packed token shards → deterministic sampler.

Exports are loaded lazily so that worker processes (and ``trilm data ...`` commands that do not sample)
never import torch.
"""

from __future__ import annotations

import importlib
from pathlib import Path

_EXPORTS = {
    "DataError": "trilm.data.errors",
    "Document": "trilm.data.slimpajama",
    "ReadStats": "trilm.data.slimpajama",
    "SourceFile": "trilm.data.slimpajama",
    "SourceMixture": "trilm.data.slimpajama",
    "read_documents": "trilm.data.slimpajama",
    "read_documents_datasets": "trilm.data.slimpajama",
    "split_files": "trilm.data.slimpajama",
    "hub_split_files": "trilm.data.slimpajama",
    "source_statistics": "trilm.data.slimpajama",
    "Tokenizer": "trilm.data.tokenizer",
    "train_tokenizer": "trilm.data.tokenizer",
    "TokenShards": "trilm.data.shards",
    "PrepareConfig": "trilm.data.prepare",
    "prepare": "trilm.data.prepare",
    "TokenizerConfig": "trilm.data.pipeline",
    "train_tokenizer_from_corpus": "trilm.data.pipeline",
    "prepare_embedded": "trilm.data.pipeline",
    "SequenceSampler": "trilm.data.sampler",
    "ValidationSet": "trilm.data.sampler",
    "DataConfig": "trilm.data.sampler",
    "Data": "trilm.data.sampler",
}

__all__ = [*sorted(_EXPORTS), "embedded_corpus_dir"]


def embedded_corpus_dir() -> Path:
    """The SlimPajama-shaped corpus shipped inside the package (see its README for sources and licenses)."""
    return Path(__file__).resolve().parent / "corpus"


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'trilm.data' has no attribute {name!r}")
