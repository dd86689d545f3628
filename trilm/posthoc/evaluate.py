"""Validation loss of an inference model (float, fake-quant or packed QuantLM) on the fixed validation set.

The sequences are the training run's validation set (:class:`trilm.data.sampler.ValidationSet`: the same
fixed sequences of ``seq_len + 1`` tokens every checkpoint is measured on), so a QuantLM's loss is directly
comparable with the ``val_loss`` its source snapshot recorded. Perplexity = exp(mean next-token loss).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from trilm.data.sampler import ValidationSet
from trilm.data.shards import TokenShards


@torch.no_grad()
def validation_loss(
    model: nn.Module,
    split_dir: str | Path,
    seq_len: int,
    *,
    max_sequences: int = 0,
    batch_size: int = 8,
    device: str | torch.device = "cpu",
    forward: Callable[[nn.Module, torch.Tensor], torch.Tensor] | None = None,
) -> float:
    """Mean next-token loss (nats) over a prepared split's validation sequences.

    ``forward(model, ids) -> logits`` replaces ``model(ids)`` (e.g. activation-quantized evaluation).
    The loss is over the padded vocabulary's logits, as the trainer computes it.
    """

    valid = ValidationSet(TokenShards.open(split_dir), seq_len, max_sequences)
    return next_token_loss(model, valid.batches(batch_size), device=device, forward=forward)


@torch.no_grad()
def next_token_loss(
    model: nn.Module,
    batches: Iterable[torch.Tensor],
    *,
    device: str | torch.device = "cpu",
    forward: Callable[[nn.Module, torch.Tensor], torch.Tensor] | None = None,
) -> float:
    """Mean next-token loss (nats) of ``model`` over token batches (B, L): each row predicts its own tokens
    1..L−1 from the ones before (calibration windows, validation sequences)."""
    total, count = 0.0, 0
    for batch in batches:
        batch = batch.to(device).long()
        logits = model(batch[:, :-1]) if forward is None else forward(model, batch[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten(), reduction="sum")
        total += float(loss)
        count += batch[:, 1:].numel()
    return total / count


def perplexity(loss: float) -> float:
    return math.exp(loss)
