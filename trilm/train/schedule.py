"""Learning rate, weight decay and checkpoint steps as pure functions of the step.

A pure function of the step is what makes resume exact: a restarted run recomputes the same values instead
of restoring a scheduler object. Spectra's recipe is expressed as step-indexed events (LR drop, weight decay
off) that the trainer logs when they fire.
"""

from __future__ import annotations

import dataclasses
import math

from trilm.train.config import CheckpointConfig, OptimConfig, ScheduleConfig


@dataclasses.dataclass(frozen=True)
class ScheduleEvent:
    step: int
    name: str
    detail: str


class Schedule:
    """LR(step) and weight decay(step) for a run of ``total_steps`` optimizer steps."""

    def __init__(self, optim: OptimConfig, cfg: ScheduleConfig, total_steps: int):
        self.optim, self.cfg, self.total = optim, cfg, int(total_steps)
        warm = cfg.warmup
        self.warmup_steps = round(warm * self.total) if warm < 1 else int(warm)
        self.lr_drop_step = self._at(cfg.lr_drop_at)
        self.wd_off_step = self._at(cfg.weight_decay_off_at)

    def _at(self, fraction: float | None) -> int | None:
        return None if fraction is None else round(fraction * self.total)

    def base_lr(self, step: int) -> float:
        peak, floor = self.optim.lr, self.optim.lr * self.optim.min_lr_ratio
        if step < self.warmup_steps:
            return peak * (step + 1) / self.warmup_steps
        span = max(self.total - self.warmup_steps, 1)
        progress = min(max(step - self.warmup_steps, 0) / span, 1.0)
        if self.cfg.decay == "constant":
            return peak
        if self.cfg.decay == "linear":
            return floor + (peak - floor) * (1 - progress)
        return floor + (peak - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    def lr(self, step: int) -> float:
        """Learning rate used by the update that ends step ``step`` (0-based)."""
        factor = self.cfg.lr_drop_factor if self.lr_drop_step is not None and step >= self.lr_drop_step else 1
        return self.base_lr(step) * factor

    def weight_decay(self, step: int) -> float:
        if self.wd_off_step is not None and step >= self.wd_off_step:
            return 0.0
        return self.optim.weight_decay

    def events(self) -> list[ScheduleEvent]:
        out = []
        if self.warmup_steps:
            out.append(ScheduleEvent(self.warmup_steps, "warmup_end", f"peak lr {self.optim.lr:g}"))
        if self.lr_drop_step is not None:
            out.append(
                ScheduleEvent(self.lr_drop_step, "lr_drop", f"lr × {self.cfg.lr_drop_factor:g} from here on")
            )
        if self.wd_off_step is not None:
            out.append(ScheduleEvent(self.wd_off_step, "weight_decay_off", "weight decay 0 from here on"))
        return sorted(out, key=lambda e: e.step)

    def events_at(self, step: int) -> list[ScheduleEvent]:
        return [e for e in self.events() if e.step == step]


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
    return sorted(steps)


def state_steps(cfg: CheckpointConfig, total_steps: int) -> list[int]:
    """Steps that save a resumable training state (every ``state_every`` and the last)."""
    return sorted({*range(cfg.state_every, total_steps + 1, cfg.state_every), total_steps})
