"""Hugging Face interop: trilm snapshots ⇄ ``LlamaForCausalLM`` directories.

Export writes what Spectra released: an ordinary LLaMA checkpoint. For TriLM/BiLM the block weights are the
*materialised* quantized values γ·Ŵ ("unpacked"), with ``pretraining_model_parallel`` in config.json
naming the scale partitions, so plain transformers reproduces the ternary model's logits.

Import reads such a directory back. A FloatLM comes back as is. An unpacked TriLM/BiLM cannot return its
latent weights (they were never released), but its forward pass can be recovered exactly: per scale cell the
latent weights are set to W̃·(γ − ε)/mean|W̃|, whose absmean re-quantization yields the same codes and γ.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from trilm.config import ConfigError
from trilm.model.config import ModelConfig, QuantConfig
from trilm.model.quant import ScaleLayout, canonical_layout, quantize_weight, weight_scales

_LAYER_MAP = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn.wq.weight": "self_attn.q_proj.weight",
    "attn.wk.weight": "self_attn.k_proj.weight",
    "attn.wv.weight": "self_attn.v_proj.weight",
    "attn.wo.weight": "self_attn.o_proj.weight",
    "mlp_norm.weight": "post_attention_layernorm.weight",
    "mlp.w_gate.weight": "mlp.gate_proj.weight",
    "mlp.w_up.weight": "mlp.up_proj.weight",
    "mlp.w_down.weight": "mlp.down_proj.weight",
}
_TOP_MAP = {
    "embed.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "head.weight": "lm_head.weight",
}


def hf_name(name: str) -> str:
    if name in _TOP_MAP:
        return _TOP_MAP[name]
    _, index, rest = name.split(".", 2)
    return f"model.layers.{index}.{_LAYER_MAP[rest]}"


def trilm_name(name: str) -> str:
    for ours, theirs in _TOP_MAP.items():
        if name == theirs:
            return ours
    if name.startswith("model.layers."):
        _, _, index, rest = name.split(".", 3)
        for ours, theirs in _LAYER_MAP.items():
            if rest == theirs:
                return f"layers.{index}.{ours}"
    raise KeyError(name)


def dequantized_state_dict(cfg: ModelConfig, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Canonical tensors with every quantized block matrix replaced by its quantized image γ·Ŵ."""
    out = {}
    for name, tensor in state.items():
        layout = canonical_layout(cfg, name)
        if layout is None:
            out[name] = tensor
        else:
            codes, scales = quantize_weight(tensor, layout)
            out[name] = (codes * scales).to(tensor.dtype)
    return out


def hf_config_dict(cfg: ModelConfig, dtype: torch.dtype = torch.float32) -> dict:
    from transformers import LlamaConfig

    if not cfg.is_uniform:
        raise ConfigError(
            f"{cfg.name}: per-layer head counts / FFN widths (a structurally pruned model) cannot be "
            "expressed in a Hugging Face LlamaConfig, which has one size for every layer; use the trilm "
            "snapshot or the packed export instead"
        )

    hf = LlamaConfig(
        vocab_size=cfg.padded_vocab,
        hidden_size=cfg.hidden,
        intermediate_size=cfg.ffn,
        num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        max_position_embeddings=cfg.context,
        rms_norm_eps=cfg.norm_eps,
        rope_theta=cfg.rope_theta,
        tie_word_embeddings=False,
        attention_bias=False,
        mlp_bias=False,
        hidden_act="silu",
        initializer_range=cfg.init_std,
        torch_dtype=str(dtype).removeprefix("torch."),
        architectures=["LlamaForCausalLM"],
    )
    data = hf.to_dict()
    data["pretraining_model_parallel"] = cfg.scale_partitions(1) if cfg.family != "floatlm" else 1
    data["trilm"] = {
        "family": cfg.family,
        "name": cfg.name,
        "vocab_size": cfg.vocab_size,
        "quant": cfg.quant.to_dict(),
    }
    return data


def export_hf(
    cfg: ModelConfig, state: dict[str, torch.Tensor], out_dir: str | Path, dtype=torch.float32
) -> Path:
    """Write ``config.json`` + ``model.safetensors`` loadable by ``LlamaForCausalLM.from_pretrained``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    weights = dequantized_state_dict(cfg, state)
    hf_state = {hf_name(k): v.to(dtype).contiguous() for k, v in weights.items()}
    save_file(hf_state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(hf_config_dict(cfg, dtype), indent=2))
    return out_dir


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


def read_hf_config(directory: str | Path) -> dict:
    path = Path(directory) / "config.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: not found (is {directory} a Hugging Face model directory?)") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: invalid JSON: {exc}") from None


def model_config_from_hf(data: dict, family: str | None = None, path: str = "config.json") -> ModelConfig:
    arch = data.get("architectures") or ["LlamaForCausalLM"]
    if data.get("model_type", "llama") != "llama" or "LlamaForCausalLM" not in arch:
        raise ConfigError(
            f"{path}: model_type/architectures {data.get('model_type')}/{arch} is not a LLaMA causal LM"
        )
    for key in ("attention_bias", "mlp_bias", "tie_word_embeddings"):
        if data.get(key):
            raise ConfigError(
                f"{path}: {key}=true is not supported (trilm models have no biases, untied head)"
            )
    extra = data.get("trilm", {})
    family = family or extra.get("family", "floatlm")
    rope = data.get("rope_parameters") or {}
    theta = rope.get("rope_theta", data.get("rope_theta", 10000.0))
    if rope.get("rope_type", "default") != "default":
        raise ConfigError(f"{path}: rope_type {rope.get('rope_type')!r} is not supported (only default RoPE)")
    vocab = int(data["vocab_size"])
    quant = dict(extra.get("quant", {}))
    if family != "floatlm":
        quant["partitions"] = int(data.get("pretraining_model_parallel", quant.get("partitions") or 1))
    heads = int(data["num_attention_heads"])
    if data.get("head_dim") not in (None, data["hidden_size"] // heads):
        raise ConfigError(f"{path}: head_dim {data['head_dim']} != hidden_size/heads is not supported")
    return ModelConfig(
        family=family,
        name=extra.get("name", Path(str(path)).parent.name or "imported"),
        vocab_size=int(extra.get("vocab_size", vocab)),
        pad_vocab_to=1 if vocab % 128 else 128,
        hidden=int(data["hidden_size"]),
        ffn=int(data["intermediate_size"]),
        heads=heads,
        kv_heads=int(data.get("num_key_value_heads") or heads),
        layers=int(data["num_hidden_layers"]),
        context=int(data.get("max_position_embeddings", 2048)),
        rope_theta=float(theta),
        norm_eps=float(data.get("rms_norm_eps", 1e-5)),
        init_std=float(data.get("initializer_range", 0.02)),
        quant=QuantConfig.from_dict(quant, prefix="trilm.quant."),
    )


def import_hf(
    directory: str | Path, family: str | None = None
) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """(config, canonical state) from a ``LlamaForCausalLM`` directory with safetensors weights."""
    directory = Path(directory)
    cfg = model_config_from_hf(read_hf_config(directory), family, str(directory / "config.json"))
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"{directory}: no *.safetensors weights found")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        for key, tensor in load_file(str(f)).items():
            if key.endswith("rotary_emb.inv_freq"):
                continue
            try:
                state[trilm_name(key)] = tensor.float()
            except KeyError:
                raise ConfigError(f"{f}: unexpected tensor {key!r} for a LLaMA model") from None
    if "head.weight" not in state:
        raise ConfigError(f"{directory}: lm_head.weight missing (tied embeddings are not supported)")
    for name, tensor in state.items():
        layout = canonical_layout(cfg, name)
        if layout is not None:
            state[name] = _restore_latent(tensor, layout)
    return cfg, state
