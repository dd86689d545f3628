"""``trilm export hf`` and ``trilm import hf`` on snapshot directories (the tensor mapping is trilm.model.hf).

An HF export is a directory that transformers, lm-eval's ``hf`` model, vLLM and llama.cpp's
``convert_hf_to_gguf.py`` load as they are: ``config.json`` (4.x and 5.x key forms),
``generation_config.json``, ``model.safetensors`` (fp16 unless asked otherwise; TriLM/BiLM unpacked as
γ·Ŵ), the tokenizer files of :mod:`trilm.export.tokenizer` and a model card.

An import writes a complete snapshot (weights, config, ``COMPLETE`` marker) and keeps what a round trip
needs: the special ids of ``config.json``, ``add_bos_token`` and the ``tokenizer.model`` when the directory
has one (the snapshot's tokenizer hash is then that file's).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from trilm.config import ConfigError
from trilm.data.tokenizer import Tokenizer
from trilm.dtypes import parse_dtype
from trilm.export.card import write_model_card
from trilm.export.common import SnapshotSource, export_directory, open_snapshot
from trilm.export.tokenizer import write_tokenizer_files
from trilm.model.config import ModelConfig
from trilm.model.flops import parameter_counts
from trilm.model.hf import DEFAULT_BOS_ID, DEFAULT_EOS_ID, dequantized_state_dict, export_hf, read_hf
from trilm.model.snapshot import SNAPSHOT_FORMAT, WEIGHTS_FILE, SnapshotMeta, write_snapshot_config


def float_state(src: SnapshotSource) -> dict[str, torch.Tensor]:
    """The snapshot's canonical tensors with every block matrix materialised as a float: TriLM/BiLM latents
    as γ·Ŵ, packed layers (packed exports, QuantLMs) dequantized by their format."""
    from trilm.model.snapshot import read_packed_layers

    state = dequantized_state_dict(src.cfg, load_file(str(src.path / WEIGHTS_FILE)))
    state.update({f"{k}.weight": w.dequantize() for k, w in read_packed_layers(src.path).items()})
    return state


def special_ids(src: SnapshotSource) -> tuple[Any, Any]:
    """(bos, eos) for config.json: the tokenizer's, else what an import recorded, else trilm's defaults."""
    if src.tokenizer is not None:
        tok = src.tokenizer
        return (tok.bos_id if tok.bos_id >= 0 else None), tok.eos_id
    hf = (src.meta.get("extra") or {}).get("hf", {})
    return hf.get("bos_token_id", DEFAULT_BOS_ID), hf.get("eos_token_id", DEFAULT_EOS_ID)


def export_snapshot_hf(
    snapshot: str | Path,
    out: str | Path,
    *,
    dtype: str = "float16",
    tokenizer: str | Path | None = None,
    src: SnapshotSource | None = None,
) -> Path:
    """Write the HF export of a complete snapshot to ``out`` (atomically; see :mod:`trilm.export.common`)."""
    weight_dtype = parse_dtype(dtype, "--dtype")
    src = src or open_snapshot(snapshot, tokenizer=tokenizer, require_tokenizer=True)
    state = float_state(src)
    bos, eos = special_ids(src)
    with export_directory(out, "hf", src, dtype=dtype) as tmp:
        export_hf(src.cfg, state, tmp, weight_dtype, bos_token_id=bos, eos_token_id=eos, dequantize=False)
        if src.tokenizer is not None:
            write_tokenizer_files(src.tokenizer, tmp, add_bos=src.add_bos, context=src.cfg.context)
        write_model_card(tmp, src, files={"weights": f"{WEIGHTS_FILE} ({dtype})"})
    return Path(out)


def write_snapshot(out: Path, cfg: ModelConfig, state: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    """Weights + config.json in the snapshot format (no process group, no model built)."""
    weights = {k: v.contiguous() for k, v in state.items()}
    save_file(weights, str(out / WEIGHTS_FILE), metadata={"format": SNAPSHOT_FORMAT})
    write_snapshot_config(out, cfg, SnapshotMeta.from_dict(meta))


def import_snapshot_hf(hf_dir: str | Path, out: str | Path, *, family: str | None = None) -> Path:
    """Read an HF LLaMA directory (refusing what trilm cannot represent) into a complete snapshot."""
    hf_dir, out = Path(hf_dir), Path(out)
    if out.is_file() or (out.is_dir() and any(out.iterdir())):
        raise ConfigError(f"{out}: exists and is not empty; import into a new directory")
    model = read_hf(hf_dir, family)
    cfg = model.cfg
    counts = parameter_counts(cfg)
    tok = Tokenizer.load(model.tokenizer_model) if model.tokenizer_model else None
    meta: dict[str, Any] = {
        "step": 0,
        "tokens": 0,
        "run": hf_dir.name,
        "family": cfg.family,
        "size": cfg.name,
        "params": counts.total,
        "nonembedding_params": counts.nonembedding,
        "linear_params": counts.linear,
        "scale_partitions": cfg.scale_partitions(1),
        "tokenizer_hash": tok.hash if tok else None,
        "extra": {
            "imported_from": str(hf_dir.resolve()),
            "hf": {"bos_token_id": model.bos_token_id, "eos_token_id": model.eos_token_id},
            **({"add_bos": model.add_bos} if model.add_bos is not None else {}),
        },
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".tmp-{out.name}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        write_snapshot(tmp, cfg, model.state, meta)
        if tok is not None:
            shutil.copyfile(tok.path, tmp / "tokenizer.model")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if out.exists():
        out.rmdir()
    os.replace(tmp, out)
    (out / "COMPLETE").write_text(json.dumps({"step": 0, "imported_from": str(hf_dir)}))
    return out
