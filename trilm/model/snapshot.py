"""The snapshot directory: typed metadata, the config file, and packed snapshots (QuantLMs, packed exports).

A snapshot is what everything downstream of training reads::

    config.json           {"format": "trilm-snapshot", "version", "model": ModelConfig, "meta": SnapshotMeta}
    model.safetensors     canonical float tensors (latent weights of TriLM/BiLM)
    packed.safetensors    optional: packed block linears (``trilm.formats``), named by canonical name
                          without ``.weight`` (``layers.0.attn.wq``); their float tensors are then absent
                          from model.safetensors
    tokenizer.model       optional: the SentencePiece model (exports and QuantLMs carry it; a training run
                          keeps it two levels up, in the run directory)

This module reads and writes those files without importing megatron, so inference, post-hoc and evaluation
code depend only on it and on the config.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch

from trilm.config import ConfigError
from trilm.model.config import ModelConfig
from trilm.model.spec import canonical_shapes

SNAPSHOT_FORMAT = "trilm-snapshot"
SNAPSHOT_VERSION = 1
WEIGHTS_FILE = "model.safetensors"
PACKED_FILE = "packed.safetensors"
CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.model"


@dataclasses.dataclass
class SnapshotMeta:
    """What a snapshot records about how it was made; every reader goes through this one type.

    Training fills the counts and losses; ``size`` is the family-free size name (``tiny``, ``1.1b``) so that
    rows of TriLM, FloatLM and BiLM of one size pair in the results table. Post-hoc methods and pruning
    describe themselves under ``extra`` (``extra["quant"]``, ``extra["pruning"]``); keys this class does not
    know are kept in ``extra`` too, so reading and writing a snapshot loses nothing.
    """

    step: int | None = None
    tokens: int | None = None
    samples: int | None = None
    run: str | None = None
    family: str | None = None
    size: str | None = None
    params: int | None = None
    nonembedding_params: int | None = None
    linear_params: int | None = None
    scale_partitions: int | None = None
    flops: float | None = None
    tokenizer_hash: str | None = None
    train_loss: float | None = None
    val_loss: float | None = None
    imported_from: str | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> SnapshotMeta:
        data = dict(data or {})
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        extra = dict(data.pop("extra", None) or {})
        known = {k: data.pop(k) for k in list(data) if k in names}
        extra.update(data)
        meta = cls(**known, extra=extra)
        if meta.family and meta.size and meta.size.startswith(f"{meta.family}-"):
            meta.size = meta.size[len(meta.family) + 1 :]  # snapshots written before sizes were family-free
        return meta

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
        out = {k: v for k, v in out.items() if v is not None}
        if self.extra:
            out["extra"] = self.extra
        return out


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_snapshot_config(directory: str | Path, cfg: ModelConfig, meta: SnapshotMeta | None = None) -> Path:
    directory = Path(directory)
    payload = {
        "format": SNAPSHOT_FORMAT,
        "version": SNAPSHOT_VERSION,
        "model": cfg.to_dict(),
        "meta": (meta or SnapshotMeta()).to_dict(),
    }
    _atomic_write_text(directory / CONFIG_FILE, json.dumps(payload, indent=2))
    return directory / CONFIG_FILE


def read_snapshot(directory: str | Path) -> tuple[ModelConfig, SnapshotMeta]:
    """(model config, metadata) of a snapshot directory; errors name the file and the bad key."""
    path = Path(directory) / CONFIG_FILE
    try:
        payload = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: not found (is {directory} a trilm snapshot?)") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: invalid JSON: {exc}") from None
    if not isinstance(payload, dict) or payload.get("format") != SNAPSHOT_FORMAT:
        found = payload.get("format") if isinstance(payload, dict) else None
        raise ConfigError(f"{path}: format {found!r} is not {SNAPSHOT_FORMAT!r}")
    try:
        cfg = ModelConfig.from_dict(payload["model"], prefix="model.")
    except KeyError:
        raise ConfigError(f"{path}: missing key 'model'") from None
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    meta = payload.get("meta") or {}
    if not isinstance(meta, dict):
        raise ConfigError(f"{path}: 'meta' must be a mapping, got {type(meta).__name__}")
    try:
        return cfg, SnapshotMeta.from_dict(meta)
    except TypeError as exc:
        raise ConfigError(f"{path}: meta: {exc}") from None


def is_snapshot(directory: str | Path) -> bool:
    path = Path(directory) / CONFIG_FILE
    if not path.is_file():
        return False
    try:
        return json.loads(path.read_text()).get("format") == SNAPSHOT_FORMAT
    except (json.JSONDecodeError, AttributeError, OSError):
        return False


def is_packed_snapshot(directory: str | Path) -> bool:
    return (Path(directory) / PACKED_FILE).is_file()


def write_packed_snapshot(
    directory: str | Path,
    cfg: ModelConfig,
    float_state: dict[str, torch.Tensor],
    packed_layers: dict[str, Any],
    meta: SnapshotMeta | None = None,
    tokenizer: str | Path | None = None,
) -> Path:
    """Write a snapshot whose block linears (all or some) are packed weights.

    ``packed_layers`` maps canonical names without ``.weight`` to :class:`trilm.formats.PackedWeight`;
    ``float_state`` holds every other canonical tensor. Together they must cover the model's canonical
    tensors exactly once (checked here, so a reader never meets a half model).
    """
    from safetensors.torch import save_file

    from trilm.formats import save_packed

    directory = Path(directory)
    shapes = canonical_shapes(cfg)
    expected = set(shapes)
    given = set(float_state) | {f"{name}.weight" for name in packed_layers}
    both = set(float_state) & {f"{name}.weight" for name in packed_layers}
    if both:
        raise ConfigError(f"{directory}: tensors given both packed and float: {sorted(both)[:3]}")
    if given != expected:
        missing, unexpected = sorted(expected - given), sorted(given - expected)
        raise ConfigError(
            f"{directory}: packed snapshot does not match the model: missing {missing[:3]}, "
            f"unexpected {unexpected[:3]}"
        )
    found = {k: tuple(v.shape) for k, v in float_state.items()}
    found.update({f"{k}.weight": tuple(v.shape) for k, v in packed_layers.items()})
    wrong = [f"{k} {found[k]} (expected {shapes[k]})" for k in shapes if found[k] != shapes[k]]
    if wrong:
        raise ConfigError(f"{directory}: tensor shapes do not match the model config: {wrong[:3]}")
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / (WEIGHTS_FILE + ".tmp")
    save_file({k: v.detach().contiguous().cpu() for k, v in float_state.items()}, str(tmp))
    os.replace(tmp, directory / WEIGHTS_FILE)
    save_packed(directory / PACKED_FILE, packed_layers, metadata={"format": SNAPSHOT_FORMAT})
    if tokenizer is not None:
        data = Path(tokenizer).read_bytes()
        tmp = directory / (TOKENIZER_FILE + ".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, directory / TOKENIZER_FILE)
    write_snapshot_config(directory, cfg, meta)
    return directory


def read_packed_layers(directory: str | Path, device: str | torch.device = "cpu") -> dict[str, Any]:
    """Packed layers by canonical name without ``.weight``; {} for a snapshot without packed layers."""
    path = Path(directory) / PACKED_FILE
    if not path.is_file():
        return {}
    from trilm.formats import load_packed

    layers, _ = load_packed(path, device=device)
    return layers


def tokenizer_path(directory: str | Path, meta: SnapshotMeta | None = None) -> Path | None:
    """The SentencePiece model of a snapshot: its own copy, else the run directory's (``../../``).

    When the snapshot records a tokenizer hash, a candidate with another hash is skipped, so a copied
    snapshot never silently pairs with the wrong tokenizer.
    """
    directory = Path(directory)
    for candidate in (directory / TOKENIZER_FILE, directory.parent.parent / TOKENIZER_FILE):
        if not candidate.is_file():
            continue
        recorded = meta.tokenizer_hash if meta is not None else None
        if recorded and hashlib.sha256(candidate.read_bytes()).hexdigest() != recorded:
            continue
        return candidate
    return None
