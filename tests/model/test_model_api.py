import json

import pytest
import torch

from trilm.cli import main as trilm_main
from trilm.config import ConfigError
from trilm.model import build_model, parameter_counts, preset
from trilm.train.models import load_model, save_model


@pytest.mark.parametrize("family", ["floatlm", "trilm", "bilm"])
def test_built_model_matches_analytic_counts_and_trains(family):
    cfg = preset(f"{family}-nano", vocab_size=300, kv_heads=2)
    model = build_model(cfg, seed=0)
    assert sum(p.numel() for p in model.parameters()) == parameter_counts(cfg).total
    ids = torch.randint(0, 300, (2, 33))
    loss = model(ids[:, :-1], labels=ids[:, 1:]).mean()
    assert abs(loss.item() - torch.log(torch.tensor(384.0)).item()) < 0.5
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


def test_snapshot_round_trip(tmp_path):
    model = build_model("trilm-nano", seed=3)
    save_model(model, tmp_path, meta={"step": 5})
    again = load_model(tmp_path)
    ids = torch.randint(0, 4096, (1, 9))
    with torch.no_grad():
        assert torch.equal(model(ids), again(ids))
    assert json.loads((tmp_path / "config.json").read_text())["meta"] == {"step": 5}


def test_snapshot_errors_name_the_file(tmp_path):
    with pytest.raises(ConfigError, match="no config.json: not a model directory"):
        load_model(tmp_path)
    (tmp_path / "config.json").write_text('{"format": "trilm-snapshot", "model": {"hidden": 7}}')
    with pytest.raises(ConfigError, match=r"config.json: model.hidden: 7 is not divisible by heads=8"):
        load_model(tmp_path)


def test_sequence_longer_than_context_is_refused():
    model = build_model("floatlm-nano")
    with pytest.raises(ValueError, match="exceeds the model context 128"):
        model(torch.zeros(1, 129, dtype=torch.long))


def test_model_info_cli_prints_3_9b(capsys):
    assert trilm_main(["model", "info", "--preset", "trilm-3.9b"]) == 0
    out = capsys.readouterr().out
    assert "3,989.76M" in out and "non-embedding" in out and "FLOPs/token" in out
    assert trilm_main(["model", "info", "--preset", "trilm-99m", "hidden=500"]) == 2
    assert "hidden: 500 is not divisible by heads=8" in capsys.readouterr().err
