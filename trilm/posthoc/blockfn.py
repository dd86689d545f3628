"""A functional copy of the inference block's forward, with optional activation fake-quantization.

OmniQuant trains clipping and equivalent-transformation parameters *through* the block: the weights it feeds
are functions of those parameters, and in weight-activation modes (W4A4) every linear input and the rotated
queries/keys/values are fake-quantized per token, inside attention. ``trilm.infer.InferenceBlock`` has no
place for either, so this module computes the same math from explicit tensors: pre-norm RMSNorm in fp32,
rotate-half RoPE, SDPA with grouped-query attention, SwiGLU. A test holds it equal to the block's own
forward when given the block's weights and no activation quantization.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from trilm.infer.model import apply_rotary


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


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype) * weight


def block_weights(block: nn.Module) -> dict[str, torch.Tensor]:
    """The block's tensors by relative name (``attn_norm``, ``attn.wq``, …) as the functional forward reads
    them; absent sub-blocks are left out."""
    out: dict[str, torch.Tensor] = {}
    if block.attn is not None:
        out["attn_norm"] = block.attn_norm.weight
        for n in ("wq", "wk", "wv", "wo"):
            out[f"attn.{n}"] = getattr(block.attn, n).weight
    if block.mlp is not None:
        out["mlp_norm"] = block.mlp_norm.weight
        for n in ("w_gate", "w_up", "w_down"):
            out[f"mlp.{n}"] = getattr(block.mlp, n).weight
    return out


def block_forward(
    block: nn.Module,
    weights: dict[str, torch.Tensor],
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    act_bits: int = 16,
) -> torch.Tensor:
    """``block(x, cos, sin)`` computed with ``weights`` in place of the block's tensors; with
    ``act_bits`` < 16 the inputs of all seven linears and the rotated q, k and v are fake-quantized per
    token (softmax probabilities stay in float, as in OmniQuant)."""

    def aq(t: torch.Tensor) -> torch.Tensor:
        return quantize_activation(t, act_bits)

    if block.attn is not None:
        attn = block.attn
        b, s, _ = x.shape
        hd = attn.head_dim
        h = aq(_rms(x, weights["attn_norm"], block.attn_norm.eps))
        q = F.linear(h, weights["attn.wq"]).view(b, s, attn.heads, hd).transpose(1, 2)
        k = F.linear(h, weights["attn.wk"]).view(b, s, attn.kv_heads, hd).transpose(1, 2)
        v = F.linear(h, weights["attn.wv"]).view(b, s, attn.kv_heads, hd).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        q, k, v = aq(q), aq(k), aq(v)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=attn.kv_heads != attn.heads)
        out = out.transpose(1, 2).reshape(b, s, attn.heads * hd)
        x = x + F.linear(aq(out), weights["attn.wo"])
    if block.mlp is not None:
        h = aq(_rms(x, weights["mlp_norm"], block.mlp_norm.eps))
        hidden = F.silu(F.linear(h, weights["mlp.w_gate"])) * F.linear(h, weights["mlp.w_up"])
        x = x + F.linear(aq(hidden), weights["mlp.w_down"])
    return x


@torch.no_grad()
def forward_with_activation_quant(model: nn.Module, input_ids: torch.Tensor, act_bits: int) -> torch.Tensor:
    """Logits of an InferenceModel whose blocks run with per-token activation fake-quantization (W4A4
    evaluation in process; the packed runtime has no activation quantizer)."""
    x = model.embed(input_ids)
    cos, sin = model.rope(input_ids.shape[1], x.dtype)
    for block in model.layers:
        x = block_forward(block, block_weights(block), x, cos, sin, act_bits)
    return model.head(model.norm(x))
