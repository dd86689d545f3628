"""The default conversion recipe (``convert.recipe: crossover``): a conversion with nothing else set takes
the values the crossover study chose (docs/results/ternarize/README.md, "The conversion recipe"), wherever
its source's family becomes known, and keeps whatever the config sets; ``as_written`` opts out. No
training here: a written snapshot for ``init_from`` and a parent directory with its config for
``branch_from``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trilm.model.config import preset
from trilm.model.snapshot import model_meta
from trilm.model.spec import canonical_shapes
from trilm.schedule import ScheduleConfig
from trilm.store.layout import COMPLETE, RUN_CONFIG
from trilm.store.open import open_model
from trilm.store.snapshot import write_snapshot
from trilm.train import cli
from trilm.train.config import DistillConfig, OptimConfig, TrainConfig, changed_keys
from trilm.train.convert import CROSSOVER_SCHEDULE, conversion_schedule
from trilm.train.init_from import resolve_init_from
from trilm.train.plan import RunPlan
from trilm.train.state import resolve_branch_from

START = 24


@pytest.fixture(scope="module")
def float_snapshot(tmp_path_factory) -> Path:
    cfg = preset("floatlm-nano").replace(vocab_size=512)
    state = {k: torch.randn(shape) * 0.02 for k, shape in canonical_shapes(cfg).items()}
    return write_snapshot(tmp_path_factory.mktemp("float") / "snap", cfg, model_meta(cfg), state)


def _init_from(snapshot: Path, tmp_path: Path, family: str = "trilm", **extra) -> TrainConfig:
    data = {
        "init_from": str(snapshot),
        "model": {"family": family},
        "run_dir": str(tmp_path / "run"),
        "seq_len": 64,
        "batch_tokens": 1024,
        "micro_batch": 8,
        "tokens": 1024 * 8,
        **extra,
    }
    return TrainConfig.from_dict(data)


def _assert_crossover(cfg: TrainConfig, teacher: str) -> None:
    assert cfg.schedule == ScheduleConfig(kind="decay", decay="cosine", warmup=0)
    assert cfg.optim.min_lr_ratio == 0 and cfg.optim.weight_decay == 0
    assert cfg.distill == DistillConfig(teacher=teacher, weight=0.5, temperature=1.0)
    assert cfg.convert.recipe == "crossover" and cfg.convert.lr_scale == 1.0


def test_init_from_another_family_with_nothing_else_set_takes_the_crossover_recipe(float_snapshot, tmp_path):
    cfg = resolve_init_from(_init_from(float_snapshot, tmp_path))
    _assert_crossover(cfg, str(float_snapshot))
    assert cfg.optim.lr == OptimConfig().lr  # a snapshot does not record its rate: the run's own
    again = resolve_init_from(TrainConfig.from_dict(cfg.to_dict()))  # a resume resolves its saved config
    assert again == cfg and changed_keys(cfg.to_dict(), again.to_dict()) == []
    out = cli.dry_run(_init_from(float_snapshot, tmp_path))
    assert f"teacher: {float_snapshot}" in out
    assert "warmup 0 steps, cosine to 0 (the conversion's, from step 0)" in out
    assert (
        f"conversion recipe  crossover: peak 1 × optim.lr, weight decay 0, distillation from {float_snapshot}"
        " at T 1 (weight 0.5), AdamW moments from zero, no ramp"
    ) in out


def test_what_the_config_sets_is_kept_and_as_written_opts_out(float_snapshot, tmp_path):
    teacher = str(tmp_path / "bigger-teacher")
    explicit = _init_from(
        float_snapshot,
        tmp_path,
        schedule={"warmup": 2, "lr_drop_at": 0.5},
        optim={"weight_decay": 0.05},
        distill={"teacher": teacher, "temperature": 5.0},
    )
    cfg = resolve_init_from(explicit)
    assert cfg.schedule == explicit.schedule and cfg.optim.weight_decay == 0.05
    assert cfg.optim.min_lr_ratio == 0  # the one part left at its default
    assert cfg.distill == DistillConfig(teacher=teacher, weight=0.5, temperature=5.0)

    softer = resolve_init_from(_init_from(float_snapshot, tmp_path, distill={"temperature": 2.0}))
    assert softer.distill == DistillConfig(teacher=str(float_snapshot), temperature=2.0)

    plain = resolve_init_from(_init_from(float_snapshot, tmp_path, convert={"recipe": "as_written"}))
    assert plain.schedule == ScheduleConfig() and plain.optim == OptimConfig()
    assert not plain.distill.enabled


def test_an_init_from_of_the_same_family_is_untouched(float_snapshot, tmp_path):
    cfg = _init_from(float_snapshot, tmp_path, family="floatlm")
    resolved = resolve_init_from(cfg)
    assert resolved.schedule == ScheduleConfig() and resolved.optim == OptimConfig()
    assert not resolved.distill.enabled and resolved == cfg.over_snapshot(open_model(float_snapshot))


def _parent(root: Path, family: str = "floatlm", snapshot: bool = True) -> Path:
    """A parent run directory as a branch reads it: its config (a WSD run at lr 4e-3) and, unless
    ``snapshot`` is false, its snapshot at the branch point."""
    cfg = TrainConfig.from_dict(
        {
            "run_dir": str(root),
            "model": {"preset": f"{family}-nano", "vocab_size": 512},
            "seq_len": 64,
            "batch_tokens": 1024,
            "micro_batch": 8,
            "tokens": 1024 * 32,
            "optim": {"lr": 4e-3},
            "schedule": {"kind": "wsd", "warmup": 2, "cooldown": 0.25},
            "checkpoint": {"keep_states_at": [START]},
        }
    )
    root.mkdir(parents=True)
    (root / RUN_CONFIG).write_text(cfg.to_yaml())
    if snapshot:
        (root / "snapshots" / f"step-{START}").mkdir(parents=True)
        (root / "snapshots" / f"step-{START}" / COMPLETE).write_text("{}")
    return root


def _branch(parent: Path, tmp_path: Path, **extra) -> TrainConfig:
    parent_cfg = TrainConfig.from_yaml(parent / RUN_CONFIG).to_dict()
    data = {
        **{k: v for k, v in parent_cfg.items() if k not in ("optim", "schedule", "checkpoint", "convert")},
        "run_dir": str(tmp_path / "branch"),
        "model": {"preset": "trilm-nano", "vocab_size": 512},
        "branch_from": str(parent / "state" / f"step-{START}"),
        **extra,
    }
    return TrainConfig.from_dict(data)


def test_a_conversion_branch_takes_the_recipe_and_peaks_at_its_parents_rate(tmp_path):
    parent = _parent(tmp_path / "floatlm")
    cfg = resolve_branch_from(_branch(parent, tmp_path))
    teacher = str(parent / "snapshots" / f"step-{START}")
    _assert_crossover(cfg, teacher)
    assert (
        cfg.optim.lr == 4e-3 and conversion_schedule(cfg, START).lr(START) == 4e-3
    )  # lr_scale 1: the parent's
    assert resolve_branch_from(TrainConfig.from_dict(cfg.to_dict())) == cfg  # a resume resolves the same
    plan = RunPlan(cfg, dp_size=1, tp_size=1).report()
    assert "peak 0.004, warmup 0 steps, cosine to 0 (the conversion's, from step 24)" in plan
    assert f"crossover: peak 1 × optim.lr, weight decay 0, distillation from {teacher}" in plan
    assert "AdamW moments kept" in plan

    quarter = resolve_branch_from(_branch(parent, tmp_path, convert={"lr_scale": 0.25}))
    assert conversion_schedule(quarter, START).lr(START) == pytest.approx(1e-3)

    written = _branch(parent, tmp_path, convert={"recipe": "as_written"})
    assert resolve_branch_from(written) == written  # optim.lr too: the check then refuses another rate


def test_a_branch_without_a_parent_snapshot_converts_without_a_teacher_and_says_so(tmp_path):
    parent = _parent(tmp_path / "floatlm", snapshot=False)
    cfg = resolve_branch_from(_branch(parent, tmp_path))
    assert not cfg.distill.enabled and cfg.schedule == CROSSOVER_SCHEDULE and cfg.optim.weight_decay == 0
    plan = RunPlan(cfg, dp_size=1, tp_size=1).report()
    missing = parent / "snapshots" / f"step-{START}"
    assert f"no distillation ({missing} is not a complete snapshot to distil from)" in plan


def test_a_branch_of_the_same_family_is_untouched(tmp_path):
    parent = _parent(tmp_path / "trilm", family="trilm")
    cfg = _branch(parent, tmp_path)
    assert resolve_branch_from(cfg) == cfg
