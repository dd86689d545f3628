"""Fixtures of the pruning tests: tiny random models, their snapshots, and a prepared calibration split."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trilm.infer import from_state_dict
from trilm.model import build_model, preset
from trilm.train.models import save_model

VOCAB = 300


def tiny_cfg(family: str = "floatlm", **overrides):
    """3 blocks, 4 query heads in 2 KV groups, FFN 192: small enough for exact checks in milliseconds."""
    fields = dict(vocab_size=VOCAB, kv_heads=2, layers=3, context=64)
    fields.update(overrides)
    return preset(f"{family}-nano", **fields)


def tiny_model(family: str = "floatlm", seed: int = 3, **overrides):
    """(training decoder, canonical state, inference model) of one random model."""
    train = build_model(tiny_cfg(family, **overrides), tp=1, seed=seed)
    state = train.full_state_dict()
    infer = from_state_dict(train.cfg, state).eval()
    for p in infer.parameters():
        p.requires_grad_(False)
    return train, state, infer


def token_ids(n: int = 2, seq: int = 24, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n, seq), generator=torch.Generator().manual_seed(seed))


@pytest.fixture
def tiny_snapshot(tmp_path) -> Path:
    train, _, _ = tiny_model()
    path = tmp_path / "dense"
    save_model(train, path, meta={"step": 7, "tokens": 7000, "family": "floatlm", "size": "nano"})
    return path


@pytest.fixture(scope="session")
def prepared(tmp_path_factory) -> dict[str, Path]:
    """The embedded corpus tokenized with a 512-piece tokenizer (train and validation splits)."""
    from trilm.data.pipeline import prepare_embedded

    out = tmp_path_factory.mktemp("prune-data")
    return prepare_embedded(out, vocab_size=512, workers=1, progress=False)


@pytest.fixture
def calib_snapshot(tmp_path, prepared) -> Path:
    """A random FloatLM over the prepared data's 512-piece tokenizer, saved with it (tokenizer and hash)."""
    import shutil

    from trilm.data.shards import TokenShards

    train = build_model(tiny_cfg(vocab_size=512), tp=1, seed=4)
    path = tmp_path / "dense"
    meta = {
        "step": 10,
        "family": "floatlm",
        "size": "nano",
        "tokenizer_hash": TokenShards.open(prepared["train"]).tokenizer_hash,
    }
    save_model(train, path, meta=meta)
    shutil.copyfile(prepared["tokenizer"], path / "tokenizer.model")
    return path


def cli(*argv: str) -> int:
    from trilm.cli import main

    return main(["prune", *map(str, argv)])


FAST_PG = ("--steps", "3", "--batch-size", "2", "--pg-seq-len", "32", "--calib-samples", "4")
FAST_PG += ("--calib-seq-len", "32", "--no-progress")
