"""Which optimizer steps write a model snapshot and which a resumable state: pure functions of the step,
so a resumed run saves exactly where an uninterrupted one would."""

from __future__ import annotations

from trilm.train.config import CheckpointConfig


def snapshot_steps(cfg: CheckpointConfig, total_steps: int) -> list[int]:
    """Steps (optimizer updates done) that get a model snapshot: log-spaced early, every K, and the last."""
    steps = set(range(0, total_steps + 1, cfg.snapshot_every))
    if cfg.log_spaced:
        steps.add(0)
        k = 1
        while k <= min(cfg.log_spaced_until, total_steps):
            steps.add(k)
            k *= 2
    steps.add(total_steps)
    steps.update(s for s in cfg.keep_states_at if s <= total_steps)
    return sorted(steps)


def state_steps(cfg: CheckpointConfig, total_steps: int) -> list[int]:
    """Steps that save a resumable state (every ``state_every``, the kept branch points, and the last)."""
    kept = {s for s in cfg.keep_states_at if s <= total_steps}
    return sorted({*range(cfg.state_every, total_steps + 1, cfg.state_every), *kept, total_steps})
