"""Build training models (megatron-core tensor parallel); snapshots on disk are :mod:`trilm.store`'s."""

from __future__ import annotations

import torch

from trilm.model.config import ModelConfig, preset
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
