"""Suite definitions: families × sizes × token budgets × checkpoint schedule × parallelism, as one YAML file.

A suite expands into runs, one per (family, size, token budget). Each run's :class:`TrainConfig` is its
family's *template* (a run YAML, ``{family}``/``{size}`` substituted in its path) with, on top, in this
order: the suite's ``overrides``, the family's ``overrides``, the size's shape (``preset`` + ``model``) and
parallelism, the family's batch, the suite's sequence length, checkpoint schedule and data, the token budget
and the run directory ``<root>/<run name>``. Every run is built and validated when the suite is loaded, so a
typo in any layer fails before anything runs, with the suite file and the run named.

Why templates instead of a second copy of the recipe: the Spectra run configs (``configs/train/*.yaml``)
already encode the recipe, and ``trilm train --config`` must keep training exactly what a suite trains.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from pathlib import Path
from typing import Any

from trilm.config import Config, ConfigError, read_yaml_file, require, shown
from trilm.configs import config_dir, packaged
from trilm.families import FAMILY_NAMES
from trilm.schedule import Schedule, cooldown_branch
from trilm.train.config import TrainConfig
from trilm.train.metrics import peak_flops

SUITE_DIR = config_dir() / "suites"
"""The named suites (``trilm suite plan spectra``), installed with trilm (:mod:`trilm.configs`)."""


@dataclasses.dataclass
class FamilySpec(Config):
    """One model family of the suite and the run config its runs start from."""

    name: str = ""
    """``trilm``, ``floatlm`` or ``bilm``."""
    config: str = ""
    """Template run YAML; ``{family}`` and ``{size}`` are substituted. Relative paths are looked up next to
    the suite file, then in the current directory, then among trilm's installed configs (``configs/...``,
    :mod:`trilm.configs`)."""
    batch_tokens: int = 0
    """Global batch in tokens; 0 = the template's."""
    overrides: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Nested run-config keys applied on top of the template, e.g. ``{optim: {lr: 3e-3}}``."""
    optional: bool = False
    """Left out unless asked for (``--families``)."""
    sizes: list[str] = dataclasses.field(default_factory=list)
    """Only these of the suite's sizes; empty = all of them."""

    def validate(self) -> None:
        require(self.name in FAMILY_NAMES, f"name: {self.name!r} is not one of {list(FAMILY_NAMES)}")
        require(bool(self.config), f"config: family {self.name} needs a template run config")
        require(self.batch_tokens >= 0, f"batch_tokens: must be >= 0, got {self.batch_tokens}")


@dataclasses.dataclass
class SizeSpec(Config):
    """One model size: a preset shape (optionally reshaped) and how it is parallelised."""

    name: str = ""
    """Family-free size name (``99m``, ``tiny``); runs are named ``<family>-<name>``."""
    preset: str = ""
    """Preset size the shape starts from (``<family>-<preset>``); empty = ``name``."""
    model: dict[str, Any] = dataclasses.field(default_factory=dict)
    """ModelConfig fields replacing the preset's (hidden, ffn, heads, layers, …): sizes without a preset."""
    tensor_parallel: int = 0
    """Tensor (model) parallel degree; 0 = the template's."""
    data_parallel: int = 0
    """Data-parallel replicas; 0 = ``hardware.data_parallel``."""
    micro_batch: int = 0
    """Sequences per rank per forward/backward; 0 = the template's."""
    overrides: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Nested run-config keys for this size in every family, applied after the family's, e.g. a smaller
    peak learning rate for a wider model ``{optim: {lr: 2e-3}}`` (Spectra tuned it per size)."""
    family_overrides: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    """Per family, nested run-config keys for this size only, applied last: a learning rate tuned per
    (family, size), e.g. ``{trilm: {optim: {lr: 4e-3}}, floatlm: {optim: {lr: 2e-3}}}``."""

    def validate(self) -> None:
        require(bool(self.name) and "-" not in self.name, f"name: {self.name!r} must be set, without '-'")
        unknown = sorted(set(self.family_overrides) - set(FAMILY_NAMES))
        require(not unknown, f"family_overrides: {unknown} are not families ({', '.join(FAMILY_NAMES)})")
        for key in ("tensor_parallel", "data_parallel", "micro_batch"):
            require(getattr(self, key) >= 0, f"{key}: must be >= 0, got {getattr(self, key)}")
        for key in ("family", "name"):
            require(key not in self.model, f"model.{key}: set by the suite, not per size")


@dataclasses.dataclass
class HardwareConfig(Config):
    """What the plan prices runs on: devices per node, their peak and the model FLOPs utilisation."""

    device: str = "H100"
    """A name in ``trilm.train.metrics.PEAK_FLOPS`` (H100, H200, A100, V100, …) or ``cpu``."""
    peak_tflops: float = 0.0
    """Peak dense TFLOP/s per device; 0 = from the device table (required for devices not in it)."""
    mfu: float = 0.4
    """Model FLOPs utilisation the GPU-hours are computed at."""
    devices_per_node: int = 8
    data_parallel: int = 1
    """Data-parallel replicas of every run (a size may set its own)."""

    def validate(self) -> None:
        require(0 < self.mfu <= 1, f"mfu: must be in (0, 1], got {self.mfu}")
        require(self.peak_tflops >= 0, f"peak_tflops: must be >= 0, got {self.peak_tflops}")
        require(self.devices_per_node >= 1, f"devices_per_node: must be >= 1, got {self.devices_per_node}")
        require(self.data_parallel >= 1, f"data_parallel: must be >= 1, got {self.data_parallel}")
        require(self.peak_flops is not None, f"peak_tflops: device {self.device!r} is not in the peak table")

    @property
    def is_gpu(self) -> bool:
        return self.device.lower() != "cpu"

    @property
    def peak_flops(self) -> float | None:
        if self.peak_tflops:
            return self.peak_tflops * 1e12

        return peak_flops(self.device) if self.is_gpu else None


@dataclasses.dataclass
class SuiteDataConfig(Config):
    """Where every run's data comes from (empty fields keep the template's)."""

    embedded: bool = False
    """Prepare the embedded corpus under ``<root>/data`` (tokenizer of ``vocab_size``) and train on it."""
    vocab_size: int = 2048
    train_dir: str = ""
    valid_dir: str = ""
    tokenizer: str = ""

    def validate(self) -> None:
        require(self.vocab_size >= 260, f"vocab_size: must be >= 260, got {self.vocab_size}")
        require(
            not (self.embedded and (self.train_dir or self.valid_dir or self.tokenizer)),
            "embedded: prepares its own data; leave train_dir/valid_dir/tokenizer empty",
        )


@dataclasses.dataclass
class SuiteAnalysisConfig(Config):
    """How ``trilm suite analyse`` fits this suite (the command's flags override it)."""

    x: str = "params"
    """The size axis of L(N): ``params`` (all parameters) or ``nonembedding_params`` (Kaplan's choice; at
    tiny sizes with a 2,048-token vocabulary the embedding and head are most of the model and barely grow)."""

    def validate(self) -> None:
        axes = ("params", "nonembedding_params")
        require(self.x in axes, f"x: {self.x!r} is not one of {', '.join(axes)}")


@dataclasses.dataclass
class SuiteCooldownConfig(Config):
    """Cooldown branches of the suite's WSD runs (``trilm suite cooldown``; the command's flags override it).

    Every run (the *parent*) gets one branch per fraction in ``at``: a run that ends at that fraction of the
    parent's tokens, with a cooldown over its last ``fraction``, started from the parent's state where that
    cooldown begins. The parents keep their states at those steps (``checkpoint.keep_states_at``), so one
    run per size gives a point at every budget in ``at`` (Hägele et al. 2024).
    """

    at: list[float] = dataclasses.field(default_factory=list)
    """Where branches end, as fractions of the parent's budget in (0, 1]; empty = no branches."""
    fraction: float = 0.2
    """The cooldown's share of each branch's length."""
    shape: str = "1-sqrt"
    """``1-sqrt`` or ``linear``."""

    def validate(self) -> None:
        require(all(0 < a <= 1 for a in self.at), f"at: fractions must be in (0, 1], got {self.at}")
        require(len(set(self.at)) == len(self.at), f"at: repeated fraction in {self.at}")
        require(0 < self.fraction < 1, f"fraction: must be in (0, 1), got {self.fraction}")
        require(self.shape in ("1-sqrt", "linear"), f"shape: {self.shape!r} is not 1-sqrt or linear")


@dataclasses.dataclass
class SuiteConversionConfig(Config):
    """Conversion branches (``trilm suite convert``): every run of the family ``parents`` continues, from its
    state at ``start``, as a ``family`` model to the end of its budget — the same total tokens as the run
    of ``family`` trained from scratch, which it is compared with (:mod:`trilm.train.convert`). With
    ``start: end`` the float run is trained to its end (its own cooldown included) and the branch adds a
    share ``share`` of the total after it: the "plain" conversion, whose scratch run is the suite's run of
    ``family`` with the branch's total budget."""

    family: str = "trilm"
    """What the branches become: ``trilm`` or ``bilm``."""
    parents: str = "floatlm"
    """The family whose runs are branched."""
    start: str = "cooldown"
    """``cooldown``: where the parent's WSD cooldown starts (Apple's fused QAT); a fraction of the
    parent's steps in (0, 1): the conversion then trains the rest, a share 1 − start of the tokens; or
    ``end``: the parent's last step, the conversion then training ``share`` of a longer total."""
    share: float = 0.0
    """With ``start: end`` only: the conversion's share f of the branch's total tokens, which are the
    parent's / (1 − f)."""
    name: str = ""
    """Branches are named ``<parent run>-<name>``; empty = ``to-<family>``. Conversions of one family with
    different recipes need different names."""
    overrides: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Nested run-config keys of the branches: the recipe (``convert``), the conversion's own ``schedule``
    (laid over its steps), ``distill``, ``optim.weight_decay``; e.g. ``{convert: {lr_scale: 0.25}}``. What
    they leave out of those is the crossover recipe's (:func:`trilm.train.convert.apply_recipe`), not the
    parent's; ``{convert: {recipe: as_written}}`` keeps the parent's instead."""

    def validate(self) -> None:
        for key in ("family", "parents"):
            value = getattr(self, key)
            require(value in FAMILY_NAMES, f"{key}: {value!r} is not one of {list(FAMILY_NAMES)}")
        require(
            self.family != self.parents,
            f"family: a {self.family} branch of {self.parents} runs converts nothing",
        )
        require(
            self.start in ("cooldown", "end") or 0 < _fraction(self.start) < 1,
            f"start: 'cooldown', 'end' or a fraction of the parent's steps in (0, 1), got {self.start!r}",
        )
        if self.start == "end":
            require(
                0 < self.share < 1,
                f"share: start end needs the conversion's share in (0, 1), got {self.share}",
            )
        else:
            require(
                self.share == 0,
                f"share: only with start: end (else the parent's end sets it), got {self.share}",
            )
        require("/" not in self.name, f"name: {self.name!r} must be a plain name")

    @property
    def suffix(self) -> str:
        return self.name or f"to-{self.family}"

    def start_step(self, cfg: TrainConfig) -> int:
        """The parent's step the branches start from, for a parent run ``cfg``."""
        if self.start == "cooldown":
            if cfg.schedule.kind != "wsd":
                raise ConfigError(
                    f"start: cooldown needs a WSD parent (schedule.kind: wsd), not kind {cfg.schedule.kind!r}"
                )
            cooldown = Schedule.for_optimizer(cfg.optim, cfg.schedule, cfg.steps).cooldown_start
            assert cooldown is not None  # a WSD schedule has a cooldown
            return cooldown
        if self.start == "end":
            return cfg.steps
        step = round(_fraction(self.start) * cfg.steps)
        if not 0 < step < cfg.steps:
            raise ConfigError(
                f"start: {self.start} of {cfg.steps} steps leaves no step to convert or none before"
            )
        return step

    def end_step(self, cfg: TrainConfig) -> int:
        """The branches' last step (their length), for a parent run ``cfg``."""
        if self.start != "end":
            return cfg.steps
        end = round(cfg.steps / (1 - self.share))
        if end <= cfg.steps:
            raise ConfigError(f"share: {self.share} of a run after {cfg.steps} steps is not one step")
        return end


def _fraction(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return -1.0


@dataclasses.dataclass
class SuiteConfig(Config):
    name: str = ""
    description: str = ""
    root: str = ""
    """Directory of the suite's runs, results and analysis; empty = ``runs/<name>``."""
    families: list[FamilySpec] = dataclasses.field(default_factory=list)
    sizes: list[SizeSpec] = dataclasses.field(default_factory=list)
    tokens: list[int] = dataclasses.field(default_factory=list)
    """Token budgets; every (family, size) is trained once per budget, as a separate run."""
    seq_len: int = 0
    """0 = the template's."""
    checkpoint: dict[str, Any] = dataclasses.field(default_factory=dict)
    """CheckpointConfig keys applied to every run (snapshot_every, log_spaced_until, state_every, …)."""
    overrides: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Nested run-config keys applied to every run before the family's own."""
    data: SuiteDataConfig = dataclasses.field(default_factory=SuiteDataConfig)
    hardware: HardwareConfig = dataclasses.field(default_factory=HardwareConfig)
    analysis: SuiteAnalysisConfig = dataclasses.field(default_factory=SuiteAnalysisConfig)
    cooldown: SuiteCooldownConfig = dataclasses.field(default_factory=SuiteCooldownConfig)
    conversions: list[SuiteConversionConfig] = dataclasses.field(default_factory=list)
    """Conversion branches of the suite's runs (``trilm suite convert``), listed by ``status`` and
    ``analyse`` beside the cooldown branches."""

    def validate(self) -> None:
        require(bool(self.name) and "/" not in self.name, f"name: {self.name!r} must be a plain name")
        require(bool(self.families), "families: at least one family is required")
        require(bool(self.sizes), "sizes: at least one size is required")
        require(bool(self.tokens), "tokens: at least one token budget is required")
        for key, items in (("families", self.families), ("sizes", self.sizes)):
            names = [item.name for item in items]
            dup = sorted({n for n in names if names.count(n) > 1})
            require(not dup, f"{key}: {', '.join(dup)} listed more than once")
        size_names = [s.name for s in self.sizes]
        for i, fam in enumerate(self.families):
            unknown = [s for s in fam.sizes if s not in size_names]
            require(not unknown, f"families[{i}].sizes: {unknown} are not among the suite's sizes")
        require(all(t > 0 for t in self.tokens), f"tokens: budgets must be > 0, got {self.tokens}")
        require(len(set(self.tokens)) == len(self.tokens), f"tokens: repeated budget in {self.tokens}")
        require(self.seq_len >= 0, f"seq_len: must be >= 0, got {self.seq_len}")
        families = [f.name for f in self.families]
        for i, conv in enumerate(self.conversions):
            require(
                conv.parents in families,
                f"conversions[{i}].parents: {conv.parents} is not a family of the suite",
            )
        suffixes = [(c.parents, c.suffix) for c in self.conversions]
        dup = sorted({f"{p}-{s}" for p, s in suffixes if suffixes.count((p, s)) > 1})
        require(not dup, f"conversions: {', '.join(dup)} named twice (give each a name)")

    @property
    def root_dir(self) -> Path:
        return Path(self.root or f"runs/{self.name}")


@dataclasses.dataclass
class SuiteRun:
    """One training run of a suite, fully resolved."""

    name: str
    family: str
    size: str
    tokens: int
    """The budget as written in the suite; the run trains ``cfg.steps · cfg.batch_tokens`` tokens."""
    cfg: TrainConfig
    tensor_parallel: int
    data_parallel: int
    devices_per_node: int
    parent: str = ""
    """A cooldown branch's parent run (empty for the suite's own runs)."""
    branch_step: int = 0
    """The parent's step a branch starts from."""
    converts_from: str = ""
    """A conversion branch's parent family (its schedule starts at ``branch_step``)."""

    @property
    def schedule(self) -> Schedule:
        """The schedule the run trains with: a conversion branch's is laid over its own steps."""
        cfg = self.cfg
        if self.converts_from:
            return Schedule.for_optimizer(
                cfg.optim, cfg.schedule, cfg.steps, start=self.branch_step, lr_scale=cfg.convert.lr_scale
            )
        return Schedule.for_optimizer(cfg.optim, cfg.schedule, cfg.steps)

    @property
    def run_dir(self) -> Path:
        return Path(self.cfg.run_dir)

    @property
    def devices(self) -> int:
        return self.tensor_parallel * self.data_parallel

    @property
    def nodes(self) -> int:
        return max(1, math.ceil(self.devices / self.devices_per_node))

    @property
    def devices_on_node(self) -> int:
        """Processes per node: all of a run's devices when it fits in one node, else a full node."""
        return min(self.devices, self.devices_per_node)


@dataclasses.dataclass
class Suite:
    """A loaded suite: its definition, where it came from and its runs (in family, size, budget order)."""

    config: SuiteConfig
    path: Path
    runs: list[SuiteRun]

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def root(self) -> Path:
        return self.config.root_dir

    def run(self, name: str) -> SuiteRun:
        for r in self.runs:
            if r.name == name:
                return r
        raise ConfigError(f"{self.path}: no run {name!r} (runs: {', '.join(r.name for r in self.runs)})")


def suite_path(name_or_path: str | Path) -> Path:
    """``spectra`` → ``configs/suites/spectra.yaml``; a path is returned as is (if it exists)."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.is_file():
            raise ConfigError(f"{path}: no such suite file")
        return path
    candidate = SUITE_DIR / f"{name_or_path}.yaml"
    if candidate.is_file():
        return candidate
    known = sorted(p.stem for p in SUITE_DIR.glob("*.yaml"))
    raise ConfigError(f"unknown suite {str(name_or_path)!r}: not a file, and not one of {', '.join(known)}")


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` on top of ``base``: nested mappings are merged key by key, everything else replaced."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _find_template(pattern: str, family: str, size: str, suite_file: Path) -> Path:
    try:
        text = pattern.format(family=family, size=size)
    except (KeyError, IndexError, ValueError, AttributeError) as exc:
        raise ConfigError(
            f"families.{family}.config: {pattern!r} is not a path with {{family}} and {{size}} fields"
            f" ({type(exc).__name__}: {exc})"
        ) from None
    path = Path(text)
    if path.is_absolute():
        candidates = [path]
    else:
        candidates = [suite_file.parent / path, Path.cwd() / path, packaged(path)]
    for c in candidates:
        try:
            if c.is_file():
                return c
        except (OSError, ValueError):  # a name too long for the file system, a NUL byte
            continue
    tried = ", ".join(dict.fromkeys(str(c) for c in candidates))
    raise ConfigError(f"families.{family}.config: template {text!r} not found (tried {tried})")


def _read_yaml(path: Path) -> dict[str, Any]:
    data = read_yaml_file(path, "template run config") or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of run-config keys")
    return data


def budget_label(tokens: int) -> str:
    """300_000_000_000 → ``300b``, 2_000_000 → ``2m``, 655_360 → ``655k`` (for run names)."""
    for unit, scale in (("t", 1e12), ("b", 1e9), ("m", 1e6), ("k", 1e3)):
        if tokens >= scale:
            value = tokens / scale
            return f"{value:.3g}{unit}".replace(".", "p")
    return str(tokens)


def _section(data: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    """A section of a run config being assembled, which the suite adds keys to; it must be a mapping."""
    section = data.get(key) or {}
    if not isinstance(section, dict):
        raise ConfigError(f"{where}: {key}: expected a mapping, got {shown(section)}")
    return dict(section)


def _run_config(
    suite: SuiteConfig, fam: FamilySpec, size: SizeSpec, tokens: int, name: str, suite_file: Path
) -> TrainConfig:
    template = _find_template(fam.config, fam.name, size.name, suite_file)
    where = f"run {name} (template {template})"
    data = deep_merge(_read_yaml(template), suite.overrides)
    data = deep_merge(data, fam.overrides)
    data = deep_merge(data, size.overrides)
    data = deep_merge(data, size.family_overrides.get(fam.name, {}))
    model = {k: v for k, v in _section(data, "model", where).items() if k != "preset"}
    model = {**model, **size.model, "preset": f"{fam.name}-{size.preset or size.name}"}
    model["name"] = f"{fam.name}-{size.name}"
    data["model"] = model
    if size.tensor_parallel:
        data["parallel"] = {**_section(data, "parallel", where), "tensor_parallel": size.tensor_parallel}
    if size.micro_batch:
        data["micro_batch"] = size.micro_batch
    if fam.batch_tokens:
        data["batch_tokens"] = fam.batch_tokens
    if suite.seq_len:
        data["seq_len"] = suite.seq_len
    if suite.checkpoint:
        data["checkpoint"] = {**_section(data, "checkpoint", where), **suite.checkpoint}
    root = suite.root_dir
    if suite.data.embedded:
        dirs = {
            "train_dir": str(root / "data" / "train"),
            "valid_dir": str(root / "data" / "validation"),
            "tokenizer": str(root / "data" / "tokenizer.model"),
        }
        data["model"]["vocab_size"] = suite.data.vocab_size
    else:
        dirs = {k: getattr(suite.data, k) for k in ("train_dir", "valid_dir", "tokenizer")}
    data["data"] = {**_section(data, "data", where), **{k: v for k, v in dirs.items() if v}}
    data["tokens"] = tokens
    data["run_dir"] = str(root / name)
    try:
        return TrainConfig.from_dict(data)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def is_parent_itself(cfg: TrainConfig, branch: Any, shape: str) -> bool:
    """A branch as long as its parent, cooling down like it: the parent's own final checkpoint is that
    branch, and nothing needs training."""

    sched = Schedule.for_optimizer(cfg.optim, cfg.schedule, cfg.steps)
    return (
        branch.steps == cfg.steps
        and branch.cooldown_steps == sched.cooldown_steps
        and shape == cfg.schedule.cooldown_shape
    )


def _keep_branch_states(cfg: TrainConfig, cooldown: SuiteCooldownConfig, name: str) -> TrainConfig:
    """The parent keeps a state (and a snapshot) where each of its branches' cooldowns starts."""

    if cfg.schedule.kind != "wsd":
        raise ConfigError(
            f"run {name}: cooldown.at asks for cooldown branches, but its schedule is kind"
            f" {cfg.schedule.kind!r}: branches need a WSD parent (schedule.kind: wsd), whose rate before a"
            " cooldown does not depend on the run's length"
        )
    sched = Schedule.for_optimizer(cfg.optim, cfg.schedule, cfg.steps)
    starts = []
    for at in cooldown.at:
        branch = cooldown_branch(cfg.steps, at, cooldown.fraction)
        assert sched.cooldown_start is not None  # a WSD schedule has a cooldown
        if branch.start < max(sched.warmup_steps, 1) or branch.start > sched.cooldown_start:
            raise ConfigError(
                f"run {name}: the branch at {at:g} would start at step {branch.start}, outside the parent's"
                f" stable phase (steps {sched.warmup_steps}–{sched.cooldown_start})"
            )
        if not is_parent_itself(cfg, branch, cooldown.shape):
            starts.append(branch.start)
    kept = sorted({*cfg.checkpoint.keep_states_at, *starts})
    return cfg.replace(checkpoint=cfg.checkpoint.replace(keep_states_at=kept))


def _keep_conversion_states(
    cfg: TrainConfig, conversions: list[SuiteConversionConfig], family: str, name: str
) -> TrainConfig:
    """The parent keeps a state (and a snapshot) where each of its conversion branches starts."""

    starts = []
    for i, conv in enumerate(conversions):
        if conv.parents == family:
            try:
                starts.append(conv.start_step(cfg))
            except ConfigError as exc:
                raise ConfigError(f"run {name}: conversions[{i}].{exc}") from None
    if not starts:
        return cfg
    kept = sorted({*cfg.checkpoint.keep_states_at, *starts})
    return cfg.replace(checkpoint=cfg.checkpoint.replace(keep_states_at=kept))


def expand(suite: SuiteConfig, suite_file: Path, families: list[str] | None = None) -> list[SuiteRun]:
    """The suite's runs; ``families`` picks families by name (default: every non-optional one)."""
    known = {f.name: f for f in suite.families}
    if families:
        unknown = [f for f in families if f not in known]
        if unknown:
            raise ConfigError(f"families {unknown} are not in suite {suite.name} (it has {sorted(known)})")
        chosen = [known[f] for f in families]
    else:
        chosen = [f for f in suite.families if not f.optional]
    runs = []
    for fam in chosen:
        for size in [s for s in suite.sizes if not fam.sizes or s.name in fam.sizes]:
            for tokens in suite.tokens:
                name = f"{fam.name}-{size.name}"
                if len(suite.tokens) > 1:
                    name += f"-{budget_label(tokens)}"
                cfg = _run_config(suite, fam, size, tokens, name, suite_file)
                if suite.cooldown.at:
                    cfg = _keep_branch_states(cfg, suite.cooldown, name)
                cfg = _keep_conversion_states(cfg, suite.conversions, fam.name, name)
                tp = cfg.parallel.tensor_parallel
                dp = size.data_parallel or suite.hardware.data_parallel
                per_node = suite.hardware.devices_per_node
                devices = tp * dp
                try:
                    cfg.accumulation(dp)
                    require(
                        devices <= per_node or devices % per_node == 0,
                        f"{devices} devices (TP {tp} × DP {dp}) do not fill whole nodes of"
                        f" hardware.devices_per_node={per_node}",
                    )
                except ConfigError as exc:
                    raise ConfigError(f"run {name}: {exc}") from None
                runs.append(SuiteRun(name, fam.name, size.name, tokens, cfg, tp, dp, per_node))
    return runs


def load_suite(
    name_or_path: str | Path,
    *,
    families: list[str] | None = None,
    root: str | Path | None = None,
    tokens: list[int] | None = None,
) -> Suite:
    """Load, validate and expand a suite; ``root`` replaces its run directory, ``tokens`` its budgets."""
    path = suite_path(name_or_path)
    try:
        cfg = SuiteConfig.from_yaml(path)
        if root is not None:
            cfg = cfg.replace(root=str(root))
        if tokens:
            cfg = cfg.replace(tokens=list(tokens))
        runs = expand(cfg, path, families)
    except ConfigError as exc:
        message = str(exc)
        raise ConfigError(message if message.startswith(str(path)) else f"{path}: {message}") from None
    return Suite(cfg, path, runs)


def shown_path(path: Path) -> str:
    """A path as plans and reports print it (they are committed): an installed config as ``configs/...``
    (the same text in a checkout and from a wheel), else relative to the current directory when inside it,
    else as given."""
    resolved = path.resolve()
    for base, prefix in ((config_dir().resolve(), Path("configs")), (Path.cwd().resolve(), Path())):
        if resolved.is_relative_to(base):
            return str(prefix / resolved.relative_to(base))
    return str(path)
