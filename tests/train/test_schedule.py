import math

import pytest

from trilm.config import ConfigError
from trilm.schedule import Schedule, ScheduleConfig
from trilm.train.config import CheckpointConfig, OptimConfig, TrainConfig
from trilm.train.save_steps import snapshot_steps, state_steps


def test_spectra_events_fire_at_their_steps():
    sched = Schedule.for_optimizer(
        OptimConfig(lr=1e-3, weight_decay=0.1, min_lr_ratio=0.1),
        ScheduleConfig(
            warmup=10, decay="cosine", lr_drop_at=0.5, lr_drop_factor=0.5, weight_decay_off_at=2 / 3
        ),
        total_steps=300,
    )
    assert [(e.step, e.name) for e in sched.events()] == [
        (10, "warmup_end"),
        (150, "lr_drop"),
        (200, "weight_decay_off"),
    ]
    assert sched.events_at(150)[0].name == "lr_drop" and sched.events_at(149) == []
    assert sched.lr(149) == pytest.approx(sched.base_lr(149))
    assert sched.lr(150) == pytest.approx(0.5 * sched.base_lr(150))
    assert sched.weight_decay(199) == 0.1 and sched.weight_decay(200) == 0.0


def test_lr_shapes():
    optim = OptimConfig(lr=1.0, min_lr_ratio=0.1)
    cos = Schedule.for_optimizer(optim, ScheduleConfig(warmup=0.1, decay="cosine"), 100)
    assert cos.warmup_steps == 10
    assert cos.lr(0) == pytest.approx(0.1) and cos.lr(9) == pytest.approx(1.0)
    assert cos.lr(10) == pytest.approx(1.0)
    assert cos.lr(55) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert cos.lr(100) == pytest.approx(0.1)
    lin = Schedule.for_optimizer(optim, ScheduleConfig(warmup=0, decay="linear"), 100)
    assert lin.lr(50) == pytest.approx(0.55)
    const = Schedule.for_optimizer(optim, ScheduleConfig(warmup=0, decay="constant"), 100)
    assert const.lr(99) == 1.0


def test_checkpoint_steps_are_log_spaced_every_k_and_final():
    cfg = CheckpointConfig(snapshot_every=1000, log_spaced=True, log_spaced_until=512, state_every=500)
    steps = snapshot_steps(cfg, 2500)
    assert steps == [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000, 2000, 2500]
    assert state_steps(cfg, 2500) == [500, 1000, 1500, 2000, 2500]
    assert snapshot_steps(CheckpointConfig(snapshot_every=3, log_spaced=False), 7) == [0, 3, 6, 7]


def test_train_config_errors():
    with pytest.raises(ConfigError, match="batch_tokens: 1000 is not a multiple of the sequence length 128"):
        TrainConfig.from_dict({"model": {"preset": "trilm-nano"}, "batch_tokens": 1000})
    with pytest.raises(ConfigError, match="tokens: 10 is less than one batch"):
        TrainConfig.from_dict({"model": {"preset": "trilm-nano"}, "batch_tokens": 1280, "tokens": 10})
    with pytest.raises(ConfigError, match=r"model.preset: unknown preset size"):
        TrainConfig.from_dict({"model": {"preset": "trilm-7b"}})
    with pytest.raises(ConfigError, match="lr_drop_at: must be a fraction"):
        TrainConfig.from_dict({"schedule": {"lr_drop_at": 2}})
    with pytest.raises(ConfigError, match="tensor_parallel=3 does not divide model.heads=4"):
        TrainConfig.from_dict({"model": {"preset": "trilm-nano"}, "parallel": {"tensor_parallel": 3}})
    cfg = TrainConfig.from_dict({"model": {"preset": "trilm-nano"}, "batch_tokens": 1280, "micro_batch": 5})
    assert cfg.global_batch == 10 and cfg.accumulation(1) == 2 and cfg.accumulation(2) == 1
    with pytest.raises(ConfigError, match="do not split into data-parallel size 4"):
        cfg.accumulation(4)
