"""The model a pruning run starts from: any float or latent model :func:`trilm.store.open_model` opens.

Pruning slices the stored weights — for TriLM/BiLM the latent weights, which re-quantize when the smaller
model loads — so it needs canonical tensors, not packed codes: a packed snapshot (a QuantLM from the
post-hoc methods, or a packed export) is refused with the way out (prune first, quantize after).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from trilm.config import ConfigError
from trilm.model.config import ModelConfig
from trilm.model.snapshot import SnapshotMeta
from trilm.store.open import ModelDir, open_model


@dataclasses.dataclass
class Source:
    path: Path
    cfg: ModelConfig
    meta: SnapshotMeta
    state: dict[str, torch.Tensor]
    """Canonical tensors as stored (latent weights for TriLM/BiLM)."""
    tokenizer: Path | None
    kind: str
    """The store's kind of the directory (``run-snapshot``, ``snapshot``, ``pruned``, ``hf``, …)."""


def open_prunable(path: str | Path) -> ModelDir:
    """The opened model, refused when it cannot be pruned (weights not loaded: bad input fails early)."""
    opened = open_model(path)
    if opened.stored_packed:
        method = opened.meta.extra.get("quant", {}).get("method", "packed")
        raise ConfigError(
            f"{opened.given}: a packed snapshot ({method} QuantLM or packed export) holds quantized codes, "
            "not weights that can be sliced; prune the float (or latent TriLM) model first, then quantize"
        )
    return opened


def load_source(opened: ModelDir) -> Source:
    """The weights of an opened prunable model (verified by the store as they are read)."""
    state = opened.weights.float_state()
    return Source(opened.given, opened.config, opened.meta, state, opened.tokenizer.path, opened.kind)
