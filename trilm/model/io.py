"""Build, save and load training models; the snapshot files themselves are :mod:`trilm.model.snapshot`.

Snapshots hold the *latent* weights and the resolved config (including the number of scale partitions), so
they load at any tensor-parallel degree and reproduce the logits of the run that wrote them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from trilm.config import ConfigError
from trilm.model.config import ModelConfig, preset
from trilm.model.snapshot import (
    SNAPSHOT_FORMAT,
    WEIGHTS_FILE,
    SnapshotMeta,
    is_packed_snapshot,
    read_snapshot,
    write_snapshot_config,
)
from trilm.model.transformer import Decoder
from trilm.parallel import current_parallel, ensure_parallel


def as_model_config(cfg: ModelConfig | str) -> ModelConfig:
    return preset(cfg) if isinstance(cfg, str) else cfg


def build_model(
    cfg: ModelConfig | str,
    *,
    tp: int | None = None,
    seed: int | None = 0,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
) -> Decoder:
    """A model on the current parallel layout (initialising a single-process one if there is none)."""
    cfg = as_model_config(cfg)
    info = ensure_parallel(tp) if tp is not None else _layout_or_default()
    model = Decoder(cfg, info, seed=seed)
    if device is not None or dtype is not None:
        model = model.to(device=device, dtype=dtype)
    return model


def _layout_or_default():
    try:
        return current_parallel()
    except RuntimeError:
        return ensure_parallel(1)


def save_model(
    model: Decoder, directory: str | Path, meta: SnapshotMeta | dict[str, Any] | None = None
) -> Path:
    """Write a snapshot (all TP ranks must call it: weights are gathered; rank 0 writes)."""
    directory = Path(directory)
    state = model.full_state_dict()
    if current_parallel().rank != 0:
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / (WEIGHTS_FILE + ".tmp")
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp), metadata={"format": SNAPSHOT_FORMAT})
    os.replace(tmp, directory / WEIGHTS_FILE)
    if not isinstance(meta, SnapshotMeta):
        meta = SnapshotMeta.from_dict(meta)
    write_snapshot_config(directory, model.cfg, meta)
    return directory


def load_model(
    directory: str | Path,
    *,
    tp: int | None = None,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
) -> Decoder:
    """Load a snapshot onto the current (or a new single-process) tensor-parallel layout."""
    cfg, _ = read_snapshot(directory)
    if is_packed_snapshot(directory):
        raise ConfigError(
            f"{directory}: a packed snapshot (QuantLM or packed export) has no latent weights to train; "
            "load it for inference with trilm.infer.load_inference_model"
        )
    model = build_model(cfg, tp=tp, seed=None)
    model.load_full_state_dict(load_file(str(Path(directory) / WEIGHTS_FILE)))
    if device is not None or dtype is not None:
        model = model.to(device=device, dtype=dtype)
    return model
