"""Resumable training state: writing it, choosing which one to resume from, and loading it.

A state is ``run_dir/state/step-N/``: DeepSpeed's engine files (model, and optimizer partitions under
ZeRO), ``trainer_state.json`` (step, tokens, data position, counters, the DP/TP layout it was written at)
and one RNG file per rank, plus the ``COMPLETE`` marker with the manifest of every file.

Resume takes the newest state whose files all match their manifest; a newer one that does not (truncated,
altered, missing files, unreadable JSON) is skipped with a warning that names the bad file, and the next
older one is used. A state written under ZeRO-1/2 at another data-parallel size is converted to
DeepSpeed's universal checkpoint first (:mod:`trilm.train.reshard`).
"""

from __future__ import annotations

import dataclasses
import json
import random
import shutil
import warnings
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from trilm.config import ConfigError
from trilm.model.spec import canonical_shapes
from trilm.parallel import ParallelInfo
from trilm.schedule import Schedule
from trilm.store.integrity import complete_steps, is_complete, verify_directory
from trilm.store.layout import RUN_CONFIG
from trilm.train.checkpoint import RunDir, atomic_directory, prune_states, shared_map
from trilm.train.config import TrainConfig, changed_keys
from trilm.train.convert import apply_recipe, branch_teacher
from trilm.train.reshard import to_universal, universal_dir

TRAINER_STATE = "trainer_state.json"


@dataclasses.dataclass
class ResumePoint:
    step: int
    path: Path
    state: dict
    """The contents of ``trainer_state.json``."""
    skipped: list[str]
    """Problems of newer states that were passed over (already warned about)."""
    universal: Path | None = None
    """Where the universal conversion was written when the data-parallel size changed under ZeRO."""
    source_family: str = ""
    """For the parent's state a conversion branch starts from: the parent's family (a FloatLM's, say)."""


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def save_state(
    engine,
    run: RunDir,
    step: int,
    trainer_state: dict,
    info: ParallelInfo,
    keep_last: int,
    keep: Iterable[int] = (),
):
    """Write ``state/step-N`` atomically (every rank takes part), then prune to the newest ``keep_last``
    (the states at the steps in ``keep`` stay)."""
    with atomic_directory(run.state_dir(step), {"step": step}) as tmp:
        engine.save_checkpoint(str(tmp.parent), tag=tmp.name, save_latest=False)
        rng = {
            "python": random.getstate(),
            "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        }
        torch.save(rng, tmp / f"rng-rank{info.rank}.pt")
        if info.rank == 0:
            payload = {**trainer_state, "dp_size": info.dp_size, "tp_size": info.tp_size}
            (tmp / TRAINER_STATE).write_text(json.dumps(payload, indent=2))
    prune_states(run.state, keep_last, keep)


def find_resume_point(run: RunDir, info: ParallelInfo) -> ResumePoint | None:
    """The newest loadable state (collective: every rank gets the same answer), or None when there is no
    state at all. Raises ConfigError when states exist but none is loadable."""
    skipped: list[str] = []
    for step, path in reversed(complete_steps(run.state)):
        problems = verify_directory(path, required=(TRAINER_STATE,), mapper=shared_map)
        state: dict = {}
        if not problems:
            state = json.loads((path / TRAINER_STATE).read_text())
            missing = [k for k in ("step", "data", "dp_size", "tp_size") if k not in state]
            if missing or state["step"] != step:
                problems = [f"{path / TRAINER_STATE}: not the state of step {step} (missing {missing})"]
        if not problems:
            return ResumePoint(step, path, state, skipped)
        message = f"{path} is not loadable, falling back to an older state: {'; '.join(problems)}"
        if info.rank == 0:
            warnings.warn(message, RuntimeWarning, stacklevel=2)
        skipped.append(message)
    if skipped:
        raise ConfigError(
            f"{run.state}: no loadable state ({' | '.join(skipped)}); restore the files, or delete "
            f"{run.state} to start this run over"
        )
    return None


BRANCH_MAY_DIFFER = ("tokens", "schedule", "optim.min_lr_ratio", "branch_from")
"""Keys in which a cooldown branch may differ from its parent (besides those a restart may change): its
length and the schedule after the branch point (the schedules' equality before it is checked step by step)."""

CONVERSION_MAY_DIFFER = (
    "model.family",
    "model.name",
    "model.quant",
    "convert",
    "distill",
    "optim.weight_decay",
    "optim.grad_clip",
)
"""What a conversion branch (a parent of another family) may change besides: the family and its quantizer
(the tensors stay the parent's, which is checked), the recipe, and the phase's regularisation. ``optim.lr``
stays the parent's, so ``convert.lr_scale`` is the rate relative to the float run's."""


def branch_point(path: str | Path, run_cfg, info: ParallelInfo) -> ResumePoint:
    """The state ``PARENT/state/step-N`` that starts a branch (``TrainConfig.branch_from``), checked: it is
    complete and sound, the parent's config equals this run's up to :data:`BRANCH_MAY_DIFFER`, and both
    schedules set the same rate and weight decay on every step before N. Only reads the parent."""

    path = Path(path)
    where = f"branch_from: {path}"
    problems = verify_directory(path, required=(TRAINER_STATE,), mapper=shared_map)
    if problems:
        raise ConfigError(f"{where}: not a complete training state ({'; '.join(problems)})")
    state = json.loads((path / TRAINER_STATE).read_text())
    step = int(state.get("step", -1))
    if not 0 < step < run_cfg.steps:
        raise ConfigError(
            f"{where}: the state is at step {step}; a branch of {run_cfg.steps} steps must start inside it"
            " (0 < step < steps)"
        )
    parent_file = path.parent.parent / RUN_CONFIG
    if not parent_file.is_file():
        raise ConfigError(f"{where}: no {RUN_CONFIG} in the parent run {path.parent.parent}")
    parent = TrainConfig.from_yaml(parent_file)
    mine = run_cfg.replace(model=run_cfg.model.resolved(info.tp_size))
    converts = parent.model.family != mine.model.family
    may_differ = BRANCH_MAY_DIFFER + (CONVERSION_MAY_DIFFER if converts else ())
    free = tuple(f"{k}." for k in may_differ)
    differ = [
        k
        for k in changed_keys(parent.to_dict(), mine.to_dict())
        if k not in may_differ and not k.startswith(free)
    ]
    if differ:
        what = (
            "a conversion branch continues the parent's run as another family and may change only its"
            f" length, schedule, recipe and quantizer ({', '.join(CONVERSION_MAY_DIFFER)})"
            if converts
            else "a branch continues the parent's training and may change only its length and its schedule"
            " after the branch point"
        )
        raise ConfigError(
            f"{where}: the parent ({parent_file}) differs from this run in {', '.join(differ)}; {what}"
        )
    if converts and canonical_shapes(parent.model) != canonical_shapes(mine.model):
        raise ConfigError(
            f"{where}: the parent's {parent.model.family} {parent.model.name} has other tensors than this"
            f" run's {mine.model.family} {mine.model.name}; a conversion keeps the parent's shapes"
        )
    first = None
    if not converts:  # a conversion's schedule starts at the branch point
        first = Schedule.for_optimizer(parent.optim, parent.schedule, parent.steps).first_difference(
            Schedule.for_optimizer(run_cfg.optim, run_cfg.schedule, run_cfg.steps), step
        )
    if first is not None:
        raise ConfigError(
            f"{where}: the parent's schedule differs from this run's at step {first[0]} ({first[1]}), before"
            f" the branch point {step}: the state is not one this run passes through (use WSD with the"
            " warm-up in steps: its rate does not depend on the run's length until the cooldown)"
        )
    if run_cfg.zero_stage > 0 and state["dp_size"] != info.dp_size:
        raise ConfigError(
            f"{where}: written at data-parallel size {state['dp_size']}, now {info.dp_size}; branch at the"
            " parent's size (a ZeRO state reshards through a conversion written next to it, in the parent)"
        )
    return ResumePoint(step, path, state, [], source_family=parent.model.family if converts else "")


def parent_config(branch_from: str) -> TrainConfig | None:
    """The run config of the run whose state ``branch_from`` names (``PARENT/state/step-N`` →
    ``PARENT/resolved_config.yaml``), or None where it cannot be read (:func:`branch_point` says why)."""
    try:
        return TrainConfig.from_yaml(Path(branch_from).parent.parent / RUN_CONFIG)
    except (ConfigError, OSError):
        return None


def resolve_branch_from(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` with its conversion recipe filled in where its ``branch_from`` is a state of a run of
    another family (:func:`~trilm.train.convert.apply_recipe`): the parent's ``optim.lr`` where the branch
    leaves its own at the default, and distillation from the parent's snapshot at the branch point where
    that is complete (a state without one: no teacher, which the plan and the ``conversion`` event name).
    Anything else, or a parent that cannot be read, is returned as it is. Reads the parent's config and
    looks for that snapshot, on the first launch and on every resume alike, so both resolve the same."""
    if not cfg.branch_from or cfg.model_unresolved:
        return cfg
    parent = parent_config(cfg.branch_from)
    if parent is None or parent.model.family == cfg.model.family:
        return cfg
    snapshot = branch_teacher(cfg.branch_from)
    teacher = str(snapshot) if is_complete(snapshot) else ""
    return apply_recipe(cfg, teacher=teacher, source_lr=parent.optim.lr)


def needs_universal(point: ResumePoint | None, info: ParallelInfo, zero_stage: int) -> bool:
    """ZeRO-1/2 optimizer partitions are per data-parallel rank: another DP size goes through universal."""
    return point is not None and zero_stage > 0 and point.state["dp_size"] != info.dp_size


def prepare_universal(point: ResumePoint, info: ParallelInfo) -> Path:
    """Rank 0 converts the state to a universal checkpoint next to it; the others wait."""
    if point.state["tp_size"] != info.tp_size:
        raise ConfigError(
            f"{point.path}: written at tensor_parallel={point.state['tp_size']}, now {info.tp_size}; a ZeRO "
            "state reshards across data-parallel sizes only (load the snapshot weights into a new run "
            "to change TP)"
        )
    out = universal_dir(point.path)
    if info.rank == 0:
        to_universal(point.path, out)
    _barrier()
    point.universal = out
    return out


def load_state(engine, point: ResumePoint, info: ParallelInfo) -> None:
    """Load weights, optimizer state and this rank's RNG (when it was saved: a DP change adds ranks)."""
    source = point.universal or point.path
    load_path, _ = engine.load_checkpoint(
        str(source.parent), tag=source.name, load_optimizer_states=True, load_lr_scheduler_states=False
    )
    if load_path is None:
        raise ConfigError(f"{point.path}: DeepSpeed could not load this state")
    rng_file = point.path / f"rng-rank{info.rank}.pt"
    if rng_file.exists():
        rng = torch.load(rng_file, weights_only=False)
        random.setstate(rng["python"])
        np.random.set_state(rng["numpy"])
        torch.set_rng_state(rng["torch"])
        if rng["cuda"] is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
    _barrier()
    if point.universal is not None and info.rank == 0:
        shutil.rmtree(point.universal, ignore_errors=True)
