"""``trilm suite sweep``: the suite's runs of one size at several learning rates, and the best per family."""

from __future__ import annotations

from tests.suite.conftest import write_suite
from trilm.suite import load_suite
from trilm.suite.sweep import sweep
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
    assert "| family | lr 0.001 | lr 0.01 | best |" in table
    again = sweep(suite, "pico", [1e-3, 1e-2], progress=False, echo=lines.append)
    assert again.losses == result.losses and sum("skipped" in line for line in lines) == 2
