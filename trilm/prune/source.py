"""The model a pruning run starts from: a trilm snapshot or a Hugging Face Llama directory.

Pruning slices the stored weights — for TriLM/BiLM the latent weights, which re-quantize when the smaller
model loads — so it needs canonical tensors, not packed codes: a packed snapshot (a QuantLM from the
post-hoc methods, or a packed export) is refused with the way out (prune first, quantize after).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from safetensors.torch import load_file

from trilm.config import ConfigError
from trilm.model.config import ModelConfig
from trilm.model.snapshot import (
    WEIGHTS_FILE,
    SnapshotMeta,
    is_packed_snapshot,
    is_snapshot,
    read_snapshot,
    tokenizer_path,
)


@dataclasses.dataclass
class Source:
    path: Path
    cfg: ModelConfig
    meta: SnapshotMeta
    state: dict[str, torch.Tensor]
    """Canonical tensors as stored (latent weights for TriLM/BiLM)."""
    tokenizer: Path | None
    kind: str
    """``snapshot`` or ``hf``."""


def read_config(path: str | Path) -> tuple[ModelConfig, SnapshotMeta, str]:
    """(config, metadata, kind) without loading weights, so bad input fails before any heavy work."""
    path = Path(path)
    if not path.is_dir():
        raise ConfigError(f"{path}: not a directory (expected a trilm snapshot or a Hugging Face model)")
    if is_snapshot(path):
        cfg, meta = read_snapshot(path)
        if is_packed_snapshot(path) or "quant" in meta.extra:
            method = (meta.extra.get("quant") or {}).get("method", "packed")
            raise ConfigError(
                f"{path}: a packed snapshot ({method} QuantLM or packed export) holds quantized codes, not "
                "weights that can be sliced; prune the float (or latent TriLM) model first, then quantize"
            )
        kind = "snapshot"
    elif (path / "config.json").is_file():
        from trilm.model.hf import model_config_from_hf, read_hf_config

        cfg = model_config_from_hf(read_hf_config(path), path=str(path / "config.json"))
        meta = SnapshotMeta(imported_from=str(path), family=cfg.family)
        kind = "hf"
    else:
        raise ConfigError(f"{path}: no config.json (expected a trilm snapshot or a Hugging Face model)")
    return cfg, meta, kind


def load_source(path: str | Path) -> Source:
    path = Path(path)
    cfg, meta, kind = read_config(path)
    if kind == "snapshot":
        weights = path / WEIGHTS_FILE
        if not weights.is_file():
            raise ConfigError(f"{weights}: not found")
        state = load_file(str(weights))
        tok = tokenizer_path(path, meta)
    else:
        from trilm.model.hf import import_hf

        cfg, state = import_hf(path)
        candidate = path / "tokenizer.model"
        tok = candidate if candidate.is_file() else None
    return Source(path, cfg, meta, state, tok, kind)
