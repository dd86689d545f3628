"""Turning a float model into a TriLM or BiLM by training it further: the recipe and its levers.

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
quantization in (Hugging Face's 1.58-bit fine-tuning). Warm-up, weight decay and distillation are the
``schedule``, ``optim`` and ``distill`` of the same run.

``convert.recipe: crossover`` (the default) fills what a conversion's config leaves at its defaults with
the recipe the crossover study chose (:func:`apply_recipe`; docs/results/ternarize/README.md, "The
conversion recipe", and its crossover.png): the source's peak rate, no warm-up, cosine to 0, no weight
decay and logit distillation from the source, plus the defaults of ``convert`` itself (no ramp, a
branch's moments kept, where resetting them measured worse). It is applied where the source's family
becomes known — :func:`trilm.train.init_from.resolve_init_from` for ``init_from``,
:func:`trilm.train.state.resolve_branch_from` for ``branch_from``, ``trilm suite convert``'s branches —
so the resolved config, the dry run's plan and the trainer all hold the values trained with, and a
resumed run resolves to the same ones. ``as_written`` trains the config as it is.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch

from trilm.config import Config, require
from trilm.schedule import Schedule, ScheduleConfig
from trilm.store.layout import SNAPSHOTS_DIR

if TYPE_CHECKING:
    from trilm.train.config import TrainConfig

CROSSOVER_SCHEDULE = ScheduleConfig(kind="decay", decay="cosine", warmup=0)
"""The crossover recipe's schedule, laid over the conversion's steps: the peak from its first step (no
warm-up), then cosine (to 0, with :data:`CROSSOVER_OPTIM`'s ``min_lr_ratio``)."""
CROSSOVER_OPTIM: dict[str, Any] = {"weight_decay": 0.0, "min_lr_ratio": 0.0}
"""The crossover recipe's ``optim`` keys: no weight decay, the cosine ending at 0 (ParetoQ's)."""
CROSSOVER_DISTILL: dict[str, Any] = {"weight": 0.5, "temperature": 1.0}
"""The crossover recipe's distillation from the source: T = 1 (T = 5 gained nothing), weight ½."""


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
    recipe: Literal["crossover", "as_written"] = "crossover"
    """``crossover``: the keys of ``schedule``, ``optim`` and ``distill`` that the config leaves at their
    defaults take the crossover study's values (:func:`apply_recipe`), so a conversion with nothing else
    set trains as the study's best; ``as_written``: the config exactly as written (a value equal to a
    default is indistinguishable from one left out, so this is how a conversion keeps a default)."""

    def validate(self) -> None:
        require(self.lr_scale > 0, f"lr_scale: must be > 0, got {self.lr_scale}")
        require(0 <= self.ramp < 1, f"ramp: a share of the conversion's steps in [0, 1), got {self.ramp}")
        require(self.ramp_steepness > 0, f"ramp_steepness: must be > 0, got {self.ramp_steepness}")

    @property
    def is_default(self) -> bool:
        return self == ConvertConfig()


def apply_recipe(cfg: TrainConfig, teacher: str = "", source_lr: float | None = None) -> TrainConfig:
    """``cfg``, a run that converts, with ``convert.recipe``'s values in the parts it leaves at their
    defaults (``as_written``: ``cfg`` itself).

    ``crossover`` replaces a ``schedule`` equal to ``ScheduleConfig()`` by :data:`CROSSOVER_SCHEDULE`, an
    ``optim.weight_decay`` or ``optim.min_lr_ratio`` at its default by :data:`CROSSOVER_OPTIM`'s, and
    without a ``distill.teacher`` distils from ``teacher`` (the source: the ``init_from`` snapshot, a
    branch's parent snapshot at the branch point; empty: none to distil from) with
    :data:`CROSSOVER_DISTILL`'s weight and temperature where those are at their defaults. ``source_lr``,
    the source run's ``optim.lr`` where it is known (a branch's parent), replaces an ``optim.lr`` at its
    default: with ``lr_scale`` 1 the conversion then peaks at the source's rate, the ratio the study
    chose. Applied to its own result it changes nothing (what it fills is off the defaults, or the value
    it would fill again), so a resumed run, which resolves its config anew, gets the config it saved."""
    if cfg.convert.recipe != "crossover":
        return cfg
    changes: dict[str, Any] = {}
    if cfg.schedule == ScheduleConfig():
        changes["schedule"] = CROSSOVER_SCHEDULE
    optim_default = type(cfg.optim)()
    optim = _at_default(cfg.optim, optim_default, CROSSOVER_OPTIM)
    if source_lr is not None and cfg.optim.lr == optim_default.lr:
        optim["lr"] = source_lr
    if optim:
        changes["optim"] = cfg.optim.replace(**optim)
    if teacher and not cfg.distill.enabled:
        distill = _at_default(cfg.distill, type(cfg.distill)(), CROSSOVER_DISTILL)
        changes["distill"] = cfg.distill.replace(teacher=teacher, **distill)
    return cfg.replace(**changes) if changes else cfg


def _at_default(section: Config, default: Config, values: dict[str, Any]) -> dict[str, Any]:
    """The keys of ``values`` whose value in ``section`` is still ``default``'s, with ``values``'s."""
    return {k: v for k, v in values.items() if getattr(section, k) == getattr(default, k)}


def branch_teacher(branch_from: str) -> Path:
    """Where a conversion branch's source model lies: the parent's snapshot at the branch point
    (``PARENT/snapshots/step-N`` beside ``PARENT/state/step-N``), written with the state when the step is
    one of the parent's ``checkpoint.keep_states_at`` or a snapshot step."""
    state = Path(branch_from.rstrip("/"))
    return state.parent.parent / SNAPSHOTS_DIR / state.name


def describe_recipe(cfg: TrainConfig) -> str:
    """One line on the recipe a conversion trains with (the dry run's plan, the trainer's ``conversion``
    event): its name and the values of ``cfg`` (resolved), naming the source the recipe would distil from
    (the ``init_from`` snapshot, a branch's parent snapshot) when it is missing."""
    c, o, d = cfg.convert, cfg.optim, cfg.distill
    wanted_teacher = str(branch_teacher(cfg.branch_from)) if cfg.branch_from else cfg.init_from
    if d.enabled:
        distill = f"distillation from {d.teacher} at T {d.temperature:g} (weight {d.weight:g})"
    elif c.recipe == "crossover" and wanted_teacher:
        distill = f"no distillation ({wanted_teacher} is not a complete snapshot to distil from)"
    else:
        distill = "no distillation"
    moments = c.optimizer or ("keep" if cfg.branch_from else "reset")
    ramp = f"λ ramp over {c.ramp:g} of the steps ({c.ramp_shape})" if c.ramp else "no ramp"
    return (
        f"{c.recipe}: peak {c.lr_scale:g} × optim.lr, weight decay {o.weight_decay:g}, {distill}, "
        f"AdamW moments {'kept' if moments == 'keep' else 'from zero'}, {ramp}"
    )


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
