"""Configuration of a pretraining run (the resolved copy is saved in every run directory)."""

from __future__ import annotations

import copy
import dataclasses
import os
import types
import typing
from typing import TYPE_CHECKING, Any, Literal, Union

import torch

from trilm.config import Config, ConfigError, apply_overrides, require, shown
from trilm.data.sampler import DataConfig
from trilm.model.config import ModelConfig, preset
from trilm.model.spec import canonical_shapes
from trilm.parallel import ParallelConfig
from trilm.schedule import Schedule, ScheduleConfig
from trilm.train.convert import ConvertConfig

if TYPE_CHECKING:
    from trilm.store.open import ModelDir


@dataclasses.dataclass
class OptimConfig(Config):
    """AdamW; weight decay applies to matrices (block linears, embedding, head), never to norm gains."""

    lr: float = 1.5e-3
    min_lr_ratio: float = 0.1
    """The decay ends at lr · min_lr_ratio."""
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    """Global gradient-norm clip; 0 disables it."""
    fused: bool | None = None
    """torch's fused AdamW kernel (one kernel over all parameters) instead of the multi-tensor ``foreach``
    one; None = fused on GPU, foreach on CPU (docs/training.md has the measurements)."""

    def validate(self) -> None:
        require(self.lr > 0, f"lr: must be > 0, got {self.lr}")
        require(0 <= self.min_lr_ratio <= 1, f"min_lr_ratio: must be in [0, 1], got {self.min_lr_ratio}")
        require(0 <= self.beta1 < 1 and 0 <= self.beta2 < 1, "beta1/beta2: must be in [0, 1)")
        require(self.weight_decay >= 0, f"weight_decay: must be >= 0, got {self.weight_decay}")
        require(self.grad_clip >= 0, f"grad_clip: must be >= 0, got {self.grad_clip}")


@dataclasses.dataclass
class CheckpointConfig(Config):
    """Model snapshots form the suite (all kept); resumable states are for restarts (last k kept)."""

    snapshot_every: int = 1000
    log_spaced: bool = True
    """Also snapshot steps 0, 1, 2, 4, … up to ``log_spaced_until`` (Pythia's early checkpoints)."""
    log_spaced_until: int = 512
    state_every: int = 500
    keep_last: int = 2
    keep_states_at: list[int] = dataclasses.field(default_factory=list)
    """Steps that also save a resumable state and a model snapshot, and whose state is never pruned: the
    starting points of cooldown branches (``trilm suite cooldown`` fills them in from the suite's
    ``cooldown`` section)."""

    def validate(self) -> None:
        require(self.snapshot_every > 0, f"snapshot_every: must be > 0, got {self.snapshot_every}")
        require(self.state_every > 0, f"state_every: must be > 0, got {self.state_every}")
        require(self.keep_last >= 1, f"keep_last: must be >= 1, got {self.keep_last}")
        bad = [s for s in self.keep_states_at if not isinstance(s, int) or isinstance(s, bool) or s < 1]
        require(not bad, f"keep_states_at: steps must be integers >= 1, got {bad}")


@dataclasses.dataclass
class LogConfig(Config):
    every: int = 10
    eval_every: int = 200
    """Validation loss every N steps and at every snapshot; 0 = only at snapshots. The set is
    ``data.valid_sequences`` fixed sequences of the validation split."""
    tensorboard: bool = True
    progress: bool = True
    max_nonfinite: int = 5
    """Abort after this many consecutive steps with a NaN/inf loss (each such step is skipped)."""

    def validate(self) -> None:
        require(self.every > 0, f"every: must be > 0, got {self.every}")
        require(self.eval_every >= 0, f"eval_every: must be >= 0, got {self.eval_every}")
        require(self.max_nonfinite >= 1, f"max_nonfinite: must be >= 1, got {self.max_nonfinite}")


@dataclasses.dataclass
class DistillConfig(Config):
    """Knowledge distillation from a float teacher, the usual companion of converting a float model into a
    ternary one (``init_from`` a FloatLM with ``model.family: trilm``).

    The loss of a micro-batch becomes (1 − weight) · CE(student, labels) + weight · T² · KL(teacher_T ‖
    student_T), both on the same tokens, with p_T = softmax(logits / T) over the tokenizer's vocabulary (the
    padding columns of the embedding are left out). T² keeps the gradient of the KL term on the scale of
    the CE's as T changes (Hinton et al. 2015). The teacher runs in inference mode, bf16 on GPU and fp32 on
    CPU, sharded like the student under tensor parallelism; validation loss stays the plain CE, so runs with
    and without distillation compare on one number."""

    teacher: str = ""
    """A model directory (snapshot, suite checkpoint, Hugging Face Llama); empty = no distillation, except
    in a conversion by ``convert.recipe: crossover``, which distils from its source. Its vocabulary and
    tokenizer must be the student's."""
    weight: float = 0.5
    temperature: float = 1.0

    def validate(self) -> None:
        require(0 < self.weight <= 1, f"weight: must be in (0, 1], got {self.weight}")
        require(self.temperature > 0, f"temperature: must be > 0, got {self.temperature}")

    @property
    def enabled(self) -> bool:
        return bool(self.teacher)


def _default_data() -> DataConfig:
    return DataConfig(train_dir="data/train", valid_dir="data/validation")


@dataclasses.dataclass
class TrainConfig(Config):
    run_dir: str = "runs/default"
    seed: int = 1234
    """Model initialisation seed (the data order has its own, ``data.seed``)."""
    model: ModelConfig = dataclasses.field(default_factory=lambda: preset("trilm-tiny"))
    data: DataConfig = dataclasses.field(default_factory=_default_data)
    parallel: ParallelConfig = dataclasses.field(default_factory=ParallelConfig)
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    schedule: ScheduleConfig = dataclasses.field(default_factory=ScheduleConfig)
    checkpoint: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)
    log: LogConfig = dataclasses.field(default_factory=LogConfig)
    tokens: int = 10_000_000
    """Training tokens; steps = tokens // batch_tokens."""
    batch_tokens: int = 65_536
    """Global batch in tokens (Spectra: TriLM ≈1M, FloatLM ≈2M); sequences/step = batch_tokens // seq_len."""
    micro_batch: int = 8
    """Sequences per data-parallel rank per forward/backward; the rest is gradient accumulation."""
    seq_len: int = 0
    """0 = the model's context."""
    zero_stage: Literal[0, 1, 2] = 1
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    """auto = bf16 on GPU, fp32 on CPU."""
    compile: bool | Literal["auto"] = "auto"
    """torch.compile every block (regional compilation: one graph reused by all blocks, compatible with
    activation recompute and tensor parallelism). ``auto`` compiles on CUDA, where it was measured faster
    (1.1B on an H200: 34.5 → 45.7 % MFU FloatLM, 32.7 → 46.2 % TriLM), and stays eager on CPU, where
    compiling costs more than it saves for the small models trained there (docs/training.md)."""
    recompute: int | Literal["all"] = 0
    """Activation recompute: the first N blocks ("all": every block) keep only their input for backward and
    run their forward again inside it; 0 = none. ``--dry-run`` shows the memory with and without."""
    fused_quantizer: bool = False
    """Compile the TriLM/BiLM weight quantizer (absmean, round, clip, scale) into generated kernels; without
    ``compile`` this is the only part compiled. Same values; a speed lever (docs/training.md)."""
    init_from: str = ""
    """A snapshot whose weights start the run instead of a random init (e.g. a pruned model trained
    further, or a FloatLM or imported Llama turned into a TriLM or BiLM by continued training: the latent
    weights start as the float ones). Without a ``model`` section the run takes the snapshot's model config
    (per-layer shapes included); a partial one overrides it key by key (``model: {family: trilm}``
    converts); either way both must have the same tensors. Parsing does not open the snapshot: until
    :func:`trilm.train.init_from.resolve_init_from` does, where the run starts or a command needs the
    model, such a ``model`` is a :class:`ModelFromSnapshot`."""
    distill: DistillConfig = dataclasses.field(default_factory=DistillConfig)
    branch_from: str = ""
    """A complete resumable state of another run (``PARENT/state/step-N``) that starts this run at step N:
    its weights, optimizer moments, data position and RNG, as if this run had trained those steps itself.
    That is what a cooldown branch is (``trilm suite cooldown``): the parent's schedule must equal this
    run's on every step before N, which is checked, and the parent's directory is only read. Once this
    run has a state of its own it resumes from that. A parent of another family (a FloatLM's state for a
    TriLM) makes it a conversion branch instead (:mod:`trilm.train.convert`): the schedule then covers
    the steps from N on, and the parent's schedule before N does not matter."""
    convert: ConvertConfig = dataclasses.field(default_factory=ConvertConfig)
    """The recipe of a conversion: a run whose ``init_from`` or ``branch_from`` holds another family. Its
    default fills in the crossover study's values where ``schedule``, ``optim`` and ``distill`` are left at
    theirs (:func:`trilm.train.convert.apply_recipe`)."""

    def validate(self) -> None:
        require(
            isinstance(self.compile, bool) or self.compile == "auto",
            f"compile: must be true, false or 'auto', got {self.compile!r}",
        )
        for key in ("init_from", "branch_from"):
            _check_path(key, getattr(self, key))
        require(self.batch_tokens > 0, f"batch_tokens: must be > 0, got {self.batch_tokens}")
        require(self.micro_batch > 0, f"micro_batch: must be > 0, got {self.micro_batch}")
        require(
            self.tokens >= self.batch_tokens,
            f"tokens: {self.tokens} is less than one batch ({self.batch_tokens} tokens)",
        )
        require(
            not (self.init_from and self.branch_from),
            "init_from and branch_from: a run starts from a snapshot's weights or from a state, not both",
        )
        require(
            self.convert.is_default or bool(self.init_from or self.branch_from),
            "convert: a recipe for a conversion, but this run starts from nothing (no init_from or"
            " branch_from)",
        )
        require(
            not (self.init_from and self.convert.optimizer == "keep"),
            "convert.optimizer: keep needs a state to keep the moments of (branch_from); init_from starts"
            " from weights alone",
        )
        Schedule.for_optimizer(self.optim, self.schedule, self.steps)  # warm-up and cooldown fit the run
        if self.model_unresolved:
            require(
                bool(self.init_from),
                "model: a partial model section is taken over an init_from snapshot, but init_from is empty",
            )
            return  # the rest is checked against the model, once init_from is resolved
        self._validate_with_model()

    @property
    def model_unresolved(self) -> bool:
        """Whether the model is still the ``init_from`` snapshot's, not yet read (a
        :class:`ModelFromSnapshot`): :func:`trilm.train.init_from.resolve_init_from` resolves it."""
        return isinstance(self.model, ModelFromSnapshot)

    def _validate_with_model(self) -> None:
        """The checks that need the model's shape (its context, layers, heads and quantizer)."""
        seq = self.sequence_length
        require(
            1 <= seq <= self.model.context,
            f"seq_len: {seq} must be in [1, model.context={self.model.context}]",
        )
        require(
            self.batch_tokens % seq == 0,
            f"batch_tokens: {self.batch_tokens} is not a multiple of the sequence length {seq}",
        )
        try:
            self.model.check_tensor_parallel(self.parallel.tensor_parallel)
        except ConfigError as exc:
            raise ConfigError(str(exc)) from None
        tp = self.parallel.tensor_parallel
        require(
            not self.parallel.sequence_parallel or seq % tp == 0,
            f"parallel.sequence_parallel: the sequence length {seq} is not divisible by tensor_parallel={tp}",
        )
        require(
            self.recompute == "all" or 0 <= self.recompute <= self.model.layers,
            f"recompute: {self.recompute!r} must be 'all' or a number of blocks in [0, {self.model.layers}]",
        )
        require(
            not (self.convert.ramp and self.model.quant.activation_bits),
            "convert.ramp: phases in the quantized weights only; with model.quant.activation_bits the"
            " activations would be quantized from the first step",
        )

    def over_snapshot(self, opened: ModelDir) -> TrainConfig:
        """This run with the model of its ``init_from`` snapshot ``opened`` (already open: this reads no
        file): a :class:`ModelFromSnapshot` becomes the snapshot's config with the run's keys on top, a
        complete model stays, and either is checked against the snapshot (:meth:`check_init_from`).
        :func:`trilm.train.init_from.resolve_init_from` opens the snapshot and calls this."""
        cfg = self
        if isinstance(self.model, ModelFromSnapshot):
            model = ModelConfig.from_dict(_over_snapshot(opened.config, self.model.section), prefix="model.")
            cfg = self.replace(model=model)
        cfg.check_init_from(opened)
        return cfg

    def check_init_from(self, opened: ModelDir) -> None:
        """Refuse an ``init_from`` snapshot (``opened``) that this run cannot start from.

        Not part of :meth:`validate`: a config is validated on every ``replace`` and opens no file; the
        snapshot is opened once per command by whoever uses it (the dry run, the trainer), through
        :func:`trilm.train.init_from.resolve_init_from`, which checks it here.
        """
        snap = opened.config
        require(
            not opened.stored_packed,
            f"init_from: {self.init_from} is a packed snapshot ({opened.kind}); it has no weights to train",
        )
        require(
            canonical_shapes(snap) == canonical_shapes(self.model),
            f"init_from: {self.init_from} holds a {snap.family} {snap.name} whose tensors differ from "
            f"model ({self.model.family} {self.model.name}); drop the model section to use the snapshot's",
        )

    def compile_on(self, device: torch.device | str) -> bool:
        """Whether blocks are compiled on ``device``: ``compile`` itself, or for ``auto`` whether it is CUDA
        (the measured win; the docstring of ``compile`` says why)."""
        if self.compile == "auto":
            return torch.device(device).type == "cuda"
        return bool(self.compile)

    @property
    def sequence_length(self) -> int:
        return self.seq_len or self.model.context

    @property
    def global_batch(self) -> int:
        return self.batch_tokens // self.sequence_length

    @property
    def steps(self) -> int:
        return self.tokens // self.batch_tokens

    def accumulation(self, dp_size: int) -> int:
        """Micro-batches per step on each rank; raises when the batch does not split evenly."""
        per_rank, rem = divmod(self.global_batch, dp_size)
        if rem or per_rank % self.micro_batch:
            raise ConfigError(
                f"batch_tokens: {self.global_batch} sequences per step do not split into data-parallel "
                f"size {dp_size} × micro_batch {self.micro_batch} × an integer accumulation"
            )
        return per_rank // self.micro_batch

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, prefix: str = "") -> TrainConfig:
        """Like Config.from_dict, but ``model: {preset: trilm-99m, …}`` starts from a named preset, and a
        run with ``init_from`` and no complete model section keeps that section as a
        :class:`ModelFromSnapshot` (no file is opened: the snapshot is read where the run starts)."""
        if not isinstance(data, dict):
            return super().from_dict(data, prefix=prefix)  # names what it got
        data = dict(data)
        init_from = data.get("init_from")
        if "init_from" in data and not isinstance(init_from, str):
            raise ConfigError(f"{prefix}init_from: expected a path (a string), got {shown(init_from)}")
        section = data.get("model")
        if init_from and not _complete_model(section) and not _has_preset(section):
            section = {} if section is None else section
            if not isinstance(section, dict):
                raise ConfigError(f"{prefix}model: expected a mapping for ModelConfig, got {shown(section)}")
            _check_section(ModelConfig, section, f"{prefix}model.")
            kwargs = cls._coerced({k: v for k, v in data.items() if k != "model"}, prefix=prefix)
            return cls._built({**kwargs, "model": ModelFromSnapshot(copy.deepcopy(section))}, prefix=prefix)
        model = data.get("model")
        if isinstance(model, dict) and "preset" in model:
            model = dict(model)
            try:
                base = preset(model.pop("preset")).to_dict()
            except ConfigError as exc:
                raise ConfigError(f"{prefix}model.preset: {exc}") from None
            quant = model.pop("quant", {})
            if isinstance(quant, dict):  # anything else is left for the model section's check to name
                quant = {**base.get("quant", {}), **quant}
            data["model"] = {**base, **model, "quant": quant}
        return super().from_dict(data, prefix=prefix)

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        if isinstance(self.model, ModelFromSnapshot):
            out["model"] = self.model.to_dict()
        return out

    def with_overrides(self, overrides: list[str] | tuple[str, ...]) -> TrainConfig:
        """Config.with_overrides; a model still to come from ``init_from`` takes ``model.KEY=value`` for any
        key a model section has, set over the snapshot's when it is resolved."""
        if not isinstance(self.model, ModelFromSnapshot):
            return super().with_overrides(overrides)
        data = self.to_dict()
        data["model"] = _merged(_skeleton(ModelConfig), data["model"])
        data = apply_overrides(data, overrides)
        if isinstance(data["model"], dict):
            data["model"] = _without_unset(data["model"])
        return type(self).from_dict(data)


class ModelFromSnapshot:
    """The model of a run that takes it from its ``init_from`` snapshot, before that is opened: the keys
    the run sets over the snapshot's config (``{family: trilm}`` converts; ``{}`` takes it as it is), kept
    as written. :meth:`TrainConfig.over_snapshot` turns it into a :class:`ModelConfig`; reading a model
    field before then is a ConfigError naming ``init_from``, never a guess."""

    __slots__ = ("section",)

    def __init__(self, section: dict[str, Any]) -> None:
        self.section = section

    def to_dict(self) -> dict[str, Any]:
        return copy.deepcopy(self.section)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # copy, pickle and hasattr probes
            raise AttributeError(name)
        raise ConfigError(
            f"model.{name}: the model is the init_from snapshot's, which is read where the run starts;"
            " resolve the config first (trilm.train.init_from.resolve_init_from)"
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ModelFromSnapshot) and other.section == self.section

    def __repr__(self) -> str:
        return f"ModelFromSnapshot({self.section!r})"


PATH_MAX, NAME_MAX = 4096, 255
"""The longest path and file name, in bytes, that Linux file systems take."""


def _check_path(key: str, value: str) -> None:
    """Refuse a path field that no file system can hold (a NUL byte, too long a path or name), naming it."""
    if not value:
        return
    require("\x00" not in value, f"{key}: {shown(value)} is not a path (it holds a NUL byte)")
    size = len(os.fsencode(value))
    require(size <= PATH_MAX, f"{key}: a path of {size} bytes, longer than a file system takes ({PATH_MAX})")
    longest = max(len(os.fsencode(part)) for part in value.split("/"))
    require(
        longest <= NAME_MAX, f"{key}: {shown(value)} has a name of {longest} bytes, longer than {NAME_MAX}"
    )


def _complete_model(section: Any) -> bool:
    """Whether a model section names every field (as ``to_dict`` writes it: a config being replaced or
    overridden), so that nothing of it comes from the ``init_from`` snapshot."""
    names = {f.name for f in dataclasses.fields(ModelConfig)}
    return isinstance(section, dict) and "preset" not in section and names <= section.keys()


def _has_preset(section: Any) -> bool:
    """Whether a model section starts from a named preset (then the model is the preset's, whatever
    ``init_from`` holds; the snapshot is checked against it when it is opened)."""
    return isinstance(section, dict) and "preset" in section


def _section_class(hint: Any) -> type[Config] | None:
    """The Config class a field's annotation holds (``RopeScaling | None`` → RopeScaling), else None."""
    if typing.get_origin(hint) in (Union, types.UnionType):
        found = [_section_class(arg) for arg in typing.get_args(hint)]
        return next((c for c in found if c is not None), None)
    return hint if isinstance(hint, type) and issubclass(hint, Config) else None


def _check_section(cls: type[Config], section: dict[str, Any], prefix: str) -> None:
    """Check a partial section's keys and value types against ``cls`` without building it (the values it
    lacks come from elsewhere, so its cross-field checks wait for the whole): unknown keys and wrong types
    raise with the dotted key."""
    hints = cls._hints()
    for key, value in section.items():
        sub = _section_class(hints.get(key)) if key in hints else None
        if sub is not None and isinstance(value, dict):
            _check_section(sub, value, f"{prefix}{key}.")
        else:
            cls._coerced({key: value}, prefix=prefix)


_UNSET: Any = object()
"""A key the partial model section does not set (a placeholder while overrides are applied)."""


def _skeleton(cls: type[Config]) -> dict[str, Any]:
    """Every key a ``cls`` section may hold (nested sections as mappings), each :data:`_UNSET`; for a
    model, ``preset`` too."""
    hints = cls._hints()
    out: dict[str, Any] = {"preset": _UNSET} if cls is ModelConfig else {}
    for f in dataclasses.fields(cls):
        sub = _section_class(hints[f.name])
        out[f.name] = _skeleton(sub) if sub is not None else _UNSET
    return out


def _merged(base: dict[str, Any], over: Any) -> Any:
    """``over`` on top of ``base``, mappings merged key by key; anything but a mapping replaces ``base``."""
    if not isinstance(over, dict):
        return over
    out = dict(base)
    for key, value in over.items():
        out[key] = _merged(base[key], value) if isinstance(base.get(key), dict) else value
    return out


def _without_unset(section: dict[str, Any]) -> dict[str, Any]:
    """A section with its :data:`_UNSET` keys, and the mappings left empty by dropping them, removed."""
    out: dict[str, Any] = {}
    for key, value in section.items():
        if isinstance(value, dict):
            inner = _without_unset(value)
            if inner or not _all_unset(value):
                out[key] = inner
        elif value is not _UNSET:
            out[key] = value
    return out


def _all_unset(section: dict[str, Any]) -> bool:
    return all(_all_unset(v) if isinstance(v, dict) else v is _UNSET for v in section.values())


def _over_snapshot(snap: ModelConfig, section: dict[str, Any]) -> dict[str, Any]:
    """The model section of a run that starts from a snapshot: the snapshot's config with the run's keys on
    top. A family change renames a preset-style name (``floatlm-tiny`` → ``trilm-tiny``) and leaves the
    float model's quantizer settings to the new family's defaults unless given."""
    base = snap.to_dict()
    family = section.get("family", snap.family)
    if family != snap.family:
        if "name" not in section and snap.name.startswith(f"{snap.family}-"):
            base["name"] = f"{family}-{snap.name[len(snap.family) + 1 :]}"
        if snap.family == "floatlm":
            base.pop("quant", None)
    quant = section.get("quant")
    if isinstance(quant, dict) and isinstance(base.get("quant"), dict):
        section = {**section, "quant": {**base["quant"], **quant}}
    return {**base, **section}


# Keys that may change between a run and its resume; anything else must match the saved config.
RESUMABLE_CHANGES = (
    "run_dir",
    "parallel",
    "micro_batch",
    "log",
    "checkpoint",
    "compile",
    "recompute",
    "fused_quantizer",
    "optim.fused",
)


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def changed_keys(saved: dict, now: dict) -> list[str]:
    """Dotted keys whose values differ between two run configs (as dicts), except those a restart may
    change (:data:`RESUMABLE_CHANGES`): what makes a config another run rather than the same one resumed."""
    a, b = _flat(saved), _flat(now)
    free = tuple(f"{k}." for k in RESUMABLE_CHANGES)
    keys = sorted(set(a) | set(b), key=lambda k: (k.count("."), k))
    return [k for k in keys if a.get(k) != b.get(k) and k not in RESUMABLE_CHANGES and not k.startswith(free)]
