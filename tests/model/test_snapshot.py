"""Typed snapshot metadata: one reader and writer, nothing lost, family-free sizes."""

import pytest

from trilm.config import ConfigError
from trilm.model import preset
from trilm.model.snapshot import SnapshotMeta
from trilm.store.snapshot import read_snapshot_config, write_snapshot_config


def test_meta_round_trip_keeps_unknown_keys(tmp_path):
    meta = SnapshotMeta(step=4, family="trilm", size="tiny", val_loss=3.5, extra={"quant": {"bits": 4}})
    write_snapshot_config(tmp_path, preset("trilm-nano"), meta)
    cfg, back = read_snapshot_config(tmp_path)
    assert back == meta and cfg.name == "trilm-nano" and cfg.size_name == "nano"
    legacy = SnapshotMeta.from_dict({"step": 1, "family": "bilm", "size": "bilm-99m", "seed_note": "x"})
    assert legacy.size == "99m" and legacy.extra == {"seed_note": "x"}
    assert SnapshotMeta.from_dict(legacy.to_dict()) == legacy


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
