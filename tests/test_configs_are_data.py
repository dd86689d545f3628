"""Configs are data: parsing and validating every shipped run config and suite opens no file.

A run config or suite is read once (its YAML); building and validating the typed config from that mapping,
planning its run and expanding a suite into runs read nothing else: no snapshot, tokenizer or data file. A
suite's expansion reads the suite file and its run-config templates, and those only. What a config names
(an ``init_from`` snapshot, a tokenizer, token shards) is opened where a run starts or a command needs it
(:mod:`trilm.train.init_from`, the trainer, ``trilm train --dry-run``).
"""

from __future__ import annotations

import os

import pytest
import yaml
from trilm.configs import config_dir

from tests.support.no_files import FileOpened, no_files_opened
from trilm.suite.config import SuiteConfig, load_suite
from trilm.suite.plan import plan_suite
from trilm.train.config import TrainConfig
from trilm.train.plan import RunPlan

CONFIGS = config_dir()
RUN_CONFIGS = sorted((CONFIGS / "train").glob("*.yaml"))
SUITES = sorted((CONFIGS / "suites").glob("*.yaml"))


def _read(path) -> dict:
    return yaml.safe_load(path.read_text())


def test_every_shipped_yaml_is_a_run_config_or_a_suite():
    assert RUN_CONFIGS and SUITES
    assert set(CONFIGS.rglob("*.y*ml")) == {*RUN_CONFIGS, *SUITES}


def test_the_guard_refuses_every_way_of_opening_a_file(tmp_path):
    path = tmp_path / "f.txt"
    path.write_text("x")
    for how in (
        lambda: open(path),  # noqa: SIM115 - the open itself is what is tested
        lambda: path.open(),
        lambda: path.read_text(),
        lambda: path.read_bytes(),
        lambda: os.open(path, os.O_RDONLY),
    ):
        with no_files_opened(), pytest.raises(FileOpened, match="must open no file"):
            how()
    with no_files_opened(allowed=lambda p: p.suffix == ".txt") as opened:
        assert path.read_text() == "x"
    assert opened == {path}


@pytest.mark.parametrize("path", RUN_CONFIGS, ids=[p.stem for p in RUN_CONFIGS])
def test_a_run_config_parses_validates_and_plans_opening_no_file(path):
    data = _read(path)
    with no_files_opened():
        cfg = TrainConfig.from_dict(data)
        again = TrainConfig.from_dict(cfg.to_dict()).with_overrides(["tokens=" + str(cfg.batch_tokens)])
        report = RunPlan(cfg, dp_size=1, tp_size=cfg.parallel.tensor_parallel).report()
    assert not cfg.model_unresolved and again.steps == 1
    assert f"steps              {cfg.steps:,}" in report


@pytest.mark.parametrize("path", SUITES, ids=[p.stem for p in SUITES])
def test_a_suite_parses_and_validates_opening_no_file_and_expands_reading_only_yaml(path):
    data = _read(path)
    with no_files_opened():
        SuiteConfig.from_dict(data)
    with no_files_opened(allowed=lambda p: p.suffix == ".yaml") as opened:
        suite = load_suite(path)
        plan = plan_suite(suite).render(markdown=False)
    assert suite.runs and plan
    assert path in opened and opened <= {*RUN_CONFIGS, *SUITES}
    assert not any(run.cfg.model_unresolved for run in suite.runs)


def test_a_suite_whose_template_starts_from_a_snapshot_expands_without_opening_it(tmp_path):
    template = tmp_path / "from-snapshot.yaml"
    template.write_text(
        yaml.safe_dump(
            {**_read(CONFIGS / "train" / "quickstart-trilm.yaml"), "init_from": "no/such/snapshot"}
        )
    )
    suite_file = tmp_path / "suite.yaml"
    suite_file.write_text(
        yaml.safe_dump(
            {
                "name": "from-snapshot",
                "root": str(tmp_path / "runs"),
                "families": [{"name": "trilm", "config": str(template)}],
                "sizes": [{"name": "nano"}],
                "tokens": [65_536],
            }
        )
    )
    with no_files_opened(allowed=lambda p: p.suffix == ".yaml"):
        suite = load_suite(suite_file)
    (run,) = suite.runs
    assert run.cfg.init_from == "no/such/snapshot" and run.cfg.model.name == "trilm-nano"
