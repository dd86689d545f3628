"""A run that starts from a snapshot opens it once per use, and never to parse its config: parsing keeps the
model section as written (a :class:`ModelFromSnapshot`), and the dry run or the trainer resolves it
(:func:`resolve_init_from`), opening the snapshot once for its model, its check and its weights."""

from __future__ import annotations

import pytest
import torch

import trilm.train.init_from
from tests.support.no_files import no_files_opened
from trilm.config import ConfigError
from trilm.model.config import QuantConfig, preset
from trilm.model.snapshot import model_meta
from trilm.model.spec import canonical_shapes
from trilm.store.snapshot import write_snapshot
from trilm.train import cli
from trilm.train.config import ModelFromSnapshot, TrainConfig
from trilm.train.init_from import resolve_init_from


@pytest.fixture
def snapshot(tmp_path):
    cfg = preset("floatlm-nano").replace(vocab_size=512)
    state = {k: torch.randn(shape) * 0.02 for k, shape in canonical_shapes(cfg).items()}
    return write_snapshot(tmp_path / "snap", cfg, model_meta(cfg), state)


@pytest.fixture
def opens(monkeypatch):
    """Every open of a model directory by the training code, by path."""
    calls: list[str] = []
    real = trilm.train.init_from.open_model

    def counting(path, *args, **kwargs):
        calls.append(str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(trilm.train.init_from, "open_model", counting)
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


def test_parsing_opens_nothing_and_the_run_start_opens_the_snapshot_once(snapshot, tmp_path, opens):
    with no_files_opened():
        cfg = TrainConfig.from_dict(_data(snapshot, tmp_path))
        changed = cfg.replace(seq_len=32).with_overrides(["tokens=8192", "model.context=512"])
        again = TrainConfig.from_dict(changed.to_dict())
    assert cfg.model == ModelFromSnapshot({"family": "trilm"}) and cfg.model_unresolved
    assert again == changed and again.model == ModelFromSnapshot({"family": "trilm", "context": 512})
    assert opens == []
    resolved = resolve_init_from(cfg)
    assert opens == [str(snapshot)]
    float_nano = preset("floatlm-nano").replace(vocab_size=512)
    assert not resolved.model_unresolved
    assert resolved.model == float_nano.replace(family="trilm", name="trilm-nano", quant=QuantConfig())
    assert resolve_init_from(changed).model.context == 512
    cli.dry_run(cfg)
    assert opens == [str(snapshot)] * 3  # the dry run resolves, reads and verifies: one open


def test_a_resolved_config_keeps_its_model_through_replace_overrides_and_yaml(snapshot, tmp_path, opens):
    resolved = resolve_init_from(TrainConfig.from_dict(_data(snapshot, tmp_path)))
    with no_files_opened():
        again = TrainConfig.from_dict(resolved.to_dict()).with_overrides(["model.hidden=128", "seq_len=32"])
    assert again.model.hidden == 128 and again.model.name == "trilm-nano" and not again.model_unresolved
    assert opens == [str(snapshot)]


def test_the_model_of_an_unresolved_config_is_refused_naming_init_from(snapshot, tmp_path):
    cfg = TrainConfig.from_dict(_data(snapshot, tmp_path, seq_len=0))
    for read in (lambda: cfg.model.context, lambda: cfg.sequence_length, lambda: cfg.global_batch):
        with pytest.raises(ConfigError, match=r"^model\.context: the model is the init_from snapshot's"):
            read()
    assert cfg.steps == 4  # what needs no model is there


def test_an_init_from_of_another_architecture_is_refused_where_it_is_resolved(snapshot, tmp_path, opens):
    wide = TrainConfig.from_dict(_data(snapshot, tmp_path, model={"family": "trilm", "hidden": 128}))
    with pytest.raises(ConfigError, match="init_from: .* whose tensors differ from model"):
        resolve_init_from(wide)
    cfg = resolve_init_from(TrainConfig.from_dict(_data(snapshot, tmp_path))).with_overrides(
        ["model.hidden=128"]
    )
    with pytest.raises(ConfigError, match="init_from: .* whose tensors differ from model"):
        cli.dry_run(cfg)
    preset_model = _data(snapshot, tmp_path, model={"preset": "floatlm-tiny", "vocab_size": 512})
    with no_files_opened():
        complete = TrainConfig.from_dict(preset_model)  # a preset is the model: nothing to resolve
    assert complete.model.name == "floatlm-tiny" and not complete.model_unresolved
    with pytest.raises(ConfigError, match="init_from: .* whose tensors differ from model"):
        resolve_init_from(complete)


@pytest.mark.parametrize(
    ("init_from", "message"),
    [
        (1, r"^init_from: expected a path \(a string\), got 1$"),
        (None, r"^init_from: expected a path \(a string\), got None$"),
        (["a"], r"^init_from: expected a path \(a string\), got \['a'\]$"),
        ("a" * 5000, r"^init_from: a path of 5000 bytes, longer than a file system takes \(4096\)$"),
        ("runs/" + "a" * 300, r"^init_from: .* has a name of 300 bytes, longer than 255$"),
        ("snap\x00", r"^init_from: .* is not a path \(it holds a NUL byte\)$"),
    ],
)
def test_init_from_is_a_path_checked_at_parse_time(init_from, message):
    with no_files_opened(), pytest.raises(ConfigError, match=message):
        TrainConfig.from_dict({"init_from": init_from, "model": {"family": "trilm"}})


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ([1], r"^model: expected a mapping for ModelConfig, got \[1\]$"),
        ({"hiden": 64}, r"^unknown key 'model\.hiden' \(did you mean 'model\.hidden'\?\)$"),
        ({"quant": {"partitons": 2}}, r"^unknown key 'model\.quant\.partitons'"),
        ({"quant": [2]}, r"^model\.quant: expected a mapping for QuantConfig"),
        ({"layers": "many"}, r"^model\.layers: expected an integer, got 'many'$"),
    ],
)
def test_a_partial_model_section_is_checked_by_key_without_the_snapshot(model, message):
    with no_files_opened(), pytest.raises(ConfigError, match=message):
        TrainConfig.from_dict({"init_from": "runs/x/snapshots/step-8", "model": model})
