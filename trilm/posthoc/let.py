"""OmniQuant's learnable equivalent transformation (LET) for LLaMA blocks, grouped-query attention included.

Per-channel scales s move quantization difficulty between activations and weights without changing the
float function (SmoothQuant's identity  x·Wᵀ = (x / s)·(W·s)ᵀ), on four pairs:

- ``qkv``: attn_norm gain / s, columns of wq, wk, wv · s                              (s: hidden)
- ``fc1``: mlp_norm gain / s, columns of w_gate, w_up · s                             (s: hidden)
- ``out``: rows of wv / s, columns of wo · s — with GQA one scale per *KV* channel, repeated over the query
  heads that read that KV head (the reference sizes it by wo's inputs and breaks on GQA)  (s: kv·head_dim)
- ``qk``:  rows of wq / s, rows of wk · s, so q·k is unchanged. RoPE rotates channel j with j + head_dim/2,
  so both share one scale, and a KV head's scale is shared by its query heads       (s: kv × head_dim/2)

w_down's input is left alone (the authors: its sparse post-SwiGLU features make the scales unstable). No
shifts: trilm's LLaMA blocks have no biases to absorb them. Scales are kept at |s| ≥ 1e-2 with a
straight-through truncation, as the reference does. Initialization: s = max|x|^α / max|W|^(1−α) per input
channel (SmoothQuant), max|W| over every linear that reads the channel; ``qk`` starts at 1.
"""

from __future__ import annotations

import torch
from torch import nn


class _Truncate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, s: torch.Tensor, threshold: float) -> torch.Tensor:
        small = s.abs() < threshold
        sign = torch.where(s < 0, -1.0, 1.0).to(s.dtype)
        return torch.where(small, sign * threshold, s)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


def truncate(s: torch.Tensor, threshold: float = 1e-2) -> torch.Tensor:
    """|s| ≥ threshold keeping the sign; gradients pass straight through."""
    return _Truncate.apply(s, threshold)


def smooth_init(act_absmax: torch.Tensor, weights: list[torch.Tensor], alpha: float) -> torch.Tensor:
    """SmoothQuant's s = max|x|^α / max|W|^(1−α) per input channel (weights are (out, in))."""
    w = torch.stack([wt.abs().amax(dim=0) for wt in weights]).amax(dim=0).clamp(min=1e-5)
    return (act_absmax.clamp(min=1e-5).pow(alpha) / w.pow(1 - alpha)).clamp(min=1e-5)


class LETScales(nn.Module):
    """The trainable LET scales of one block and the weight transform they define."""

    def __init__(self, block: nn.Module, act_absmax: dict[str, torch.Tensor], alpha: float):
        super().__init__()
        self.has_attn, self.has_mlp = block.attn is not None, block.mlp is not None
        if self.has_attn:
            a = block.attn
            self.heads, self.kv, self.hd = a.heads, a.kv_heads, a.head_dim
            self.group = a.heads // a.kv_heads
            w = [a.wq.weight, a.wk.weight, a.wv.weight]
            self.qkv = nn.Parameter(smooth_init(act_absmax["attn_in"], w, alpha))
            per_kv_act = act_absmax["attn_out"].view(self.kv, self.group, self.hd).amax(1).reshape(-1)
            wo_cols = a.wo.weight.abs().amax(0).view(self.kv, self.group, self.hd).amax(1).reshape(1, -1)
            self.out = nn.Parameter(smooth_init(per_kv_act, [wo_cols], alpha))
            self.qk = nn.Parameter(torch.ones(self.kv, self.hd // 2, device=a.wq.weight.device))
        if self.has_mlp:
            m = block.mlp
            self.fc1 = nn.Parameter(
                smooth_init(act_absmax["mlp_in"], [m.w_gate.weight, m.w_up.weight], alpha)
            )

    def _qk_rows(self, s: torch.Tensor, heads: int) -> torch.Tensor:
        """Row scales of wq (heads = query heads) or wk (heads = kv heads) from the (kv, hd/2) table."""
        per_kv = torch.cat([s, s], dim=1)  # RoPE pairs (j, j + hd/2) share a scale
        if heads != self.kv:
            per_kv = per_kv.repeat_interleave(self.group, dim=0)
        return per_kv.reshape(-1)

    def transform(self, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The equivalent weights (same float function) for the current scales."""
        out = dict(weights)
        if self.has_attn:
            qkv, so, qk = truncate(self.qkv), truncate(self.out), truncate(self.qk)
            out["attn_norm"] = weights["attn_norm"] / qkv
            out["attn.wq"] = weights["attn.wq"] * qkv / self._qk_rows(qk, self.heads)[:, None]
            out["attn.wk"] = weights["attn.wk"] * qkv * self._qk_rows(qk, self.kv)[:, None]
            out["attn.wv"] = weights["attn.wv"] * qkv / so[:, None]
            so_cols = so.view(self.kv, 1, self.hd).expand(self.kv, self.group, self.hd).reshape(-1)
            out["attn.wo"] = weights["attn.wo"] * so_cols
        if self.has_mlp:
            fc1 = truncate(self.fc1)
            out["mlp_norm"] = weights["mlp_norm"] / fc1
            out["mlp.w_gate"] = weights["mlp.w_gate"] * fc1
            out["mlp.w_up"] = weights["mlp.w_up"] * fc1
        return out
