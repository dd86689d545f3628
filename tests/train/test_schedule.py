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


def test_wsd_is_warmup_constant_then_cooldown():
    optim = OptimConfig(lr=1.0, min_lr_ratio=0.0, weight_decay=0.1)
    lin = Schedule.for_optimizer(
        optim, ScheduleConfig(kind="wsd", warmup=10, cooldown=0.2, cooldown_shape="linear"), 100
    )
    assert (lin.warmup_steps, lin.cooldown_start, lin.cooldown_steps) == (10, 80, 20)
    assert lin.lr(9) == pytest.approx(1.0) and lin.lr(10) == 1.0 and lin.lr(79) == 1.0
    assert lin.lr(80) == 1.0 and lin.lr(90) == pytest.approx(0.5) and lin.lr(99) == pytest.approx(0.05)
    sqrt = Schedule.for_optimizer(optim, ScheduleConfig(kind="wsd", warmup=10, cooldown=20), 100)
    assert sqrt.cooldown_start == 80
    assert sqrt.lr(85) == pytest.approx(1 - math.sqrt(0.25))
    assert sqrt.lr(99) == pytest.approx(1 - math.sqrt(0.95))
    floor = Schedule.for_optimizer(
        OptimConfig(lr=1.0, min_lr_ratio=0.1), ScheduleConfig(kind="wsd", warmup=0, cooldown=0.5), 10
    )
    assert floor.lr(5) == 1.0 and floor.lr(10) == pytest.approx(0.1)
    assert [e.name for e in sqrt.events()] == ["warmup_end", "cooldown_start"]


def test_wsd_places_spectra_events_in_the_cooldown():
    """Under WSD the LR drop and weight decay off are fractions of the cooldown, so they never fall before a
    branch point; TriLM's WSD recipe turns weight decay off where the cooldown starts."""
    optim = OptimConfig(lr=1.0, min_lr_ratio=0.0, weight_decay=0.1)
    cfg = ScheduleConfig(
        kind="wsd", warmup=10, cooldown=0.2, weight_decay_off_at=0.0, lr_drop_at=0.5, lr_drop_factor=0.5
    )
    sched = Schedule.for_optimizer(optim, cfg, 100)
    assert sched.wd_off_step == 80 and sched.lr_drop_step == 90
    assert sched.weight_decay(79) == 0.1 and sched.weight_decay(80) == 0.0
    assert sched.lr(90) == pytest.approx(0.5 * (1 - math.sqrt(0.5)))
    assert [(e.step, e.name) for e in sched.events()] == [
        (10, "warmup_end"),
        (80, "cooldown_start"),
        (80, "weight_decay_off"),
        (90, "lr_drop"),
    ]
    # a fraction of the run would be read as one of the cooldown: 0 is its start, 1 is refused
    with pytest.raises(ConfigError, match="under kind wsd a fraction of the cooldown"):
        ScheduleConfig(kind="wsd", weight_decay_off_at=1.0)
    with pytest.raises(ConfigError, match="must be a fraction in"):
        ScheduleConfig(kind="decay", weight_decay_off_at=0.0)


def test_wsd_rate_before_the_cooldown_does_not_depend_on_the_run_length():
    """What makes a branch exact: a long WSD run and a shorter one agree on every step before the shorter
    one's cooldown, when the warm-up is given in steps (a fraction of the run would move it)."""
    optim = OptimConfig(lr=2e-3, min_lr_ratio=0.0, weight_decay=0.1)
    long = Schedule.for_optimizer(optim, ScheduleConfig(kind="wsd", warmup=16, cooldown=0.2), 400)
    short = Schedule.for_optimizer(optim, ScheduleConfig(kind="wsd", warmup=16, cooldown=0.2), 100)
    assert long.first_difference(short, short.cooldown_start) is None
    assert long.first_difference(short, 100)[0] == short.cooldown_start + 1
    frac = Schedule.for_optimizer(optim, ScheduleConfig(kind="wsd", warmup=0.1, cooldown=0.2), 100)
    assert long.first_difference(frac, 80)[0] == 0


def test_wsd_that_does_not_fit_is_refused():
    with pytest.raises(ConfigError, match="warm-up must end before the cooldown starts"):
        TrainConfig.from_dict(
            {
                "model": {"preset": "trilm-nano"},
                "batch_tokens": 1280,
                "tokens": 1280 * 10,
                "schedule": {"kind": "wsd", "warmup": 9, "cooldown": 0.2},
            }
        )


def test_kept_branch_points_save_states_and_snapshots():
    cfg = CheckpointConfig(snapshot_every=100, log_spaced=False, state_every=50, keep_states_at=[33, 77, 500])
    assert state_steps(cfg, 200) == [33, 50, 77, 100, 150, 200]
    assert snapshot_steps(cfg, 200) == [0, 33, 77, 100, 200]
    with pytest.raises(ConfigError, match="keep_states_at: steps must be integers >= 1"):
        CheckpointConfig(keep_states_at=[0])
