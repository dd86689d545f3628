"""A model opened for evaluation: logits, tokenizer and the BOS convention it was trained with.

``load_eval_model(path)`` accepts every model directory :func:`trilm.store.open_model` opens (snapshot,
packed snapshot or QuantLM, pruned snapshot, Hugging Face LLaMA directory, suite checkpoint) and gives the
same object for all, so ``trilm eval ppl``, the lm-eval model and the suite evaluation never care which it
was; weights are verified, and the tokenizer chosen, by the store. The network is the lean inference model
(:func:`trilm.infer.load_inference_model`): plain PyTorch, no process group.

The token a text is conditioned on when it has no context (:attr:`EvalModel.prefix_token_id`) is EOS for
a model trained without BOS (trilm's convention: EOS is what precedes every document in training) and BOS
for one trained with it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from trilm.config import ConfigError
from trilm.data.tokenizer import Tokenizer
from trilm.infer import load_inference_model
from trilm.model.config import ModelConfig
from trilm.model.snapshot import SnapshotMeta
from trilm.store.open import ModelDir, open_model
from trilm.store.tokenizer import prefix_token_id


@dataclasses.dataclass
class EvalModel:
    path: Path
    model: torch.nn.Module
    cfg: ModelConfig
    meta: SnapshotMeta
    tokenizer: Tokenizer | None
    add_bos: bool
    device: torch.device
    tokenizer_note: str = ""
    """Why there is no tokenizer, when there is none."""
    tokenizer_forced: str = ""
    """What ``force_tokenizer`` overrode (empty when nothing)."""

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
            raise ConfigError(f"{self.path}: {self.tokenizer_note or 'no tokenizer'}; pass --tokenizer")
        ids = self.tokenizer.encode(text)
        return [self.tokenizer.bos_id, *ids] if self.add_bos else ids


def load_eval_model(
    path: str | Path | ModelDir,
    *,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    tokenizer: str | Path | None = None,
    packed: bool = False,
    force_tokenizer: bool = False,
) -> EvalModel:
    """Open any model directory :func:`trilm.store.open_model` knows for evaluation."""
    opened = (
        path
        if isinstance(path, ModelDir)
        else open_model(path, tokenizer=tokenizer, force_tokenizer=force_tokenizer)
    )
    model = load_inference_model(opened, device=device, dtype=dtype, packed=packed)
    opened.weights.release()
    choice = opened.tokenizer
    return EvalModel(
        opened.given,
        model,
        opened.config,
        opened.meta,
        choice.tokenizer,
        opened.add_bos,
        torch.device(device),
        choice.reason if choice.tokenizer is None else "",
        choice.forced,
    )
