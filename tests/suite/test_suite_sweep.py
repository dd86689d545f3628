"""``trilm suite sweep``: the suite's runs of one size at several learning rates, and the best per family."""

from __future__ import annotations

import pytest

from tests.suite.conftest import write_suite
from trilm.config import ConfigError
from trilm.suite import load_suite
from trilm.suite.sweep import parse_axes, sweep, sweep_runs
from trilm.train.config import TrainConfig


def test_sweep_trains_each_rate_once(tmp_path, prepared):
    suite = load_suite(write_suite(tmp_path, prepared, families=("trilm",), steps=4))
    lines: list[str] = []
    result = sweep(suite, "pico", [1e-3, 1e-2], progress=False, echo=lines.append)
    losses = result.losses["trilm"]
    assert set(losses) == {1e-3, 1e-2} and all(v is not None and v > 0 for v in losses.values())
    assert result.best("trilm") == min(losses, key=losses.get)
    config = TrainConfig.from_yaml(suite.root / "configs/trilm-pico-lr0.01.yaml")
    assert config.optim.lr == 1e-2 and config.run_dir == str(suite.root / "sweep/trilm-pico-lr0.01")
    assert (
        config.replace(optim=suite.runs[0].cfg.optim, run_dir=suite.runs[0].cfg.run_dir) == suite.runs[0].cfg
    )
    table = (suite.root / "sweep/lr-pico.md").read_text()
    assert "| run | lr 0.001 | lr 0.01 | best | wall |" in table
    again = sweep(suite, "pico", [1e-3, 1e-2], progress=False, echo=lines.append)
    assert again.losses == result.losses and sum("skipped" in line for line in lines) == 2


def test_extra_axes_and_budget_name_and_shape_the_runs(tmp_path, prepared):
    suite = load_suite(write_suite(tmp_path, prepared, families=("floatlm",), steps=4))
    points = sweep_runs(suite, "pico", [1e-3, 2e-3], axes=parse_axes(["batch_tokens=512,2048"]), tokens=4096)
    names = [p.run.name for p in points]
    assert names == [
        "floatlm-pico-4p1k-batch_tokens512-lr0.001",
        "floatlm-pico-4p1k-batch_tokens512-lr0.002",
        "floatlm-pico-4p1k-batch_tokens2048-lr0.001",
        "floatlm-pico-4p1k-batch_tokens2048-lr0.002",
    ]
    small, large = points[0].run.cfg, points[2].run.cfg
    assert (small.batch_tokens, small.micro_batch, small.steps) == (512, 8, 8)  # 8 sequences of 64
    assert (large.batch_tokens, large.micro_batch, large.steps) == (2048, 16, 2)
    assert {p.row for p in points} == {"floatlm batch_tokens=512", "floatlm batch_tokens=2048"}
    seeds = sweep_runs(suite, "pico", [1e-3], axes=parse_axes(["seed=7", "data.seed=7"]))
    assert seeds[0].run.name == "floatlm-pico-seed7-data_seed7-lr0.001"
    assert (seeds[0].run.cfg.seed, seeds[0].run.cfg.data.seed) == (7, 7)


def test_bad_axes_are_refused(tmp_path, prepared):
    suite = load_suite(write_suite(tmp_path, prepared, families=("floatlm",), steps=4))
    for bad, message in (
        (["batch_tokens"], "expected KEY=V1,V2"),
        (["optim.lr=1e-3"], "from --lr"),
        (["batch_tokens=512,512"], "repeated value"),
    ):
        with pytest.raises(ConfigError, match=message):
            parse_axes(bad)
    with pytest.raises(ConfigError, match=r"sweep run floatlm-pico-batch_tokens100-lr0.001: .*batch_tokens"):
        sweep_runs(suite, "pico", [1e-3], axes=parse_axes(["batch_tokens=100"]))
