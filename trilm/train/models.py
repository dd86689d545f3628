"""Training models (megatron-core tensor parallel) to and from model directories.

The store (:mod:`trilm.store`) opens, verifies and writes directories and knows nothing of megatron; this
module puts a training :class:`~trilm.model.transformer.Decoder` on either side of it.

Snapshots hold the *latent* weights and the resolved config (including the number of scale partitions), so
they load at any tensor-parallel degree and reproduce the logits of the run that wrote them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from trilm.model.snapshot import SnapshotMeta
from trilm.parallel import current_parallel
from trilm.store.errors import StoreError
from trilm.store.open import open_model
from trilm.store.snapshot import write_snapshot


def save_model(
    model, directory: str | Path, meta: SnapshotMeta | dict[str, Any] | None = None, *, replace: bool = False
) -> Path:
    """Write a complete snapshot of a training model (all TP ranks call it: weights are gathered, rank 0
    writes). ``directory`` must be new or empty unless ``replace``."""

    directory = Path(directory)
    state = model.full_state_dict()
    if current_parallel().rank != 0:
        return directory
    if not isinstance(meta, SnapshotMeta):
        meta = SnapshotMeta.from_dict(meta)
    return write_snapshot(directory, model.cfg, meta, state, replace=replace)


def load_model(
    directory: str | Path,
    *,
    tp: int | None = None,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
):
    """A training model (megatron Decoder) from a snapshot or HF directory, on the current (or a new
    single-process) tensor-parallel layout; weights verified as :func:`open_model` does."""
    # deferred for start-up time: loads megatron only when called
    from trilm.model.build import build_model

    opened = open_model(directory)
    if opened.stored_packed:
        raise StoreError(
            f"{directory}: a packed snapshot (QuantLM or packed export) has no latent weights to train; "
            "load it for inference with trilm.infer.load_inference_model"
        )
    model = build_model(opened.config, tp=tp, seed=None)
    model.load_full_state_dict(opened.weights.float_state())
    if device is not None or dtype is not None:
        model = model.to(device=device, dtype=dtype)
    return model
