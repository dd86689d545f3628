"""Typed snapshot metadata: one reader and writer, nothing lost, family-free sizes."""

import pytest

from trilm.config import ConfigError
from trilm.model import preset
from trilm.model.flops import parameter_counts
from trilm.model.snapshot import SnapshotMeta, model_meta
from trilm.store.snapshot import read_snapshot_config, write_snapshot_config


def test_meta_round_trip_keeps_unknown_keys(tmp_path):
    meta = SnapshotMeta(step=4, family="trilm", size="tiny", val_loss=3.5, extra={"quant": {"bits": 4}})
    write_snapshot_config(tmp_path, preset("trilm-nano"), meta)
    cfg, back = read_snapshot_config(tmp_path)
    assert back == meta and cfg.name == "trilm-nano" and cfg.size_name == "nano"
    legacy = SnapshotMeta.from_dict({"step": 1, "family": "bilm", "size": "bilm-99m", "seed_note": "x"})
    assert legacy.size == "99m" and legacy.extra == {"seed_note": "x"}
    assert SnapshotMeta.from_dict(legacy.to_dict()) == legacy


def test_model_meta_fills_what_the_config_implies():
    cfg = preset("trilm-nano")
    counts = parameter_counts(cfg)
    meta = model_meta(cfg, tp=2, step=3, extra={"imported_from": "x"})
    assert (meta.family, meta.size, meta.step, meta.extra) == ("trilm", "nano", 3, {"imported_from": "x"})
    assert (meta.params, meta.nonembedding_params, meta.linear_params) == (
        counts.total,
        counts.nonembedding,
        counts.linear,
    )
    assert meta.scale_partitions == cfg.scale_partitions(2)
    assert model_meta(cfg, size="other").size == "other"


def test_read_snapshot_names_bad_files(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="config.json: invalid JSON"):
        read_snapshot_config(tmp_path)
    (tmp_path / "config.json").write_text('{"format": "trilm-snapshot", "model": {}, "meta": [1]}')
    with pytest.raises(ConfigError, match="'meta' must be a mapping"):
        read_snapshot_config(tmp_path)
    (tmp_path / "config.json").write_text('{"format": "hf"}')
    with pytest.raises(ConfigError, match="format 'hf' is not 'trilm-snapshot'"):
        read_snapshot_config(tmp_path)
