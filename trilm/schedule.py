"""Learning rate and weight decay as pure functions of the optimizer step: the one schedule of trilm.

Pretraining, post-hoc QAT and the pruning policy's optimizer all step through :class:`Schedule`. A pure
function of the step is what makes resume exact: a restarted run recomputes the same values instead of
restoring a scheduler object. Two kinds:

- ``decay`` (the Spectra recipe, the default): warm-up, then a cosine/linear/constant decay over the whole
  run, with Spectra's step-indexed events (LR drop, weight decay off) at fractions of the run.
- ``wsd`` (warmup-stable-decay, Hägele et al. 2024, MiniCPM): warm-up, the constant peak rate, then a cooldown
  over the last ``cooldown`` of the run (linear or 1−sqrt). Up to the cooldown the rate does not depend on
  the run's length, so one long run's state at step s is the state of *every* shorter WSD run at step s:
  a cooldown branch from it (``trilm suite cooldown``) is exactly a run trained to that shorter length.

Under ``wsd`` Spectra's two events are placed in the cooldown, as fractions of it (0 = its first step): a
fraction of the *run* would put them at a different step in every branch, before the branch point, and no
saved state could start those branches. TriLM's and BiLM's WSD recipe turns weight decay off where the
cooldown starts (``weight_decay_off_at: 0``) and has no separate rate drop: the cooldown is the drop
(docs/training.md, "Warmup-stable-decay").
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

from trilm.config import Config, ConfigError, require


@dataclasses.dataclass
class ScheduleConfig(Config):
    """Learning-rate shape and Spectra's step-indexed events.

    Spectra's TriLM loss drops visibly halfway through training; the authors attribute it to a peak-LR drop
    at ~½ and weight decay switched off at ~⅔ (both [U]: reported, factors not published; our values are in
    docs/references.md#our-choices-for-the-unconfirmed-values).
    """

    kind: Literal["decay", "wsd"] = "decay"
    """``decay``: warm-up then ``decay`` over the whole run (Spectra). ``wsd``: warm-up, constant peak, then a
    cooldown over the last ``cooldown`` of the run in ``cooldown_shape``."""
    warmup: float = 0.01
    """Warmup length: a fraction of the run when < 1, else a number of steps. WSD runs that are branched
    give it in steps, so every branch warms up like its parent."""
    decay: Literal["cosine", "linear", "constant"] = "cosine"
    """Shape of the decay after warm-up (kind ``decay`` only)."""
    cooldown: float = 0.2
    """Kind ``wsd``: the cooldown's length, a fraction of the run when < 1, else a number of steps."""
    cooldown_shape: Literal["linear", "1-sqrt"] = "1-sqrt"
    """Kind ``wsd``: ``linear`` (peak → floor linearly) or ``1-sqrt`` (floor + (peak − floor)·(1 − √p), the
    better of the two in Hägele et al. 2024)."""
    lr_drop_at: float | None = None
    """Where the learning rate is multiplied by ``lr_drop_factor``: a fraction of the run (kind ``decay``;
    TriLM: 0.5) or of the cooldown (kind ``wsd``; 0 = where it starts)."""
    lr_drop_factor: float = 0.5
    weight_decay_off_at: float | None = None
    """From where weight decay is 0: a fraction of the run (kind ``decay``; TriLM: 2/3) or of the cooldown
    (kind ``wsd``; TriLM and BiLM: 0, the cooldown's start)."""

    def validate(self) -> None:
        require(self.warmup >= 0, f"warmup: must be >= 0, got {self.warmup}")
        require(self.cooldown > 0, f"cooldown: must be > 0, got {self.cooldown}")
        for key in ("lr_drop_at", "weight_decay_off_at"):
            value = getattr(self, key)
            if self.kind == "wsd":
                require(
                    value is None or 0 <= value < 1,
                    f"{key}: under kind wsd a fraction of the cooldown in [0, 1), got {value}",
                )
            else:
                require(value is None or 0 < value < 1, f"{key}: must be a fraction in (0, 1), got {value}")
        require(0 < self.lr_drop_factor <= 1, f"lr_drop_factor: must be in (0, 1], got {self.lr_drop_factor}")


@dataclasses.dataclass(frozen=True)
class ScheduleEvent:
    step: int
    name: str
    detail: str


def _steps(value: float, total: int) -> int:
    """A length given as a fraction of the run (< 1) or as steps (≥ 1)."""
    return round(value * total) if value < 1 else int(value)


class Schedule:
    """LR(step) and weight decay(step) for the optimizer steps ``start`` … ``total_steps − 1`` of a run.

    ``peak_lr`` is reached at the end of warm-up; the decay (or the WSD cooldown) ends at
    ``peak_lr · min_lr_ratio`` after the last step; ``weight_decay`` is the value before any weight-decay
    event. ``start`` > 0 is a phase that begins at a branch point (a float run's state turned into a
    TriLM: :mod:`trilm.train.convert`): warm-up, decay and events are laid over the phase's own
    ``total_steps − start`` steps, while steps keep counting from the run's beginning (the data position
    and the checkpoints' step numbers are the run's). Fractions (warm-up, cooldown, events) are of the
    phase. Raises :class:`~trilm.config.ConfigError` when warm-up and cooldown do not fit in it.
    """

    def __init__(
        self,
        cfg: ScheduleConfig,
        total_steps: int,
        *,
        peak_lr: float,
        min_lr_ratio: float = 0.0,
        weight_decay: float = 0.0,
        start: int = 0,
    ):
        self.cfg, self.total, self.start = cfg, int(total_steps), int(start)
        if self.start < 0 or (self.start and self.start >= self.total):
            raise ConfigError(f"schedule: a phase starting at step {start} is not inside {total_steps} steps")
        self.peak_lr, self.min_lr_ratio, self.peak_weight_decay = peak_lr, min_lr_ratio, weight_decay
        length = self.total - self.start
        self.warmup_steps = _steps(cfg.warmup, length)
        self.cooldown_steps = _steps(cfg.cooldown, length) if cfg.kind == "wsd" else 0
        self.cooldown_start = self.total - self.cooldown_steps if cfg.kind == "wsd" else None
        if self.cooldown_start is not None and not (
            self.cooldown_steps >= 1 and self.start + self.warmup_steps <= self.cooldown_start
        ):
            raise ConfigError(
                f"schedule: {self.warmup_steps} warm-up and {self.cooldown_steps} cooldown steps do not fit"
                f" in a {'phase' if self.start else 'run'} of {length} steps (warm-up must end before the"
                " cooldown starts)"
            )
        self.lr_drop_step = self._at(cfg.lr_drop_at)
        self.wd_off_step = self._at(cfg.weight_decay_off_at)

    @classmethod
    def for_optimizer(
        cls, optim, cfg: ScheduleConfig, total_steps: int, *, start: int = 0, lr_scale: float = 1.0
    ) -> Schedule:
        """The schedule of a run whose optimizer settings (``lr``, ``min_lr_ratio``, ``weight_decay``) are
        ``optim`` (a :class:`trilm.train.config.OptimConfig`); ``start`` and ``lr_scale`` (the peak as a
        multiple of ``optim.lr``) place and scale a conversion phase."""
        return cls(
            cfg,
            total_steps,
            peak_lr=optim.lr * lr_scale,
            min_lr_ratio=optim.min_lr_ratio,
            weight_decay=optim.weight_decay,
            start=start,
        )

    def _at(self, fraction: float | None) -> int | None:
        if fraction is None:
            return None
        if self.cooldown_start is not None:
            return self.cooldown_start + round(fraction * self.cooldown_steps)
        return self.start + round(fraction * (self.total - self.start))

    def base_lr(self, step: int) -> float:
        peak, floor = self.peak_lr, self.peak_lr * self.min_lr_ratio
        if step < self.start:
            raise ValueError(f"step {step} is before this schedule's phase, which starts at {self.start}")
        if step < self.start + self.warmup_steps:
            return peak * (step - self.start + 1) / self.warmup_steps
        if self.cooldown_start is not None:
            if step < self.cooldown_start:
                return peak
            progress = min((step - self.cooldown_start) / self.cooldown_steps, 1.0)
            shape = progress if self.cfg.cooldown_shape == "linear" else math.sqrt(progress)
            return floor + (peak - floor) * (1 - shape)
        span = max(self.total - self.start - self.warmup_steps, 1)
        progress = min(max(step - self.start - self.warmup_steps, 0) / span, 1.0)
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
            end = self.start + self.warmup_steps
            out.append(ScheduleEvent(end, "warmup_end", f"peak lr {self.peak_lr:g}"))
        if self.cooldown_start is not None:
            out.append(
                ScheduleEvent(
                    self.cooldown_start,
                    "cooldown_start",
                    f"{self.cfg.cooldown_shape} cooldown over {self.cooldown_steps} steps to"
                    f" {self.peak_lr * self.min_lr_ratio:g}",
                )
            )
        if self.lr_drop_step is not None:
            out.append(
                ScheduleEvent(self.lr_drop_step, "lr_drop", f"lr × {self.cfg.lr_drop_factor:g} from here on")
            )
        if self.wd_off_step is not None:
            out.append(ScheduleEvent(self.wd_off_step, "weight_decay_off", "weight decay 0 from here on"))
        return sorted(out, key=lambda e: e.step)

    def events_at(self, step: int) -> list[ScheduleEvent]:
        return [e for e in self.events() if e.step == step]

    def first_difference(self, other: Schedule, steps: int) -> tuple[int, str] | None:
        """The first step below ``steps`` where the two schedules set another rate or weight decay, with
        both values; None when they agree on every step before ``steps`` (what a branch point needs)."""
        for step in range(steps):
            a, b = (self.lr(step), self.weight_decay(step)), (other.lr(step), other.weight_decay(step))
            if not (math.isclose(a[0], b[0], rel_tol=1e-12, abs_tol=0.0) and a[1] == b[1]):
                return step, f"lr {a[0]:g} vs {b[0]:g}, weight decay {a[1]:g} vs {b[1]:g}"
        return None


@dataclasses.dataclass(frozen=True)
class CooldownBranch:
    """Where a cooldown branch of a WSD run sits: it trains ``steps`` steps in all, cooling down over the last
    ``cooldown_steps`` of them, so it starts from the parent's state at ``start``."""

    at: float
    steps: int
    cooldown_steps: int

    @property
    def start(self) -> int:
        return self.steps - self.cooldown_steps


def cooldown_branch(parent_steps: int, at: float, fraction: float) -> CooldownBranch:
    """The branch that ends at ``at`` × the parent's length with a cooldown of ``fraction`` of its own length,
    as a fresh WSD run of that length with ``cooldown: fraction`` would have it."""
    if not 0 < at <= 1:
        raise ConfigError(f"at: a branch ends at a fraction of its parent's length in (0, 1], got {at}")
    if not 0 < fraction < 1:
        raise ConfigError(f"fraction: the cooldown is a fraction of the branch in (0, 1), got {fraction}")
    steps = round(at * parent_steps)
    cool = round(fraction * steps)
    if steps < 2 or cool < 1:
        raise ConfigError(
            f"at {at:g}: a branch of {steps} step(s) of a {parent_steps}-step run has no room for a"
            f" {fraction:g} cooldown"
        )
    return CooldownBranch(at, steps, cool)
