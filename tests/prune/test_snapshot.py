"""A pruned snapshot is an ordinary snapshot: config round trip, HF export (exact or refused), further
training from it with the project's loop, evaluation, and serving through trilm.infer."""

import json

import pytest
import torch

from trilm.config import ConfigError
from trilm.infer import load_inference_model
from trilm.model.config import ModelConfig
from trilm.store.hf import write_hf_files
from trilm.store.snapshot import read_snapshot_config
from trilm.train.config import TrainConfig
from trilm.train.init_from import resolve_init_from
from trilm.train.models import load_model

from .conftest import FAST_PG, cli


def _ids():
    return torch.randint(0, 512, (2, 20), generator=torch.Generator().manual_seed(5))


def _prune(tmp_path, snapshot, prepared, name, *argv):
    out = tmp_path / name
    assert cli(snapshot, *argv, "--calib", prepared["train"], "--out", out, *FAST_PG) == 0
    return out


def test_per_layer_config_round_trips(tmp_path, calib_snapshot, prepared):
    out = _prune(tmp_path, calib_snapshot, prepared, "p", "--granularity", "head,channel", "--keep", ".5")
    cfg, _ = read_snapshot_config(out)
    assert cfg.layer_kv_heads is not None and cfg.layer_ffn is not None and not cfg.is_uniform
    raw = json.loads((out / "config.json").read_text())["model"]
    assert ModelConfig.from_dict(raw) == cfg
    assert raw["layer_ffn"] == cfg.layer_ffn and raw["layer_kv_heads"] == cfg.layer_kv_heads
    model = load_model(out, tp=1)
    assert model.cfg.layer_shapes() == cfg.layer_shapes()


def _transformers_logits(path, ids):
    from transformers import LlamaForCausalLM

    hf = LlamaForCausalLM.from_pretrained(path, torch_dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        return hf(ids).logits


@pytest.mark.parametrize(
    "argv",
    [
        ("--granularity", "channel", "--keep", ".5", "--per-layer"),  # every block keeps 96 channels
        ("--granularity", "layer", "--keep", ".67"),  # 2 of 3 blocks
    ],
)
def test_uniform_pruned_models_export_to_hf_exactly(tmp_path, calib_snapshot, prepared, argv):
    out = _prune(tmp_path, calib_snapshot, prepared, "p", *argv)
    cfg, _ = read_snapshot_config(out)
    assert cfg.is_uniform and cfg.layer_ffn is None  # normalised to a global width
    model = load_model(out, tp=1)
    write_hf_files(cfg, model.full_state_dict(), tmp_path / "hf")
    ids = _ids()
    with torch.no_grad():
        ours = load_inference_model(out)(ids)
    assert (ours - _transformers_logits(tmp_path / "hf", ids)).abs().max() <= 1e-5


@pytest.mark.parametrize("granularity", ["channel", "head"])
def test_non_uniform_pruned_models_are_refused_by_the_hf_export(
    tmp_path, calib_snapshot, prepared, granularity
):
    out = _prune(tmp_path, calib_snapshot, prepared, "p", "--granularity", granularity, "--keep", ".5")
    cfg, _ = read_snapshot_config(out)
    with pytest.raises(ConfigError, match="per-layer head counts / FFN widths"):
        write_hf_files(cfg, load_model(out, tp=1).full_state_dict(), tmp_path / "hf")


def test_pruned_snapshot_trains_further_and_evaluates(tmp_path, calib_snapshot, prepared):
    from trilm.eval.suite import evaluate_snapshot
    from trilm.train.trainer import Trainer

    out = _prune(tmp_path, calib_snapshot, prepared, "p", "--granularity", "channel", "--keep", ".5")
    pruned_cfg, _ = read_snapshot_config(out)
    data = {
        "init_from": str(out),
        "data": {
            "train_dir": str(prepared["train"]),
            "valid_dir": str(prepared["validation"]),
            "tokenizer": str(prepared["tokenizer"]),
            "valid_sequences": 8,
        },
        "run_dir": str(tmp_path / "run"),
        "seq_len": 64,
        "batch_tokens": 512,
        "micro_batch": 8,
        "tokens": 512 * 4,
        "zero_stage": 0,
        "optim": {"lr": 3e-3},
        "schedule": {"warmup": 1},
        "checkpoint": {"snapshot_every": 4, "state_every": 4, "keep_last": 1, "log_spaced_until": 0},
        "log": {"every": 2, "eval_every": 0, "tensorboard": False, "progress": False},
    }
    cfg = TrainConfig.from_dict(data)
    assert resolve_init_from(cfg).model == pruned_cfg  # the run takes the snapshot's per-layer shapes
    summary = Trainer(cfg).fit()
    start = evaluate_snapshot(out, prepared["validation"], 64, max_sequences=8)
    assert summary.val_losses[0] == pytest.approx(start, rel=1e-6)  # step 0 is the pruned model itself
    assert summary.val_losses[4] < start  # and training moved it
    final = tmp_path / "run" / "snapshots" / "step-4"
    assert read_snapshot_config(final)[0].layer_ffn == pruned_cfg.layer_ffn
    served = load_inference_model(final)
    with torch.no_grad():
        assert torch.isfinite(served(_ids())).all()

    other = TrainConfig.from_dict({**data, "model": {"preset": "floatlm-nano", "vocab_size": 512}})
    with pytest.raises(ConfigError, match="init_from: .* whose tensors differ from model"):
        resolve_init_from(other)
