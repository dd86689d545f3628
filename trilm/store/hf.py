"""Hugging Face ``LlamaForCausalLM`` directories on disk: reading them for :func:`trilm.store.open_model`,
and writing their files for ``trilm export hf``. The name and config mapping is :mod:`trilm.model.hf`.

Weights come from ``model.safetensors`` or from the shards that ``model.safetensors.index.json`` names; a
folder with several candidate weight files and no index is ambiguous and refused. A missing, unexpected or
misshapen tensor is named by its Hugging Face name and file; a truncated file or a non-finite weight by
file and tensor (:mod:`trilm.store.tensors`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from trilm.atomic import write_json
from trilm.model.config import ModelConfig
from trilm.model.hf import (
    DEFAULT_BOS_ID,
    DEFAULT_EOS_ID,
    check_hf_names,
    check_uniform,
    dequantized_state_dict,
    generation_config_dict,
    hf_config_dict,
    hf_name,
    hf_tensor_plan,
    model_config_from_hf,
    restore_latents,
    ties_embeddings,
)
from trilm.model.spec import canonical_shapes
from trilm.store.errors import StoreError
from trilm.store.jsonfile import read_json, read_json_object
from trilm.store.layout import (
    CONFIG_FILE,
    EXPORT_MARKER,
    HF_INDEX,
    HF_TOKENIZER_CONFIG,
    HF_WEIGHTS,
    TOKENIZER_FILE,
)
from trilm.store.tensors import read_header, read_tensors, write_tensors


def read_hf_config(directory: str | Path) -> dict[str, Any]:
    path = Path(directory) / CONFIG_FILE
    data = read_json(path, f" (is {directory} a Hugging Face model directory?)")
    if not isinstance(data, dict):
        raise StoreError(f"{path}: not a JSON object")
    return data


def is_hf_directory(directory: str | Path) -> bool:
    try:
        return "model_type" in read_hf_config(directory)
    except StoreError:
        return False


def weight_files(directory: str | Path) -> dict[str, Path]:
    """HF tensor name → the safetensors file holding it, from the index or the one weights file."""
    directory = Path(directory)
    candidates = sorted(p for p in directory.glob("*.safetensors"))
    index = directory / HF_INDEX
    if index.is_file():
        data = read_json(index)
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(weight_map, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and v for k, v in weight_map.items()
        ):
            raise StoreError(
                f"{index}: not a safetensors index (weight_map must map tensor names to shard file names)"
            )
        named = {directory / f for f in weight_map.values()}
        absent = sorted(str(p) for p in named if not p.is_file())
        if absent:
            raise StoreError(f"{index}: names shard(s) that do not exist: {', '.join(absent)}")
        stray = [p.name for p in candidates if p not in named]
        if stray:
            raise StoreError(
                f"{directory}: ambiguous weights: {', '.join(stray)} not named by {HF_INDEX}; remove them "
                "or the index"
            )
        return {name: directory / f for name, f in weight_map.items()}
    if len(candidates) > 1:
        raise StoreError(
            f"{directory}: ambiguous weights: {len(candidates)} safetensors files "
            f"({', '.join(p.name for p in candidates)}) and no {HF_INDEX} saying which to read"
        )
    if not candidates:
        other = sorted(p.name for p in directory.glob("*.bin")) + sorted(
            p.name for p in directory.glob("*.pt")
        )
        hint = f" ({', '.join(other)} found: only safetensors weights are read)" if other else ""
        raise StoreError(f"{directory}: no {HF_WEIGHTS}{hint}")
    names, _ = read_header(candidates[0])
    return {name: candidates[0] for name in names}


@dataclasses.dataclass
class HFDirectory:
    """What an HF directory says about itself, in trilm terms (weights are read by :func:`read_hf_state`)."""

    path: Path
    cfg: ModelConfig
    bos_token_id: int | list[int] | None
    eos_token_id: int | list[int] | None
    tokenizer_model: Path | None
    add_bos: bool | None
    """``add_bos_token`` of its ``tokenizer_config.json`` (None when it does not say)."""
    export: dict[str, Any]
    """``trilm_export.json`` when trilm exported it ({} otherwise)."""
    tokenizer_hash: str | None
    """The hash of the tokenizer it was exported with, when recorded."""
    tied: bool = False
    """``tie_word_embeddings``: the LM head is the input embedding."""


def read_hf_directory(directory: str | Path, family: str | None = None) -> HFDirectory:
    """Config and tokenizer facts of a ``LlamaForCausalLM`` directory, validated (no weights read)."""
    directory = Path(directory)
    data = read_hf_config(directory)
    cfg = model_config_from_hf(data, family, str(directory / CONFIG_FILE))
    tok_config = read_json_object(directory / HF_TOKENIZER_CONFIG)
    export = read_json_object(directory / EXPORT_MARKER)
    add_bos = tok_config.get("add_bos_token")
    model = directory / TOKENIZER_FILE
    return HFDirectory(
        path=directory,
        cfg=cfg,
        bos_token_id=data.get("bos_token_id"),
        eos_token_id=data.get("eos_token_id"),
        tokenizer_model=model if model.is_file() else None,
        add_bos=None if add_bos is None else bool(add_bos),
        export=export,
        tokenizer_hash=export.get("tokenizer_hash") or tok_config.get("trilm_tokenizer_hash"),
        tied=ties_embeddings(data),
    )


def read_hf_state(directory: str | Path, cfg: ModelConfig, tied: bool = False) -> dict[str, torch.Tensor]:
    """Canonical fp32 tensors of an HF directory (TriLM/BiLM block matrices as restorable latents).

    With ``tied`` embeddings the head is the embedding, as transformers ties it: ``head.weight`` is a copy
    of ``embed.weight`` (an ``lm_head.weight`` in the file is not read, as transformers does not use it)."""
    directory = Path(directory)
    files = weight_files(directory)
    check_hf_names(directory, cfg, set(files), tied)
    plan = hf_tensor_plan(cfg)
    if tied:
        plan.pop(hf_name("head.weight"))
    by_file: dict[Path, list[str]] = {}
    for name in plan:
        by_file.setdefault(files[name], []).append(name)
    state: dict[str, torch.Tensor] = {}
    for path, names in by_file.items():
        for name, tensor in read_tensors(path, names).items():
            canonical, shape = plan[name]
            if tuple(tensor.shape) != shape:
                raise StoreError(
                    f"{path}: tensor {name} has shape {tuple(tensor.shape)}, config.json implies {shape}"
                )
            state[canonical] = tensor.float()
    if tied:
        state["head.weight"] = state["embed.weight"].clone()
    return restore_latents(cfg, state)


def write_hf_files(
    cfg: ModelConfig,
    state: dict[str, torch.Tensor],
    out_dir: str | Path,
    dtype: torch.dtype = torch.float32,
    *,
    bos_token_id: int | list[int] | None = DEFAULT_BOS_ID,
    eos_token_id: int | list[int] | None = DEFAULT_EOS_ID,
    dequantize: bool = True,
    tied: bool = False,
) -> Path:
    """Write ``config.json``, ``generation_config.json`` and ``model.safetensors`` into ``out_dir``.

    ``state`` holds canonical tensors; with ``dequantize`` (the default) TriLM/BiLM latent block weights are
    replaced by γ·Ŵ, otherwise they are taken as already materialised. ``tied`` writes the embeddings tied
    (no ``lm_head.weight``; the caller has checked that the head equals the embedding).
    """
    check_uniform(cfg)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    expected = canonical_shapes(cfg)
    missing = sorted(set(expected) - set(state))
    if missing:
        raise StoreError(f"{out_dir}: canonical tensors missing: {missing[:5]}")
    weights = dequantized_state_dict(cfg, state) if dequantize else state
    hf_state = {hf_name(k): weights[k].to(dtype) for k in expected if not (tied and k == "head.weight")}
    write_tensors(out_dir / HF_WEIGHTS, hf_state, metadata={"format": "pt"})
    write_hf_config(cfg, out_dir, dtype, bos_token_id=bos_token_id, eos_token_id=eos_token_id, tied=tied)
    return out_dir


def write_hf_config(
    cfg: ModelConfig,
    out_dir: str | Path,
    dtype: torch.dtype,
    *,
    bos_token_id: int | list[int] | None = DEFAULT_BOS_ID,
    eos_token_id: int | list[int] | None = DEFAULT_EOS_ID,
    tied: bool = False,
) -> None:
    """``config.json`` and ``generation_config.json`` of a ``LlamaForCausalLM`` directory: the one writer
    of both, shared by the dense HF export and the compressed-tensors one (which adds its section)."""
    out_dir = Path(out_dir)
    write_json(
        out_dir / CONFIG_FILE,
        hf_config_dict(cfg, dtype, bos_token_id=bos_token_id, eos_token_id=eos_token_id, tied=tied),
    )
    write_json(out_dir / "generation_config.json", generation_config_dict(bos_token_id, eos_token_id))
