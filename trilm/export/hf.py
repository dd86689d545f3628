"""``trilm export hf`` and ``trilm import hf`` on snapshot directories (the tensor mapping is trilm.model.hf).

An HF export is a directory that transformers, lm-eval's ``hf`` model, vLLM and llama.cpp's
``convert_hf_to_gguf.py`` load as they are: ``config.json`` (4.x and 5.x key forms),
``generation_config.json``, ``model.safetensors`` (fp16 unless asked otherwise; TriLM/BiLM unpacked as
γ·Ŵ), the tokenizer files of :mod:`trilm.export.tokenizer` and a model card.

An import writes a complete snapshot (weights, config, ``COMPLETE`` marker) and keeps what a round trip
needs: the special ids of ``config.json``, ``add_bos_token``, the tokenizer when the directory has one
(``tokenizer.json`` with its config and chat template, or ``tokenizer.model``; the snapshot's tokenizer hash
is then that file's) and whether the embeddings were tied. A snapshot always holds ``head.weight``: a tied
model's head is imported as a copy of the embedding (``meta.extra["tied_embeddings"]``), and the HF and
GGUF exports write it tied again while the two are still equal (:func:`tie_state`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from trilm.config import ConfigError
from trilm.dtypes import parse_dtype
from trilm.export.card import write_model_card
from trilm.export.common import export_directory, open_source
from trilm.export.tokenizer import write_tokenizer_files
from trilm.model.hf import DEFAULT_BOS_ID, DEFAULT_EOS_ID, dequantized_state_dict
from trilm.model.snapshot import model_meta
from trilm.store.errors import StoreError
from trilm.store.hf import write_hf_files
from trilm.store.layout import WEIGHTS_FILE
from trilm.store.open import ModelDir, open_model
from trilm.store.snapshot import write_snapshot


def float_state(src: ModelDir) -> dict[str, torch.Tensor]:
    """The model's canonical tensors with every block matrix materialised as a float: TriLM/BiLM latents
    as γ·Ŵ, packed layers (packed exports, QuantLMs) dequantized by their format."""
    state = dequantized_state_dict(src.config, src.weights.float_state())
    state.update({f"{k}.weight": w.dequantize() for k, w in src.weights.packed_layers().items()})
    return state


def special_ids(src: ModelDir) -> tuple[Any, Any]:
    """(bos, eos) for config.json: the tokenizer's, else what an import recorded, else trilm's defaults."""
    tok = src.tokenizer.tokenizer
    if tok is not None:
        return (tok.bos_id if tok.bos_id >= 0 else None), tok.eos_id
    hf = src.meta.extra.get("hf", {})
    return hf.get("bos_token_id", DEFAULT_BOS_ID), hf.get("eos_token_id", DEFAULT_EOS_ID)


def tie_state(src: ModelDir, state: dict[str, torch.Tensor]) -> tuple[bool, str]:
    """(write tied?, what to say) for a model whose snapshot records tied embeddings.

    A tie is written back only when the head still equals the embedding bit for bit (post-hoc methods and
    pruning leave both alone); a head that was changed is written as its own tensor, and said so."""
    if not src.meta.extra.get("tied_embeddings"):
        return False, ""
    head, embed = state.get("head.weight"), state.get("embed.weight")
    if head is not None and embed is not None and torch.equal(head, embed):
        return True, "embeddings tied (the head is the embedding, as imported)"
    return False, "embeddings untied: the head no longer equals the embedding, so both are written"


def export_snapshot_hf(
    snapshot: str | Path,
    out: str | Path,
    *,
    dtype: str = "float16",
    tokenizer: str | Path | None = None,
    src: ModelDir | None = None,
) -> Path:
    """Write the HF export of a model to ``out`` (atomically; see :mod:`trilm.export.common`)."""
    weight_dtype = parse_dtype(dtype, "--dtype")
    src = src or open_source(snapshot, tokenizer=tokenizer, require_tokenizer=True)
    state = float_state(src)
    bos, eos = special_ids(src)
    tied, _ = tie_state(src, state)
    with export_directory(out, "hf", src, dtype=dtype, tied_embeddings=tied) as tmp:
        write_hf_files(
            src.config,
            state,
            tmp,
            weight_dtype,
            bos_token_id=bos,
            eos_token_id=eos,
            dequantize=False,
            tied=tied,
        )
        write_companions(src, tmp, {"weights": f"{WEIGHTS_FILE} ({dtype})"})
    return Path(out)


def write_companions(src: ModelDir, out_dir: Path, files: dict[str, str]) -> None:
    """What every Hugging Face-layout export ships beside its weights and config: the tokenizer files (with
    the chat template) and the model card."""
    tok = src.tokenizer.tokenizer
    if tok is not None:
        write_tokenizer_files(tok, out_dir, add_bos=src.add_bos, context=src.config.context)
    write_model_card(out_dir, src, files=files)


def import_snapshot_hf(hf_dir: str | Path, out: str | Path, *, family: str | None = None) -> Path:
    """Read an HF LLaMA directory (refusing what trilm cannot represent) into a complete snapshot.

    Its ``tokenizer.model`` is taken by the store's policy: when the directory records the hash it was
    exported with (``trilm_export.json``), another file is refused, and so is one whose vocabulary
    exceeds the model's.
    """
    hf_dir, out = Path(hf_dir), Path(out)
    if out.is_file() or (out.is_dir() and any(out.iterdir())):
        raise ConfigError(f"{out}: exists and is not empty; import into a new directory")
    src = open_model(hf_dir, family=family)
    if src.kind != "hf":
        raise StoreError(f"{hf_dir}: already a trilm model ({src.kind}); there is nothing to import")
    cfg = src.config
    tok = src.tokenizer.tokenizer
    hf = src.hf
    extra: dict[str, Any] = {
        "imported_from": hf_dir.name,
        "hf": {"bos_token_id": hf.bos_token_id, "eos_token_id": hf.eos_token_id},
    }
    if hf.add_bos is not None:
        extra["add_bos"] = hf.add_bos
    elif tok is not None and tok.adds_bos is not None:
        extra["add_bos"] = bool(tok.adds_bos)
    if hf.tied:
        extra["tied_embeddings"] = True
    meta = model_meta(
        cfg, step=0, tokens=0, run=hf_dir.name, tokenizer_hash=tok.hash if tok else None, extra=extra
    )
    state = src.weights.float_state()
    return write_snapshot(out, cfg, meta, state, tokenizer=tok, marker={"imported_from": hf_dir.name})
