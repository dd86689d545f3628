"""Turning a float model into a TriLM or BiLM by training it further: the recipe's levers.

A run *converts* when it starts from a model of another family: ``init_from`` a FloatLM snapshot (or an
imported Llama) with ``model: {family: trilm}``, or ``branch_from`` a FloatLM run's resumable state — a
*conversion branch*, which starts from the float run's weights, optimizer moments and data position at a
step N (for example where its WSD cooldown starts: Apple's compute-optimal QAT fuses the two) and trains
the rest of the run's tokens as a TriLM or BiLM. The conversion is a phase of its own: its ``schedule``
(warm-up, decay, events) is laid over its steps, N to the end, not over the float run's
(:class:`trilm.schedule.Schedule`'s ``start``); for ``init_from`` the phase is the whole run.

The levers (``TrainConfig.convert``) are what the anchors vary (docs/training.md, "Ternarizing a float
model"): the peak rate relative to the float run's (ParetoQ's QAT rate is about 1/25 of its pretraining
rate), whether the AdamW moments are kept (Nielsen et al. 2025 keep them) and a λ ramp that phases the
quantization in (Hugging Face's 1.58-bit fine-tuning). Warm-up 0 and the distillation temperature are the
``schedule.warmup`` and ``distill.temperature`` of the same run. The defaults (the run's own rate, no
ramp, a branch's moments kept) make a run without a ``convert`` section train as the conversions of
docs/results/ternarize/ did; they are fields so that a study's winning recipe can become the default
(docs/training.md says where each value comes from).
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Literal

import torch

from trilm.config import Config, require
from trilm.schedule import Schedule

if TYPE_CHECKING:
    from trilm.train.config import TrainConfig


@dataclasses.dataclass
class ConvertConfig(Config):
    """The recipe of a conversion (a run that starts from a model of another family); a run that converts
    nothing refuses any value but the defaults."""

    lr_scale: float = 1.0
    """The conversion's peak rate as a multiple of ``optim.lr``. A conversion branch must keep its parent's
    ``optim.lr`` (checked), so this is the rate relative to the float run's; with ``init_from`` it scales
    the run's own ``optim.lr`` (a snapshot does not record the rate it was trained at)."""
    optimizer: Literal["keep", "reset"] | None = None
    """A conversion branch's AdamW moments: ``keep`` the float run's (the default for a branch) or
    ``reset`` them to zero, as a fresh optimizer has them. ``init_from`` starts from weights alone, so its
    moments always start at zero: ``keep`` is refused there, and null means the default of either."""
    ramp: float = 0.0
    """Share of the conversion's steps over which λ rises from 0 to 1 in W + λ·(W̃ − W) (the weights the
    quantized linears use; :func:`trilm.model.quant.set_ramp`); 0 = no ramp, W̃ from the first step."""
    ramp_shape: Literal["linear", "sigmoid"] = "linear"
    """``linear``: λ = s/R at the phase's step s of R ramp steps; ``sigmoid``: a logistic curve in s/R of
    steepness ``ramp_steepness``, shifted and scaled to run from exactly 0 to exactly 1."""
    ramp_steepness: float = 10.0
    """k of the sigmoid ramp, σ(k·(s/R − ½)) before rescaling: larger is closer to a step at R/2."""

    def validate(self) -> None:
        require(self.lr_scale > 0, f"lr_scale: must be > 0, got {self.lr_scale}")
        require(0 <= self.ramp < 1, f"ramp: a share of the conversion's steps in [0, 1), got {self.ramp}")
        require(self.ramp_steepness > 0, f"ramp_steepness: must be > 0, got {self.ramp_steepness}")

    @property
    def is_default(self) -> bool:
        return self == ConvertConfig()


def ramp_lambda(cfg: ConvertConfig, step: int, phase_steps: int) -> float | None:
    """λ at the conversion's ``step``-th step (0-based) of ``phase_steps``; None once the ramp is over
    (and without one): the quantized weights themselves."""
    ramp_steps = round(cfg.ramp * phase_steps)
    if ramp_steps == 0 or step >= ramp_steps:
        return None
    p = step / ramp_steps
    if cfg.ramp_shape == "linear":
        return p
    k = cfg.ramp_steepness

    def sigmoid(x: float) -> float:
        return 1.0 / (1.0 + math.exp(-k * (x - 0.5)))

    return (sigmoid(p) - sigmoid(0.0)) / (sigmoid(1.0) - sigmoid(0.0))


def conversion_schedule(cfg: TrainConfig, start: int) -> Schedule:
    """The schedule of a conversion phase that begins at step ``start`` (0: ``init_from``), peaking at
    ``optim.lr · convert.lr_scale``."""
    return Schedule.for_optimizer(
        cfg.optim, cfg.schedule, cfg.steps, start=start, lr_scale=cfg.convert.lr_scale
    )


def reset_moments(engine) -> int:
    """Zero the AdamW state of ``engine`` (moments and step count: the state a fresh optimizer starts
    from, whose first update is then exactly its bias-corrected first step); returns the parameters
    touched. Works on the torch optimizer under DeepSpeed's wrappers (ZeRO partitions, bf16 masters)."""
    inner = engine.optimizer
    while not isinstance(inner, torch.optim.Optimizer) and hasattr(inner, "optimizer"):
        inner = inner.optimizer
    count = 0
    for state in inner.state.values():
        for key, value in state.items():
            if torch.is_tensor(value):
                value.zero_()
            elif key == "step":
                state[key] = 0
        count += 1
    return count
