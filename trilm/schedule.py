"""Learning rate and weight decay as pure functions of the optimizer step: the one schedule of trilm.

Pretraining, post-hoc QAT and the pruning policy's optimizer all step through :class:`Schedule`. A pure
function of the step is what makes resume exact: a restarted run recomputes the same values instead of
restoring a scheduler object. Spectra's recipe is expressed as step-indexed events (LR drop, weight decay
off) that the trainer logs when they fire.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

from trilm.config import Config, require


@dataclasses.dataclass
class ScheduleConfig(Config):
    """Learning-rate shape and Spectra's step-indexed events (positions are fractions of the run).

    Spectra's TriLM loss drops visibly halfway through training; the authors attribute it to a peak-LR drop
    at ~½ and weight decay switched off at ~⅔ (spectra.md marks both [U]: reported, factors not published).
    """

    warmup: float = 0.01
    """Warmup length: a fraction of the run when < 1, else a number of steps."""
    decay: Literal["cosine", "linear", "constant"] = "cosine"
    lr_drop_at: float | None = None
    """Fraction of the run at which the learning rate is multiplied by ``lr_drop_factor`` (TriLM: 0.5)."""
    lr_drop_factor: float = 0.5
    weight_decay_off_at: float | None = None
    """Fraction of the run from which weight decay is 0 (TriLM: 2/3)."""

    def validate(self) -> None:
        require(self.warmup >= 0, f"warmup: must be >= 0, got {self.warmup}")
        for key in ("lr_drop_at", "weight_decay_off_at"):
            value = getattr(self, key)
            require(value is None or 0 < value < 1, f"{key}: must be a fraction in (0, 1), got {value}")
        require(0 < self.lr_drop_factor <= 1, f"lr_drop_factor: must be in (0, 1], got {self.lr_drop_factor}")


@dataclasses.dataclass(frozen=True)
class ScheduleEvent:
    step: int
    name: str
    detail: str


class Schedule:
    """LR(step) and weight decay(step) for a run of ``total_steps`` optimizer steps.

    ``peak_lr`` is reached at the end of warm-up; the decay ends at ``peak_lr · min_lr_ratio`` after the last
    step; ``weight_decay`` is the value before any weight-decay event.
    """

    def __init__(
        self,
        cfg: ScheduleConfig,
        total_steps: int,
        *,
        peak_lr: float,
        min_lr_ratio: float = 0.0,
        weight_decay: float = 0.0,
    ):
        self.cfg, self.total = cfg, int(total_steps)
        self.peak_lr, self.min_lr_ratio, self.peak_weight_decay = peak_lr, min_lr_ratio, weight_decay
        warm = cfg.warmup
        self.warmup_steps = round(warm * self.total) if warm < 1 else int(warm)
        self.lr_drop_step = self._at(cfg.lr_drop_at)
        self.wd_off_step = self._at(cfg.weight_decay_off_at)

    @classmethod
    def for_optimizer(cls, optim, cfg: ScheduleConfig, total_steps: int) -> Schedule:
        """The schedule of a run whose optimizer settings (``lr``, ``min_lr_ratio``, ``weight_decay``) are
        ``optim`` (a :class:`trilm.train.config.OptimConfig`)."""
        return cls(
            cfg,
            total_steps,
            peak_lr=optim.lr,
            min_lr_ratio=optim.min_lr_ratio,
            weight_decay=optim.weight_decay,
        )

    def _at(self, fraction: float | None) -> int | None:
        return None if fraction is None else round(fraction * self.total)

    def base_lr(self, step: int) -> float:
        peak, floor = self.peak_lr, self.peak_lr * self.min_lr_ratio
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
        return self.peak_weight_decay

    def events(self) -> list[ScheduleEvent]:
        out = []
        if self.warmup_steps:
            out.append(ScheduleEvent(self.warmup_steps, "warmup_end", f"peak lr {self.peak_lr:g}"))
        if self.lr_drop_step is not None:
            out.append(
                ScheduleEvent(self.lr_drop_step, "lr_drop", f"lr × {self.cfg.lr_drop_factor:g} from here on")
            )
        if self.wd_off_step is not None:
            out.append(ScheduleEvent(self.wd_off_step, "weight_decay_off", "weight decay 0 from here on"))
        return sorted(out, key=lambda e: e.step)

    def events_at(self, step: int) -> list[ScheduleEvent]:
        return [e for e in self.events() if e.step == step]
