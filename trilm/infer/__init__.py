"""Inference without megatron: the lean decoder and the loaders that fill it from any trilm model.

::

    from trilm.infer import load_inference_model
    model = load_inference_model("runs/quickstart/trilm-tiny/snapshots/step-120")         # γ·Ŵ as floats
    model = load_inference_model(snapshot, packed=True)        # ternary/binary QuantLinear layers
    model = load_inference_model("quantlm-gptq-w4/")            # a packed snapshot (QuantLM)
    model = load_inference_model("hf-llama-dir/")               # a Hugging Face LlamaForCausalLM
    logits = model(input_ids)
"""

from trilm.infer.fuse import fuse_projections
from trilm.infer.load import (
    dequantize_latent,
    from_state_dict,
    load_inference_model,
    load_with_meta,
    pack_latent,
    prepare_for_inference,
)
from trilm.infer.model import InferenceBlock, InferenceModel, apply_rotary

__all__ = [
    "InferenceBlock",
    "InferenceModel",
    "apply_rotary",
    "dequantize_latent",
    "from_state_dict",
    "fuse_projections",
    "load_inference_model",
    "load_with_meta",
    "pack_latent",
    "prepare_for_inference",
]
