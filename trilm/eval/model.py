"""A model opened for evaluation: logits, tokenizer and the BOS convention it was trained with.

``load_eval_model(path)`` accepts a trilm snapshot, a packed snapshot (QuantLM, packed export) or a Hugging
Face LLaMA directory, and gives the same object for all three, so ``trilm eval ppl``, the lm-eval model and
the suite evaluation never care which it was. The network is the lean inference model
(:func:`trilm.infer.load_inference_model`): plain PyTorch, no process group.

The token a text is conditioned on when it has no context (:attr:`EvalModel.prefix_token_id`) is EOS for
a model trained without BOS (trilm's convention: EOS is what precedes every document in training) and BOS
for one trained with it.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch

from trilm.config import ConfigError
from trilm.data.tokenizer import Tokenizer
from trilm.export.tokenizer import prefix_token_id, trained_with_bos
from trilm.infer import load_inference_model
from trilm.model.config import ModelConfig


@dataclasses.dataclass
class EvalModel:
    path: Path
    model: torch.nn.Module
    cfg: ModelConfig
    meta: dict[str, Any]
    tokenizer: Tokenizer | None
    add_bos: bool
    device: torch.device

    @property
    def prefix_token_id(self) -> int:
        if self.tokenizer is None:
            return 1 if self.add_bos else 2
        return prefix_token_id(self.tokenizer, self.add_bos)

    @property
    def context(self) -> int:
        return self.cfg.context

    @torch.no_grad()
    def logits(self, ids: torch.Tensor) -> torch.Tensor:
        """fp32 logits [B, S, padded_vocab] for token ids [B, S] (S ≤ context)."""
        return self.model(ids.to(self.device)).float()

    def encode(self, text: str) -> list[int]:
        """Token ids as trained: BOS first only when the model was trained with it."""
        if self.tokenizer is None:
            raise ConfigError(f"{self.path}: no tokenizer.model found for this model; pass --tokenizer")
        ids = self.tokenizer.encode(text)
        return [self.tokenizer.bos_id, *ids] if self.add_bos else ids


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read JSON: {exc}") from None
    return data if isinstance(data, dict) else {}


def _is_hf_dir(path: Path) -> bool:
    return (path / "config.json").is_file() and "model_type" in _read_json(path / "config.json")


def _tokenizer(path: Path, meta: dict, override: str | Path | None) -> Tokenizer | None:
    from trilm.export.common import find_tokenizer

    return find_tokenizer(path, meta, override)


def load_eval_model(
    path: str | Path,
    *,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    tokenizer: str | Path | None = None,
    packed: bool = False,
) -> EvalModel:
    """Open a snapshot, packed snapshot or HF LLaMA directory for evaluation (see the module docstring)."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise ConfigError(f"{path}: no config.json (expected a trilm snapshot or a Hugging Face directory)")
    if _is_hf_dir(path):
        from trilm.model.hf import model_config_from_hf

        data = _read_json(path / "config.json")
        cfg = model_config_from_hf(data, path=str(path / "config.json"))
        tok_config = (
            _read_json(path / "tokenizer_config.json") if (path / "tokenizer_config.json").is_file() else {}
        )
        meta = {
            "family": cfg.family,
            "size": cfg.name,
            "tokenizer_hash": tok_config.get("trilm_tokenizer_hash"),
        }
        marker = path / "trilm_export.json"
        if marker.is_file():
            meta.update(
                {k: v for k, v in _read_json(marker).items() if k in ("step", "tokens", "size", "run")}
            )
        add_bos = bool(tok_config.get("add_bos_token", False))
    else:
        from trilm.model.snapshot import read_snapshot

        cfg, snapshot_meta = read_snapshot(path)
        meta = snapshot_meta.to_dict()
        add_bos = trained_with_bos(path, meta)
    tok = _tokenizer(path, meta, tokenizer)
    model = load_inference_model(path, device=device, dtype=dtype, packed=packed)
    return EvalModel(path, model, cfg, meta, tok, add_bos, torch.device(device))
