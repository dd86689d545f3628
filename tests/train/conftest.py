"""Fixtures of the training tests: the embedded corpus prepared once, and a tiny run config on it."""

from __future__ import annotations

from pathlib import Path

import pytest

from trilm.data.pipeline import prepare_embedded
from trilm.train.config import TrainConfig


@pytest.fixture(scope="session")
def prepared(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("train-data")
    return prepare_embedded(out, vocab_size=512, workers=1, progress=False)


def tiny_config(prepared: dict[str, Path], run_dir: Path, family: str = "trilm", **overrides) -> TrainConfig:
    """A run of a 2-layer, 64-wide model on 64-token sequences: seconds per run on one CPU core."""
    data = {
        "model": {"preset": f"{family}-nano", "vocab_size": 512},
        "data": {
            "train_dir": str(prepared["train"]),
            "valid_dir": str(prepared["validation"]),
            "tokenizer": str(prepared["tokenizer"]),
            "valid_sequences": 16,
        },
        "run_dir": str(run_dir),
        "seq_len": 64,
        "batch_tokens": 1024,
        "micro_batch": 8,
        "tokens": 1024 * 24,
        "zero_stage": 0,
        "optim": {"lr": 3e-3},
        "schedule": {"warmup": 2},
        "checkpoint": {"snapshot_every": 8, "state_every": 4, "keep_last": 2, "log_spaced_until": 4},
        "log": {"every": 4, "eval_every": 0, "tensorboard": False, "progress": False},
    }
    cfg = TrainConfig.from_dict(data)
    return cfg.with_overrides([f"{k}={v}" for k, v in overrides.items()]) if overrides else cfg
