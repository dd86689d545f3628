"""Pruning a TriLM slices its latent weights; the smaller model re-quantizes them when it loads."""

import pytest
import torch

from trilm.config import ConfigError
from trilm.infer import load_inference_model
from trilm.model import build_model
from trilm.prune.slicing import check_sliceable
from trilm.store.snapshot import read_snapshot_config
from trilm.train.models import load_model, save_model

from .conftest import FAST_PG, cli, tiny_cfg, token_ids


def test_trilm_prunes_on_latent_weights_and_loads_everywhere(tmp_path, prepared):
    train = build_model(tiny_cfg("trilm", vocab_size=512), tp=1, seed=8)
    save_model(train, tmp_path / "dense", meta={"family": "trilm", "size": "nano"})
    out = tmp_path / "pruned"
    argv = ("--granularity", "head,channel", "--keep", ".5", "--calib", prepared["train"])
    assert cli(tmp_path / "dense", *argv, "--out", out, *FAST_PG) == 0
    cfg, meta = read_snapshot_config(out)
    assert cfg.family == "trilm" and meta.extra["pruning"]["units"]["channel"]["kept"] == 288
    dense_state = train.full_state_dict()
    small = load_model(out, tp=1)
    state = small.full_state_dict()
    kept = meta.extra["pruning"]["units"]["channel"]["kept_indices"]
    for i, indices in enumerate(kept):  # latent rows are copied as they were, not re-quantized on disk
        if indices:
            w = dense_state[f"layers.{i}.mlp.w_up.weight"][indices]
            assert torch.equal(state[f"layers.{i}.mlp.w_up.weight"], w)
    ids = token_ids()
    with torch.no_grad():  # the training decoder and the inference model agree on the re-quantized model
        assert (small(ids) - load_inference_model(out)(ids)).abs().max() <= 1e-5
        assert (load_inference_model(out, packed=True, backend="torch")(ids) - small(ids)).abs().max() <= 1e-4


def test_scale_layouts_that_slicing_would_split_are_refused():
    two = tiny_cfg("trilm", quant={"partitions": 2})
    with pytest.raises(ConfigError, match="2 scale partitions"):
        check_sliceable(two, ("channel",))
    check_sliceable(two, ("layer",))  # whole blocks keep their partitions
    grouped = tiny_cfg("trilm", quant={"scale_group": "group:32"})
    with pytest.raises(ConfigError, match="would split the groups"):
        check_sliceable(grouped, ("channel",))
    with pytest.raises(ConfigError, match="does not divide head_dim 16"):
        check_sliceable(grouped, ("head",))
    check_sliceable(tiny_cfg("trilm", quant={"scale_group": "group:8"}), ("head",))  # head-aligned groups
