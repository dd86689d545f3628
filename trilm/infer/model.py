"""The inference decoder: plain PyTorch over the canonical tensor names, no megatron and no process group.

Training needs megatron-core's tensor-parallel layers; inference, post-hoc calibration, evaluation and
serving need one process and as little Python per token as possible. This module is that second model
class. Module paths equal the canonical names of a snapshot (``layers.0.attn.wq.weight`` is
``model.layers[0].attn.wq.weight``), so a float model's ``state_dict()`` *is* a canonical state and any
linear can be swapped for a ``kernels.QuantLinear`` by name. The math is the training decoder's
(pre-norm RMSNorm in fp32, rotate-half RoPE, SDPA, SwiGLU); a test holds the logits of the two within 1e-5.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from trilm.model.config import LayerShape, ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype) * self.weight


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE (GPT-NeoX / HF LLaMA convention) on the last dim of ``x`` [b, heads, s, head_dim]."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, shape: LayerShape):
        super().__init__()
        hd = cfg.head_dim
        self.heads, self.kv_heads, self.head_dim = shape.heads, shape.kv_heads, hd
        self.wq = nn.Linear(cfg.hidden, shape.heads * hd, bias=False)
        self.wk = nn.Linear(cfg.hidden, shape.kv_heads * hd, bias=False)
        self.wv = nn.Linear(cfg.hidden, shape.kv_heads * hd, bias=False)
        self.wo = nn.Linear(shape.heads * hd, cfg.hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv_heads != self.heads)
        return self.wo(out.transpose(1, 2).reshape(b, s, self.heads * self.head_dim))


class SwiGLU(nn.Module):
    def __init__(self, cfg: ModelConfig, ffn: int):
        super().__init__()
        self.w_gate = nn.Linear(cfg.hidden, ffn, bias=False)
        self.w_up = nn.Linear(cfg.hidden, ffn, bias=False)
        self.w_down = nn.Linear(ffn, cfg.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


class InferenceBlock(nn.Module):
    """One pre-norm block; a structurally pruned block may lack its attention or its MLP (``None``)."""

    def __init__(self, cfg: ModelConfig, shape: LayerShape):
        super().__init__()
        self.attn_norm = self.attn = self.mlp_norm = self.mlp = None
        if shape.kv_heads:
            self.attn_norm = RMSNorm(cfg.hidden, cfg.norm_eps)
            self.attn = Attention(cfg, shape)
        if shape.ffn:
            self.mlp_norm = RMSNorm(cfg.hidden, cfg.norm_eps)
            self.mlp = SwiGLU(cfg, shape.ffn)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if self.attn is not None:
            x = x + self.attn(self.attn_norm(x), cos, sin)
        if self.mlp is not None:
            x = x + self.mlp(self.mlp_norm(x))
        return x


class InferenceModel(nn.Module):
    """A LLaMA-style TriLM / FloatLM / BiLM / QuantLM for inference, on one device."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.padded_vocab, cfg.hidden)
        self.layers = nn.ModuleList(InferenceBlock(cfg, shape) for shape in cfg.layer_shapes())
        self.norm = RMSNorm(cfg.hidden, cfg.norm_eps)
        self.head = nn.Linear(cfg.hidden, cfg.padded_vocab, bias=False)
        inv_freq = 1.0 / (
            cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.int64).float() / cfg.head_dim)
        )
        freqs = torch.outer(torch.arange(cfg.context, dtype=torch.float32), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("rope_cos", emb.cos(), persistent=False)
        self.register_buffer("rope_sin", emb.sin(), persistent=False)

    def rope(
        self, positions: int | torch.Tensor, dtype: torch.dtype | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) for ``positions``: an int S (positions 0..S−1, shape [S, head_dim]) or a tensor of
        positions ([S] → [S, head_dim]; [B, S] → [B, 1, S, head_dim], per-sequence offsets)."""
        if isinstance(positions, int):
            if positions > self.cfg.context:
                raise ValueError(f"sequence length {positions} exceeds the model context {self.cfg.context}")
            cos, sin = self.rope_cos[:positions], self.rope_sin[:positions]
        else:
            cos, sin = self.rope_cos[positions], self.rope_sin[positions]
            if positions.dim() == 2:
                cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        dtype = dtype or self.embed.weight.dtype
        return cos.to(dtype), sin.to(dtype)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Logits [b, s, padded_vocab] of a full causal forward (no cache)."""
        x = self.embed(input_ids)
        cos, sin = self.rope(input_ids.shape[1], x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.head(self.norm(x))

    def linear_modules(self) -> dict[str, nn.Module]:
        """Block linears by canonical weight name (``layers.3.mlp.w_up.weight`` → module)."""
        out: dict[str, nn.Module] = {}
        for i, layer in enumerate(self.layers):
            for part, names in (("attn", ("wq", "wk", "wv", "wo")), ("mlp", ("w_gate", "w_up", "w_down"))):
                sub = getattr(layer, part)
                if sub is not None:
                    out.update({f"layers.{i}.{part}.{n}.weight": getattr(sub, n) for n in names})
        return out

    def set_linear(self, name: str, module: nn.Module) -> None:
        """Replace the block linear with canonical weight name ``name`` (e.g. by a ``QuantLinear``)."""
        path = name.removesuffix(".weight").split(".")
        parent: nn.Module = self
        for part in path[:-1]:
            parent = parent[int(part)] if part.isdigit() else getattr(parent, part)
        if not hasattr(parent, path[-1]):
            raise KeyError(f"{name}: no such block linear in this model")
        setattr(parent, path[-1], module)
