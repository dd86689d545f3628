"""Running a block the way OmniQuant trains and evaluates it: given weights, activations fake-quantized.

OmniQuant trains clipping and equivalent-transformation parameters *through* the block: the weights it feeds
are functions of those parameters, and in weight-activation modes (W4A4) every linear input and the rotated
queries/keys/values are fake-quantized per token, inside attention. Both go through the one block forward,
:func:`trilm.infer.model.block_forward` (its ``weights`` and ``act`` arguments); this module holds the
activation quantizer and the whole-model evaluation with it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import nn

from trilm.infer.model import block_forward


def round_ste(x: torch.Tensor) -> torch.Tensor:
    """round(x) forward, identity backward (straight-through estimator)."""
    return (x.round() - x).detach() + x


def quantize_activation(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Per-token dynamic asymmetric fake quantization over the last dim (OmniQuant's activation grid).

    s = (max − min) / (2^b − 1) clamped to [1e-5, 1e4], z = round(−min / s), x̂ = s·(clamp(⌊x/s⌉ + z) − z);
    rounding passes gradients straight through. ``bits`` ≥ 16 returns ``x``.
    """
    if bits >= 16:
        return x
    maxq = (1 << bits) - 1
    xmin = x.amin(-1, keepdim=True)
    xmax = x.amax(-1, keepdim=True)
    scale = ((xmax - xmin) / maxq).clamp(min=1e-5, max=1e4)
    zero = (-xmin / scale).clamp(min=-1e4, max=1e4).round()
    q = torch.clamp(round_ste(x / scale) + zero, 0, maxq)
    return (q - zero) * scale


def activation_quantizer(bits: int) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The ``act`` argument of :func:`~trilm.infer.model.block_forward` for ``bits`` (None: float)."""
    return None if bits >= 16 else functools.partial(quantize_activation, bits=bits)


@torch.no_grad()
def forward_with_activation_quant(model: nn.Module, input_ids: torch.Tensor, act_bits: int) -> torch.Tensor:
    """Logits of an InferenceModel whose blocks run with per-token activation fake-quantization (W4A4
    evaluation in process; the packed runtime has no activation quantizer)."""
    x = model.embed(input_ids)
    cos, sin = model.rope(input_ids.shape[1], x.dtype)
    act = activation_quantizer(act_bits)
    for block in model.layers:
        x = block_forward(block, x, cos, sin, act=act)
    return model.head(model.norm(x))
