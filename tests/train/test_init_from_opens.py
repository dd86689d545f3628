"""A run that starts from a snapshot opens it once per use: parsing the config reads the model it takes
from there, the dry run or the trainer opens it for its weights; replacing or overriding a parsed config
reads nothing."""

from __future__ import annotations

import pytest
import torch

import trilm.store.open
import trilm.train.cli
import trilm.train.config
from trilm.config import ConfigError
from trilm.model.config import preset
from trilm.model.snapshot import model_meta
from trilm.model.spec import canonical_shapes
from trilm.store.snapshot import write_snapshot
from trilm.train.config import TrainConfig


@pytest.fixture
def snapshot(tmp_path):
    cfg = preset("floatlm-nano").replace(vocab_size=512)
    state = {k: torch.randn(shape) * 0.02 for k, shape in canonical_shapes(cfg).items()}
    return write_snapshot(tmp_path / "snap", cfg, model_meta(cfg), state)


@pytest.fixture
def opens(monkeypatch):
    """Every open of a model directory by the training code, by path."""
    calls: list[str] = []
    real = trilm.store.open.open_model

    def counting(path, *args, **kwargs):
        calls.append(str(path))
        return real(path, *args, **kwargs)

    for module in (trilm.train.config, trilm.train.cli):
        monkeypatch.setattr(module, "open_model", counting)
    return calls


def _data(snapshot, tmp_path, **extra):
    return {
        "init_from": str(snapshot),
        "model": {"family": "trilm"},
        "run_dir": str(tmp_path / "run"),
        "seq_len": 64,
        "batch_tokens": 1024,
        "micro_batch": 8,
        "tokens": 1024 * 4,
        "schedule": {"warmup": 1},
        **extra,
    }


def test_parsing_opens_the_snapshot_once_and_replacing_does_not(snapshot, tmp_path, opens):
    cfg = TrainConfig.from_dict(_data(snapshot, tmp_path))
    assert cfg.model.family == "trilm" and cfg.model.name == "trilm-nano"
    assert opens == [str(snapshot)]
    cfg.replace(seq_len=32).with_overrides(["tokens=8192", "model.context=512"])
    TrainConfig.from_dict(cfg.to_dict())
    assert opens == [str(snapshot)]
    trilm.train.cli.dry_run(cfg)
    assert opens == [str(snapshot)] * 2  # the dry run reads and verifies the weights: one open more


def test_an_init_from_of_another_architecture_is_refused_where_it_is_opened(snapshot, tmp_path, opens):
    with pytest.raises(ConfigError, match="init_from: .* whose tensors differ from model"):
        TrainConfig.from_dict(_data(snapshot, tmp_path, model={"family": "trilm", "hidden": 128}))
    cfg = TrainConfig.from_dict(_data(snapshot, tmp_path)).with_overrides(["model.hidden=128"])
    with pytest.raises(ConfigError, match="init_from: .* whose tensors differ from model"):
        trilm.train.cli.dry_run(cfg)
