"""Configuration of a pretraining run (the resolved copy is saved in every run directory)."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import torch

from trilm.config import Config, ConfigError, require
from trilm.data.sampler import DataConfig
from trilm.model.config import ModelConfig, preset
from trilm.model.spec import canonical_shapes
from trilm.parallel import ParallelConfig
from trilm.schedule import Schedule, ScheduleConfig
from trilm.store.open import ModelDir, open_model
from trilm.train.convert import ConvertConfig


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
    """A model directory (snapshot, suite checkpoint, Hugging Face Llama); empty = no distillation. Its
    vocabulary and tokenizer must be the student's."""
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
    converts); either way both must have the same tensors."""
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
    """The recipe of a conversion: a run whose ``init_from`` or ``branch_from`` holds another family."""

    def validate(self) -> None:
        require(
            isinstance(self.compile, bool) or self.compile == "auto",
            f"compile: must be true, false or 'auto', got {self.compile!r}",
        )
        seq = self.sequence_length
        require(
            1 <= seq <= self.model.context,
            f"seq_len: {seq} must be in [1, model.context={self.model.context}]",
        )
        require(self.batch_tokens > 0, f"batch_tokens: must be > 0, got {self.batch_tokens}")
        require(
            self.batch_tokens % seq == 0,
            f"batch_tokens: {self.batch_tokens} is not a multiple of the sequence length {seq}",
        )
        require(self.micro_batch > 0, f"micro_batch: must be > 0, got {self.micro_batch}")
        require(
            self.tokens >= self.batch_tokens,
            f"tokens: {self.tokens} is less than one batch ({self.batch_tokens} tokens)",
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
        require(
            not (self.convert.ramp and self.model.quant.activation_bits),
            "convert.ramp: phases in the quantized weights only; with model.quant.activation_bits the"
            " activations would be quantized from the first step",
        )

        Schedule.for_optimizer(self.optim, self.schedule, self.steps)  # warm-up and cooldown fit the run

    def check_init_from(self, opened: ModelDir) -> None:
        """Refuse an ``init_from`` snapshot (``opened``) that this run cannot start from.

        Not part of :meth:`validate`: a config is validated on every ``replace``, and the snapshot is opened
        once per command by whoever uses it (parsing, the dry run, the trainer), which then checks it here.
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
        """Like Config.from_dict, but ``model: {preset: trilm-99m, …}`` starts from a named preset."""
        data = dict(data)
        opened = None
        if data.get("init_from") and not _complete_model(data.get("model")):
            opened = open_model(data["init_from"])
            if not (isinstance(data.get("model"), dict) and "preset" in data["model"]):
                data["model"] = _over_snapshot(opened.config, data.get("model") or {})
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
        cfg = super().from_dict(data, prefix=prefix)
        if opened is not None:
            cfg.check_init_from(opened)
        return cfg


def _complete_model(section: Any) -> bool:
    """Whether a model section names every field (as ``to_dict`` writes it: a config being replaced or
    overridden), so that nothing of it comes from the ``init_from`` snapshot and parsing need not open it."""
    names = {f.name for f in dataclasses.fields(ModelConfig)}
    return isinstance(section, dict) and "preset" not in section and names <= section.keys()


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
