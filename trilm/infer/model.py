"""The inference decoder: plain PyTorch over the canonical tensor names, no megatron and no process group.

Training needs megatron-core's tensor-parallel layers; inference, post-hoc calibration, evaluation and
serving need one process and as little Python per token as possible. This module is that second model
class. Module paths equal the canonical names of a snapshot (``layers.0.attn.wq.weight`` is
``model.layers[0].attn.wq.weight``), so a float model's ``state_dict()`` *is* a canonical state and any
linear can be swapped for a ``trilm.kernels.QuantLinear`` by name. The math is the training decoder's
(pre-norm RMSNorm in fp32, rotate-half RoPE, SDPA, SwiGLU); a test holds the logits of the two within 1e-5.

Serving adds one seam: :meth:`InferenceModel.forward_cached` runs the same blocks with explicit token
positions and hands each attention layer a *KV view* (any object with ``attend(q, k, v) -> out``) that
stores the new keys/values and attends over what it holds. The cache itself (slots, prefill, decode,
masks) lives in :mod:`trilm.serve.cache`; the no-cache ``forward`` is untouched by it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from trilm.model.config import LayerShape, ModelConfig
from trilm.model.ops import apply_rotary, rms_norm, rope_table
from trilm.model.spec import ATTENTION, MLP, SUB_BLOCKS, SubBlock, weight_key

Weights = dict[str, torch.Tensor]


class KVView(Protocol):
    """One attention layer's view of a KV cache for one forward step."""

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Store ``k``/``v`` [b, kv_heads, s, head_dim] and attend ``q`` [b, heads, s, head_dim] over the
        cached keys (causally); returns [b, heads, s, head_dim]."""
        ...


class KVCacheStep(Protocol):
    def layer(self, index: int) -> KVView: ...


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class _Linears(nn.Module):
    """A sub-block's linears as ``nn.Linear`` modules named and shaped by the architecture spec."""

    def __init__(self, cfg: ModelConfig, shape: LayerShape, sub: SubBlock):
        super().__init__()
        for lin in sub.linears:
            out_features, in_features = lin.shape(cfg, shape)
            self.add_module(lin.leaf, nn.Linear(in_features, out_features, bias=False))


class Attention(_Linears):
    """``wq``, ``wk``, ``wv``, ``wo`` of one block; the math is :func:`block_forward`'s. After
    :func:`trilm.infer.fuse.fuse_projections`, ``wqkv`` stacks the first three (``fused_sizes`` rows each)."""

    fused_sizes: tuple[int, ...] = ()

    def __init__(self, cfg: ModelConfig, shape: LayerShape):
        super().__init__(cfg, shape, ATTENTION)
        self.wqkv: nn.Module | None = None
        self.heads, self.kv_heads, self.head_dim = shape.heads, shape.kv_heads, cfg.head_dim


class SwiGLU(_Linears):
    """``w_gate``, ``w_up``, ``w_down`` of one block; the math is :func:`block_forward`'s (``w_gate_up``
    when fused)."""

    fused_sizes: tuple[int, ...] = ()

    def __init__(self, cfg: ModelConfig, shape: LayerShape):
        super().__init__(cfg, shape, MLP)
        self.w_gate_up: nn.Module | None = None


def _linear(module: nn.Module, x: torch.Tensor, weights: Weights | None, name: str) -> torch.Tensor:
    return module(x) if weights is None else F.linear(x, weights[name])


def block_forward(
    block: InferenceBlock,
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    kv: KVView | None = None,
    *,
    weights: Weights | None = None,
    act: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """The one forward of a block outside training: pre-norm RMSNorm in fp32, rotate-half RoPE, SDPA with
    grouped-query attention (or attention through a KV view), SwiGLU; a removed sub-block passes the
    residual through.

    Serving and evaluation call it through :class:`InferenceBlock` with the block's own modules (float
    ``nn.Linear`` or packed ``QuantLinear``). Post-hoc methods that train *through* a block (OmniQuant) pass
    ``weights``: tensors by relative name (``attn_norm``, ``attn.wq``, …, :func:`block_weights`) used in place
    of the block's, and ``act``: a fake quantizer applied to the input of every linear and to the rotated
    q, k and v (softmax probabilities stay in float).
    """
    attn, mlp = block.attn, block.mlp
    if attn is not None:
        b, s, _ = x.shape
        hd = attn.head_dim
        norm = block.attn_norm
        assert norm is not None  # a block with attention has its norm
        h = rms_norm(x, norm.weight if weights is None else weights[ATTENTION.norm], norm.eps)
        if act is not None:
            h = act(h)
        if attn.wqkv is not None and weights is None:
            q, k, v = attn.wqkv(h).split(attn.fused_sizes, dim=-1)
        else:
            q = _linear(attn.wq, h, weights, "attn.wq")
            k = _linear(attn.wk, h, weights, "attn.wk")
            v = _linear(attn.wv, h, weights, "attn.wv")
        q = q.reshape(b, s, attn.heads, hd).transpose(1, 2)
        k = k.reshape(b, s, attn.kv_heads, hd).transpose(1, 2)
        v = v.reshape(b, s, attn.kv_heads, hd).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if act is not None:
            q, k, v = act(q), act(k), act(v)
        if kv is None:
            gqa = attn.kv_heads != attn.heads
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        else:
            out = kv.attend(q, k, v)
        out = out.transpose(1, 2).reshape(b, s, attn.heads * hd)
        if act is not None:
            out = act(out)
        x = x + _linear(attn.wo, out, weights, "attn.wo")
    if mlp is not None:
        norm = block.mlp_norm
        assert norm is not None  # a block with an MLP has its norm
        h = rms_norm(x, norm.weight if weights is None else weights[MLP.norm], norm.eps)
        if act is not None:
            h = act(h)
        if mlp.w_gate_up is not None and weights is None:
            gate, up = mlp.w_gate_up(h).split(mlp.fused_sizes, dim=-1)
        else:
            gate, up = (
                _linear(mlp.w_gate, h, weights, "mlp.w_gate"),
                _linear(mlp.w_up, h, weights, "mlp.w_up"),
            )
        hidden = F.silu(gate) * up
        if act is not None:
            hidden = act(hidden)
        x = x + _linear(mlp.w_down, hidden, weights, "mlp.w_down")
    return x


def block_weights(block: InferenceBlock) -> Weights:
    """The block's tensors by name relative to the block (``attn_norm``, ``attn.wq``, …), as
    :func:`block_forward` reads them; absent sub-blocks are left out."""
    out: Weights = {}
    for sub in SUB_BLOCKS:
        module = getattr(block, sub.name)
        if module is not None:
            out[sub.norm] = getattr(block, sub.norm).weight
            out.update({lin.name: getattr(module, lin.leaf).weight for lin in sub.linears})
    return out


def block_linears(block: InferenceBlock) -> dict[str, nn.Module]:
    """The block's linears by name relative to the block (``attn.wq`` …) in forward order, absent sub-blocks
    (and projections fused away, :mod:`trilm.infer.fuse`) skipped."""
    out: dict[str, nn.Module] = {}
    for sub in SUB_BLOCKS:
        module = getattr(block, sub.name)
        if module is not None:
            out.update({lin.name: m for lin in sub.linears if (m := getattr(module, lin.leaf)) is not None})
    return out


class InferenceBlock(nn.Module):
    """One pre-norm block; a structurally pruned block may lack its attention or its MLP (``None``)."""

    def __init__(self, cfg: ModelConfig, shape: LayerShape):
        super().__init__()
        self.attn_norm = self.attn = self.mlp_norm = self.mlp = None
        if ATTENTION.present(shape):
            self.attn_norm = RMSNorm(cfg.hidden, cfg.norm_eps)
            self.attn = Attention(cfg, shape)
        if MLP.present(shape):
            self.mlp_norm = RMSNorm(cfg.hidden, cfg.norm_eps)
            self.mlp = SwiGLU(cfg, shape)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv: KVView | None = None
    ) -> torch.Tensor:
        return block_forward(self, x, cos, sin, kv)


class InferenceModel(nn.Module):
    """A LLaMA-style TriLM / FloatLM / BiLM / QuantLM for inference, on one device."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.padded_vocab, cfg.hidden)
        self.layers = nn.ModuleList(InferenceBlock(cfg, shape) for shape in cfg.layer_shapes())
        self.norm = RMSNorm(cfg.hidden, cfg.norm_eps)
        self.head = nn.Linear(cfg.hidden, cfg.padded_vocab, bias=False)
        cos, sin = rope_table(cfg.head_dim, cfg.rope_theta, cfg.context, scaling=cfg.rope_scaling)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

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

    def forward_cached(
        self,
        input_ids: torch.Tensor,
        positions: int | torch.Tensor,
        cache: KVCacheStep,
        *,
        last_only: bool = False,
    ) -> torch.Tensor:
        """Logits [b, s or 1, padded_vocab] of ``input_ids`` [b, s] at ``positions`` (an int S for 0..S−1,
        or [b, s] per-sequence positions), with attention through ``cache.layer(i)`` of each block.

        ``last_only`` projects only the last position to the vocabulary (a prefill needs one row)."""
        x = self.embed(input_ids)
        cos, sin = self.rope(positions, x.dtype)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, cache.layer(i) if layer.attn is not None else None)
        if last_only:
            x = x[:, -1:]
        return self.head(self.norm(x))

    def linear_modules(self) -> dict[str, nn.Module]:
        """Block linears by canonical weight name (``layers.3.mlp.w_up.weight`` → module)."""
        return {
            weight_key(i, name): module
            for i, layer in enumerate(self.layers)
            for name, module in block_linears(layer).items()
        }

    def set_linear(self, name: str, module: nn.Module) -> None:
        """Replace the block linear with canonical weight name ``name`` (e.g. by a ``QuantLinear``)."""
        path = name.removesuffix(".weight").split(".")
        parent: nn.Module = self
        for part in path[:-1]:
            parent = parent[int(part)] if part.isdigit() else getattr(parent, part)
        if not hasattr(parent, path[-1]):
            raise KeyError(f"{name}: no such block linear in this model")
        setattr(parent, path[-1], module)
