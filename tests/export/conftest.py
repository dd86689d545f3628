"""Fixtures of the export tests: a small SentencePiece tokenizer trained here and run-shaped snapshots."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from trilm.data import embedded_corpus_dir
from trilm.data.slimpajama import read_documents, split_files
from trilm.data.tokenizer import Tokenizer, train_tokenizer
from trilm.train.models import save_model


def corpus_texts(split: str, limit: int) -> list[str]:
    files = split_files(embedded_corpus_dir(), split)
    docs = itertools.chain.from_iterable(read_documents(f) for f in files)
    return [d.text for d in itertools.islice(docs, limit)]


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory) -> Tokenizer:
    """A 512-piece byte-fallback BPE tokenizer on part of the embedded corpus (about a second)."""
    out = tmp_path_factory.mktemp("tok") / "tokenizer.model"
    return train_tokenizer(corpus_texts("train", 60), out, vocab_size=512, max_sentences=4000)


@pytest.fixture(scope="session")
def probe_texts() -> list[str]:
    return [t[:2000] for t in corpus_texts("validation", 12)]


def write_run_snapshot(root: Path, model, tokenizer: Tokenizer, step: int = 10, **meta) -> Path:
    """``root/snapshots/step-N`` with COMPLETE, the tokenizer in ``root`` and meta like the trainer's."""
    from trilm.model.flops import parameter_counts

    counts = parameter_counts(model.cfg)
    snap = root / "snapshots" / f"step-{step}"
    full = {
        "step": step,
        "tokens": step * 1024,
        "samples": step * 8,
        "run": root.name,
        "family": model.cfg.family,
        "size": model.cfg.name.split("-", 1)[-1],
        "params": counts.total,
        "nonembedding_params": counts.nonembedding,
        "linear_params": counts.linear,
        "scale_partitions": model.cfg.scale_partitions(1),
        "flops": 6.0 * counts.total * step * 1024,
        "tokenizer_hash": tokenizer.hash,
        "train_loss": 5.0,
        "val_loss": 5.5,
        **meta,
    }
    save_model(model, snap, meta=full)  # a complete snapshot: COMPLETE with the manifest of its files
    (root / "tokenizer.model").write_bytes(tokenizer.path.read_bytes())
    return snap


@pytest.fixture
def make_snapshot(tmp_path, tokenizer):
    """``make_snapshot("trilm", seed=1, **preset_overrides)`` → a complete snapshot of a nano model."""
    from trilm.model import build_model, preset

    def make(family: str = "floatlm", seed: int = 0, run: str | None = None, step: int = 10, **overrides):
        cfg = preset(f"{family}-nano", vocab_size=tokenizer.vocab_size, **overrides)
        model = build_model(cfg, tp=1, seed=seed)
        return write_run_snapshot(tmp_path / (run or f"{family}-nano"), model, tokenizer, step=step)

    return make
