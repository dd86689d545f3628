"""Hugging Face interop: trilm canonical tensors and config ⇄ ``LlamaForCausalLM`` names and config.

The directories themselves are read and written by :mod:`trilm.store.hf`; this module is the mapping.

Export writes what Spectra released: an ordinary LLaMA checkpoint. For TriLM/BiLM the block weights are the
*materialised* quantized values γ·Ŵ ("unpacked"), with ``pretraining_model_parallel`` in config.json
naming the scale partitions, so plain transformers reproduces the ternary model's logits. ``config.json``
is written in the key names of transformers 4.x *and* 5.x (``rope_theta`` and ``rope_parameters``,
``torch_dtype`` and ``dtype``): a 4.x reader of a 5.x-only file silently falls back to θ = 10,000.

Import reads such a directory back — and the Llamas people ship: tied embeddings (the head becomes a copy
of the embedding, and the tie is recorded so exports write it tied again), an explicit ``head_dim``,
``linear`` and ``llama3`` RoPE scaling — and refuses what a trilm model cannot represent instead of
dropping it: another RoPE type or key, an activation other than SiLU, biases. A missing, unexpected or
misshapen tensor is named by its Hugging Face name.

A FloatLM comes back as is. An unpacked TriLM/BiLM cannot return its latent weights (they were never
released), but its forward pass can be recovered exactly: per scale cell the latent weights are set to
W̃·(γ − ε)/mean|W̃|, whose absmean re-quantization yields the same codes and γ.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from trilm.config import ConfigError
from trilm.dtypes import dtype_name
from trilm.model.config import ModelConfig, QuantConfig, RopeScaling
from trilm.model.quant import ScaleLayout, canonical_layout, dequantize_latent, weight_scales
from trilm.model.spec import TOP_TENSORS, canonical_shapes, hf_name

DEFAULT_BOS_ID, DEFAULT_EOS_ID = 1, 2  # trilm's SentencePiece ids (unk 0, bos 1, eos 2)
_SILU = ("silu", "swish")


def check_uniform(cfg: ModelConfig) -> None:
    """Refuse per-layer shapes (structurally pruned models): a LlamaConfig has one size for every layer."""
    if not cfg.is_uniform:
        raise ConfigError(
            f"{cfg.name}: per-layer head counts / FFN widths (a structurally pruned model) cannot be "
            "expressed in a Hugging Face LlamaConfig, which has one size for every layer; use the trilm "
            "snapshot or the packed export instead"
        )


def dequantized_state_dict(cfg: ModelConfig, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Canonical tensors with every quantized block matrix replaced by its quantized image γ·Ŵ."""
    return {name: dequantize_latent(cfg, name, tensor) for name, tensor in state.items()}


def hf_config_dict(
    cfg: ModelConfig,
    dtype: torch.dtype = torch.float32,
    *,
    bos_token_id: int | list[int] | None = DEFAULT_BOS_ID,
    eos_token_id: int | list[int] | None = DEFAULT_EOS_ID,
    tied: bool = False,
) -> dict[str, Any]:
    """``config.json`` of a ``LlamaForCausalLM``, readable by transformers 4.x and 5.x alike (``tied``: the
    LM head is the embedding, and ``model.safetensors`` holds no ``lm_head.weight``)."""
    check_uniform(cfg)
    name = dtype_name(dtype)
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": cfg.padded_vocab,
        "hidden_size": cfg.hidden,
        "intermediate_size": cfg.ffn,
        "num_hidden_layers": cfg.layers,
        "num_attention_heads": cfg.heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.context,
        "initializer_range": cfg.init_std,
        "rms_norm_eps": cfg.norm_eps,
        "use_cache": True,
        "pad_token_id": None,
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
        "pretraining_tp": 1,
        "tie_word_embeddings": tied,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        **rope_config_dicts(cfg),  # rope_theta + rope_scaling (4.x), rope_parameters (5.x)
        "torch_dtype": name,  # transformers 4.x
        "dtype": name,  # transformers 5.x
        "pretraining_model_parallel": cfg.scale_partitions(1) if cfg.family != "floatlm" else 1,
        "trilm": {
            "family": cfg.family,
            "name": cfg.name,
            "vocab_size": cfg.vocab_size,
            "pad_vocab_to": cfg.pad_vocab_to,
            "quant": cfg.quant.to_dict(),
        },
    }


def generation_config_dict(
    bos_token_id: int | list[int] | None, eos_token_id: int | list[int] | None
) -> dict[str, Any]:
    """``generation_config.json``: the special ids; greedy unless the caller asks to sample."""
    return {"bos_token_id": bos_token_id, "eos_token_id": eos_token_id, "do_sample": False}


def _restore_latent(w: torch.Tensor, layout: ScaleLayout) -> torch.Tensor:
    """Latent weights whose absmean quantization gives back the materialised values ``w`` exactly.

    Per scale cell, γ = mean|W̃| / (fraction of non-zeros); scaling the cell by (γ − ε)/mean|W̃| makes the
    re-computed scale ε + mean|W| equal γ, and every code keeps its sign or zero.
    """
    if layout.fmt == "binary":
        return w.clone()
    plain = dataclasses.replace(layout, eps=0.0)
    wf = w.float()
    absmean = weight_scales(wf, plain)
    nonzero = weight_scales((wf != 0).float(), plain)
    gamma = torch.where(nonzero > 0, absmean / nonzero.clamp(min=1e-30), torch.zeros_like(absmean))
    safe = absmean.clamp(min=1e-30)
    factor = torch.where(absmean > 0, (gamma - layout.eps).clamp(min=0) / safe, torch.ones_like(absmean))
    return (wf * factor).to(w.dtype)


_ROPE_KEYS = {
    "default": set(),
    "linear": {"factor"},
    "llama3": {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"},
}


def _rope(data: dict, path: str) -> tuple[float, RopeScaling | None]:
    """(θ, scaling) from either key form (4.x ``rope_theta`` + ``rope_scaling``, 5.x ``rope_parameters``).

    Default, ``linear`` and ``llama3`` RoPE are read; any other type, or a key of a supported type that
    trilm does not implement, is refused by name (importing it would change the logits)."""
    params = data.get("rope_parameters") or {}
    if not isinstance(params, dict):
        raise ConfigError(f"{path}: rope_parameters {params!r}: expected an object")
    scaling = data.get("rope_scaling") or {}
    if not isinstance(scaling, dict):
        raise ConfigError(f"{path}: rope_scaling {scaling!r}: expected an object")
    found = [(key, value) for key, value in (("rope_scaling", scaling), ("rope_parameters", params)) if value]
    described = {}
    for key, value in found:
        kind = value.get("rope_type", value.get("type", "default"))
        if kind not in _ROPE_KEYS:
            raise ConfigError(
                f"{path}: {key}.rope_type {kind!r} is not supported (trilm implements default, linear and "
                "llama3 RoPE; importing would change the logits)"
            )
        extra = sorted(set(value) - _ROPE_KEYS[kind] - {"rope_type", "type", "rope_theta"})
        if extra:
            raise ConfigError(
                f"{path}: {key}.{extra[0]} is not supported for {kind} RoPE (trilm reads "
                f"{sorted(_ROPE_KEYS[kind]) or 'no other keys'})"
            )
        described[key] = (kind, {k: value[k] for k in _ROPE_KEYS[kind] if k in value})
    both = len(described) == 2 and described["rope_scaling"] != described["rope_parameters"]
    if both and (described["rope_parameters"][0] != "default" or described["rope_scaling"][0] == "default"):
        raise ConfigError(
            f"{path}: rope_scaling {scaling} and rope_parameters {params} describe different RoPE"
        )
    kind, values = described.get("rope_scaling") or described.get("rope_parameters") or ("default", {})
    theta = params.get("rope_theta", data.get("rope_theta", 10000.0))
    if "rope_theta" in params and "rope_theta" in data and float(data["rope_theta"]) != float(theta):
        raise ConfigError(
            f"{path}: rope_theta {data['rope_theta']} and rope_parameters.rope_theta {theta} disagree"
        )
    if kind == "default":
        return float(theta), None
    missing = sorted(_ROPE_KEYS[kind] - set(values))
    if missing:
        raise ConfigError(f"{path}: rope_scaling ({kind}) lacks {missing[0]!r}")
    try:
        return float(theta), RopeScaling.from_dict({"rope_type": kind, **values})
    except ConfigError as exc:
        raise ConfigError(f"{path}: rope_scaling: {exc}") from None


def rope_config_dicts(cfg: ModelConfig) -> dict[str, Any]:
    """The RoPE keys of ``config.json`` in the 4.x and the 5.x form."""
    scaling = None if cfg.rope_scaling is None else cfg.rope_scaling.to_dict()
    if scaling is not None and scaling["rope_type"] == "linear":
        scaling = {"rope_type": "linear", "factor": scaling["factor"]}
    params = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if scaling is not None:
        params = {**scaling, "rope_theta": cfg.rope_theta}
    return {"rope_theta": cfg.rope_theta, "rope_scaling": scaling, "rope_parameters": params}


def ties_embeddings(data: dict) -> bool:
    """Whether an HF ``config.json`` ties the LM head to the input embedding (transformers' default: no)."""
    return bool(data.get("tie_word_embeddings", False))


def model_config_from_hf(data: dict, family: str | None = None, path: str = "config.json") -> ModelConfig:
    arch = data.get("architectures") or ["LlamaForCausalLM"]
    if data.get("model_type", "llama") != "llama" or "LlamaForCausalLM" not in arch:
        raise ConfigError(
            f"{path}: model_type/architectures {data.get('model_type')}/{arch} is not a LLaMA causal LM"
        )
    for key in ("attention_bias", "mlp_bias"):
        if data.get(key):
            raise ConfigError(f"{path}: {key}=true is not supported (trilm models have no biases)")
    act = data.get("hidden_act", "silu")
    if act not in _SILU:
        raise ConfigError(f"{path}: hidden_act {act!r} is not supported (trilm's MLP is SwiGLU with SiLU)")
    theta, scaling = _rope(data, path)
    extra = data.get("trilm", {})
    family = family or extra.get("family", "floatlm")
    try:
        rows = int(data["vocab_size"])
        hidden, heads = int(data["hidden_size"]), int(data["num_attention_heads"])
        ffn, layers = int(data["intermediate_size"]), int(data["num_hidden_layers"])
    except KeyError as exc:
        raise ConfigError(f"{path}: missing key {exc.args[0]!r}") from None
    vocab, pad = int(extra.get("vocab_size", rows)), int(extra.get("pad_vocab_to", 128))
    if -(-vocab // pad) * pad != rows:
        vocab, pad = rows, 128 if rows % 128 == 0 else 1
    quant: dict[str, Any] = dict(extra.get("quant", {}))
    if family != "floatlm":
        quant["partitions"] = int(data.get("pretraining_model_parallel", quant.get("partitions") or 1))
    head_dim = data.get("head_dim")
    if head_dim is not None and (
        not isinstance(head_dim, int) or isinstance(head_dim, bool) or head_dim <= 0
    ):
        raise ConfigError(f"{path}: head_dim {head_dim!r}: expected a positive integer")
    explicit = None if head_dim is None or head_dim * heads == hidden else int(head_dim)
    try:
        return ModelConfig(
            family=family,
            name=extra.get("name", Path(str(path)).parent.name or "imported"),
            vocab_size=vocab,
            pad_vocab_to=pad,
            hidden=hidden,
            ffn=ffn,
            heads=heads,
            kv_heads=int(data.get("num_key_value_heads") or heads),
            layers=layers,
            context=int(data.get("max_position_embeddings", 2048)),
            rope_theta=theta,
            rope_scaling=scaling,
            explicit_head_dim=explicit,
            norm_eps=float(data.get("rms_norm_eps", 1e-5)),
            init_std=float(data.get("initializer_range", 0.02)),
            quant=QuantConfig.from_dict(quant, prefix="trilm.quant."),
        )
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def hf_tensor_plan(cfg: ModelConfig) -> dict[str, tuple[str, tuple[int, ...]]]:
    """``{HF tensor name: (canonical name, shape)}`` of a model with this config."""
    return {hf_name(k): (k, s) for k, s in canonical_shapes(cfg).items()}


def check_hf_names(
    where: str | Path, cfg: ModelConfig, names: list[str] | set[str], tied: bool = False
) -> None:
    """Refuse tensors a LLaMA of this config does not have (biases named as such) and missing ones; with
    ``tied`` embeddings ``lm_head.weight`` may be absent (the embedding is the head)."""
    expected = hf_tensor_plan(cfg)
    if tied:
        expected.pop(TOP_TENSORS["head.weight"][0])
    unexpected = sorted(n for n in names if n not in expected and not n.endswith("rotary_emb.inv_freq"))
    if unexpected:
        biases = [n for n in unexpected if n.endswith(".bias")]
        what = (
            "bias tensors (trilm models have no biases)" if biases else "tensors a LLaMA model does not have"
        )
        shown = biases or unexpected
        raise ConfigError(f"{where}: {what}: {', '.join(shown[:5])}{' …' if len(shown) > 5 else ''}")
    missing = [n for n in expected if n not in names]
    if missing:
        head_only = "lm_head.weight" in missing and len(missing) == 1
        reason = (
            " (config.json does not tie the embeddings: tie_word_embeddings is false)" if head_only else ""
        )
        raise ConfigError(
            f"{where}: missing tensor(s) {', '.join(missing[:5])}{' …' if len(missing) > 5 else ''}{reason}"
        )


def restore_latents(cfg: ModelConfig, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Canonical tensors read from an HF directory, TriLM/BiLM block matrices as restorable latents."""
    out = {}
    for name, tensor in state.items():
        layout = canonical_layout(cfg, name)
        out[name] = tensor if layout is None else _restore_latent(tensor, layout)
    return out
