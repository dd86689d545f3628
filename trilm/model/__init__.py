"""Models: TriLM (ternary), FloatLM and BiLM (binary) decoders on megatron-core tensor parallelism.

Public API::

    from trilm.model import preset, build_model, save_model, load_model
    model = build_model("trilm-tiny")          # single process, TP=1 unless parallel state says otherwise
    logits = model(input_ids)                  # [batch, seq, padded_vocab]
    save_model(model, "snap/"); model = load_model("snap/")
"""

from trilm.model.config import FAMILIES, ModelConfig, QuantConfig, preset, preset_names
from trilm.model.flops import ParamCounts, flops_per_token, parameter_counts
from trilm.model.io import build_model, load_model, read_snapshot_config, save_model
from trilm.model.transformer import Decoder

__all__ = [
    "FAMILIES",
    "Decoder",
    "ModelConfig",
    "ParamCounts",
    "QuantConfig",
    "build_model",
    "flops_per_token",
    "load_model",
    "parameter_counts",
    "preset",
    "preset_names",
    "read_snapshot_config",
    "save_model",
]
