"""Models: TriLM (ternary), FloatLM and BiLM (binary) decoders on megatron-core tensor parallelism.

Public API::

    from trilm.model import preset, build_model
    model = build_model("trilm-tiny")          # single process, TP=1 unless parallel state says otherwise
    logits = model(input_ids)                  # [batch, seq, padded_vocab]

Snapshots on disk are the store's (``trilm.store.open_model``; a training model to and from a directory:
``trilm.train.models.load_model``/``save_model``): this package describes models and never opens a
directory.

The training decoder imports megatron-core; configs, counts and snapshot metadata do not. The names that
need megatron are imported on first use, so inference, post-hoc and evaluation code (``trilm.infer``) can
use ``trilm.model.config`` and ``trilm.model.snapshot`` without paying for it.
"""

import importlib

from trilm.model.config import LayerShape, ModelConfig, QuantConfig, preset, preset_names
from trilm.model.flops import ParamCounts, flops_per_token, parameter_counts
from trilm.model.snapshot import SnapshotMeta

_LAZY = {
    "Decoder": "trilm.model.transformer",
    "build_model": "trilm.model.build",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'trilm.model' has no attribute {name!r}")


__all__ = [
    "Decoder",
    "LayerShape",
    "ModelConfig",
    "ParamCounts",
    "QuantConfig",
    "SnapshotMeta",
    "build_model",
    "flops_per_token",
    "parameter_counts",
    "preset",
    "preset_names",
]
