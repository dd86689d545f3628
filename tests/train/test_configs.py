"""Every shipped run config loads, validates and plans (the ladder's dry run, without launching anything)."""

from pathlib import Path

import pytest
import torch

from trilm.config import ConfigError
from trilm.model.config import SPECTRA_SIZES
from trilm.train.config import TrainConfig
from trilm.train.plan import RunPlan

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs/train").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_run_config_plans(path):
    cfg = TrainConfig.from_yaml(path)
    tp = cfg.parallel.tensor_parallel
    report = RunPlan(cfg, dp_size=8 if cfg.tokens > 1e9 else 1, tp_size=tp).report()
    assert f"steps              {cfg.steps:,}" in report
    family, size = path.stem.split("-", 1)
    if size in SPECTRA_SIZES:
        assert cfg.model.name == path.stem and tp == SPECTRA_SIZES[size][4]
        assert cfg.batch_tokens == (2_097_152 if family == "floatlm" else 1_048_576)
        assert cfg.tokens == 300_000_000_000
        assert (cfg.schedule.lr_drop_at is not None) == (family != "floatlm")
        assert cfg.compile_on("cuda") and not cfg.compile_on("cpu")


def test_the_ladder_is_complete():
    names = {p.stem for p in CONFIGS}
    assert {f"{f}-{s}" for f in ("trilm", "floatlm") for s in SPECTRA_SIZES} <= names
    assert {"quickstart-trilm", "quickstart-floatlm"} <= names


BASE = {"data": {"train_dir": "unused"}}


def test_compile_auto_compiles_on_cuda_only_and_explicit_values_win():
    auto = TrainConfig.from_dict(BASE)
    assert auto.compile == "auto"
    assert auto.compile_on("cuda") is True and auto.compile_on(torch.device("cuda", 0)) is True
    assert auto.compile_on("cpu") is False and auto.compile_on(torch.device("cpu")) is False
    for value in (True, False):
        cfg = TrainConfig.from_dict({**BASE, "compile": value})
        assert cfg.compile_on("cuda") is value and cfg.compile_on("cpu") is value
    assert auto.with_overrides(["compile=false"]).compile_on("cuda") is False
    assert auto.with_overrides(["compile=true"]).compile_on("cpu") is True
    explicit = TrainConfig.from_dict({**BASE, "compile": False})
    assert explicit.with_overrides(["compile=auto"]).compile == "auto"


@pytest.mark.parametrize("bad", ["yes please", "cuda", 1, None])
def test_bad_compile_value_is_refused_by_key(bad):
    with pytest.raises(ConfigError, match=r"^compile: "):
        TrainConfig.from_dict({**BASE, "compile": bad})
    with pytest.raises(ConfigError, match=r"^compile: must be true, false or 'auto'"):
        TrainConfig(compile=bad)
