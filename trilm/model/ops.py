"""The elementwise math of a block, shared by the training decoder and the inference model.

Both decoders must compute the same function (a parity test holds their logits within 1e-5), so the pieces
that are not matmuls — RMSNorm in fp32, rotate-half RoPE and its frequency table — are written once here,
without megatron.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Pre-norm RMSNorm with a learnable gain, normalised in fp32 whatever ``x``'s dtype (LLaMA's)."""
    return F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype) * weight


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE (GPT-NeoX / HF LLaMA convention) on the last dim of ``x`` [b, heads, s, head_dim]."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def rope_inv_freq(head_dim: int, theta: float, scaling=None) -> torch.Tensor:
    """fp32 rotary frequencies [head_dim / 2]: θ^(−2i/d), scaled as ``scaling`` (a
    :class:`~trilm.model.config.RopeScaling`, or None for plain RoPE) says."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if scaling is None:
        return inv_freq
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
    context = scaling.original_max_position_embeddings
    wavelength = 2 * math.pi / inv_freq
    long_edge = context / scaling.low_freq_factor  # longer wavelengths are divided by factor
    short_edge = context / scaling.high_freq_factor  # shorter ones are kept
    smooth = (context / wavelength - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    between = (1 - smooth) * inv_freq / scaling.factor + smooth * inv_freq
    out = torch.where(wavelength > long_edge, inv_freq / scaling.factor, inv_freq)
    middle = (wavelength >= short_edge) & (wavelength <= long_edge)
    return torch.where(middle, between, out)


def rope_table(
    head_dim: int,
    theta: float,
    length: int,
    device: torch.device | str | None = None,
    scaling=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 (cos, sin) [length, head_dim] of positions 0..length−1 over the full head dim."""
    inv_freq = rope_inv_freq(head_dim, theta, scaling)
    t = torch.arange(length, device=device, dtype=torch.float32)
    freqs = torch.outer(t, inv_freq.to(device))
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()
