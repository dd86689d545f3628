"""Building blocks of the decoder, composed from megatron-core's tensor-parallel layers.

megatron-core's ``GPTModel`` does not run on CPU (its RoPE calls ``torch.cuda``), so the LLaMA block is
assembled here from ``ColumnParallelLinear``/``RowParallelLinear``; the quantized variants subclass them and
fake-quantize each rank's partition right before megatron's own matmul, so tensor-parallel communication and
gradient handling stay megatron's.

Every parameter knows its *canonical* full tensors (``wq``, ``wk``, ``wv``…) and how its local shard is cut
from them, which makes checkpoints independent of the tensor-parallel degree.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from megatron.core import tensor_parallel
from megatron.core.model_parallel_config import ModelParallelConfig
from torch import nn

from trilm.model.config import LayerShape, ModelConfig
from trilm.model.ops import apply_rotary, rms_norm, rope_table
from trilm.model.quant import ScaleLayout, fake_quant_activation, quantized_linear
from trilm.model.spec import ATTENTION, MLP, Parallel, SubBlock, linear_of, weight_key
from trilm.parallel import reduce_scatter_to_sequence_parallel_region


def megatron_config(
    tp: int, dtype: torch.dtype = torch.float32, sequence_parallel: bool = False
) -> ModelParallelConfig:
    """Weights are created on CPU, then filled from canonical full tensors (``Decoder.reset_parameters``)."""
    return ModelParallelConfig(
        tensor_model_parallel_size=tp,
        use_cpu_initialization=True,
        perform_initialization=False,
        params_dtype=dtype,
        sequence_parallel=sequence_parallel and tp > 1,
        gradient_accumulation_fusion=False,
    )


class _ShardSpec:
    """Maps canonical full tensors to this rank's shard and back (``parts`` = canonical names)."""

    parts: tuple[str, ...]
    part_sizes: tuple[int, ...]
    shard_dim: int | None
    weight: torch.Tensor  # the module's own (possibly fused) local weight

    def load_part(self, name: str, full: torch.Tensor, tp: int, rank: int) -> None:
        """Copy this rank's slice of the canonical tensor ``name`` into the (possibly fused) local weight."""
        if self.shard_dim is None:
            self.weight.copy_(full)
            return
        index = self.parts.index(name)
        offset = sum(size // tp for size in self.part_sizes[:index])
        piece = full.chunk(tp, dim=self.shard_dim)[rank]
        self.weight.narrow(self.shard_dim, offset, self.part_sizes[index] // tp).copy_(piece)

    def unshard(self, gathered: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        """Canonical tensors from the local shards of all ranks (in rank order)."""
        if self.shard_dim is None:
            return {self.parts[0]: gathered[0]}
        tp = len(gathered)
        local_sizes = [s // tp for s in self.part_sizes]
        per_rank = [g.split(local_sizes, dim=self.shard_dim) for g in gathered]
        return {
            name: torch.cat([pieces[i] for pieces in per_rank], dim=self.shard_dim)
            for i, name in enumerate(self.parts)
        }


def _linear_impl(layer, input, weight, allreduce_dgrad=False, sequence_parallel=False, tp_group=None, **kw):
    """Stands in for megatron's ``linear_with_grad_accumulation_and_async_allreduce`` (same flags): the
    quantizing :class:`~trilm.model.quant.QuantizedLinear`, which keeps the latent weight, not W̃, for
    backward. Bias, gradient-accumulation fusion and deferred wgrad are never enabled in trilm."""
    if kw.get("bias") is not None or kw.get("gradient_accumulation_fusion"):
        raise NotImplementedError("trilm linears have no bias and no gradient-accumulation fusion")
    return quantized_linear(
        input,
        weight,
        layer.layout,
        allreduce_dgrad=allreduce_dgrad,
        sequence_parallel=sequence_parallel,
        group=tp_group if tp_group is not None else layer.tp_group,
    )


class QuantColumnParallelLinear(tensor_parallel.ColumnParallelLinear, _ShardSpec):
    """Column-parallel linear (outputs split); fused sub-matrices (q|k|v, gate|up) keep separate scales."""

    def __init__(self, in_features, segments: dict[str, int], layout: ScaleLayout, act_bits, *, config):
        super().__init__(in_features, sum(segments.values()), config=config, init_method=None, bias=False)
        self.parts, self.part_sizes, self.shard_dim = tuple(segments), tuple(segments.values()), 0
        self.layout, self.act_bits = layout, act_bits

    def _forward_impl(self, input, weight, **kwargs):
        return _linear_impl(self, fake_quant_activation(input, self.act_bits), weight, **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[b, s, in] → [b, s, out/TP]; under sequence parallelism x is [b, s/TP, in] (gathered inside)."""
        return super().forward(x)[0]


class QuantRowParallelLinear(tensor_parallel.RowParallelLinear, _ShardSpec):
    """Row-parallel linear (inputs split, outputs all-reduced)."""

    def __init__(self, name: str, in_features, out_features, layout: ScaleLayout, act_bits, *, config):
        super().__init__(
            in_features,
            out_features,
            config=config,
            init_method=None,
            bias=False,
            input_is_parallel=True,
            skip_bias_add=True,
        )
        self.parts, self.part_sizes, self.shard_dim = (name,), (in_features,), 1
        self.layout, self.act_bits = layout, act_bits

    def _forward_impl(self, input, weight, **kwargs):
        input = fake_quant_activation(input, self.act_bits, reduce_over_tp=self.layout.tp_size > 1)
        return _linear_impl(self, input, weight, **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[b, s, in/TP] → [b, s, out] (summed over TP ranks), or [b, s/TP, out] under sequence
        parallelism (megatron's reduce-scatter, done by a device-agnostic version: see trilm.parallel)."""
        if not self.sequence_parallel:
            return super().forward(x)[0]
        return reduce_scatter_to_sequence_parallel_region(self._forward_impl(x, self.weight), self.tp_group)


class RMSNorm(nn.Module, _ShardSpec):
    """Pre-norm RMSNorm with a learnable gain (LLaMA's, not BitNet's parameter-free SubLN)."""

    def __init__(self, name: str, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.parts, self.part_sizes, self.shard_dim = (name,), (dim,), None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class Rotary(nn.Module):
    """RoPE over the full head dim, rotate-half convention (GPT-NeoX and HF LLaMA; no Q/K permutation)."""

    def __init__(self, head_dim: int, context: int, theta: float, scaling=None):
        super().__init__()
        self.head_dim, self.context, self.theta, self.scaling = head_dim, context, theta, scaling

    def cos_sin(self, seq_len: int, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = rope_table(self.head_dim, self.theta, seq_len, device, self.scaling)
        return cos.to(dtype), sin.to(dtype)


def _layout(
    cfg: ModelConfig, parallel: Parallel, segments: tuple[int, ...], tp: int, rank: int
) -> ScaleLayout:
    return ScaleLayout(
        fmt=cfg.weight_format,
        group=cfg.quant.scale_group,
        partitions=cfg.scale_partitions(tp),
        parallel=parallel,
        segments=segments,
        eps=cfg.quant.eps,
        tp_size=tp,
        tp_rank=rank,
    )


def _sub_block_layers(
    cfg: ModelConfig, shape: LayerShape, index: int, sub: SubBlock, mp_config, tp: int, rank: int
) -> tuple[QuantColumnParallelLinear, QuantRowParallelLinear]:
    """A sub-block's column-parallel linears fused into one matrix (they read the same input site: q|k|v,
    gate|up; each keeps its own scales) and its row-parallel output projection."""
    columns = [lin for lin in sub.linears if lin.parallel == "column"]
    (out,) = [lin for lin in sub.linears if lin.parallel == "row"]
    segments = {weight_key(index, lin.name): lin.shape(cfg, shape)[0] for lin in columns}
    act = cfg.quant.activation_bits if cfg.family != "floatlm" else None
    col = _layout(cfg, "column", tuple(segments.values()), tp, rank)
    fused = QuantColumnParallelLinear(cfg.hidden, segments, col, act, config=mp_config)
    out_features, in_features = out.shape(cfg, shape)
    row = _layout(cfg, "row", (cfg.hidden,), tp, rank)
    name = weight_key(index, out.name)
    return fused, QuantRowParallelLinear(name, in_features, out_features, row, act, config=mp_config)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, shape: LayerShape, index: int, mp_config, tp: int, rank: int):
        super().__init__()
        self.local_heads, self.local_kv = shape.heads // tp, shape.kv_heads // tp
        self.head_dim = cfg.head_dim
        self.wqkv, self.wo = _sub_block_layers(cfg, shape, index, ATTENTION, mp_config, tp, rank)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        hd, heads, kv = self.head_dim, self.local_heads, self.local_kv
        qkv = self.wqkv(x)
        b, s = qkv.shape[:2]  # the whole sequence, also when x is a sequence-parallel slice
        qkv = qkv.view(b, s, heads + 2 * kv, hd)
        # q and k are rotated together: one set of elementwise ops over both
        qk = apply_rotary(qkv[:, :, : heads + kv].transpose(1, 2), cos, sin)
        q, k = qk.split([heads, kv], dim=1)
        v = qkv[:, :, heads + kv :].transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=kv != heads)
        return self.wo(out.transpose(1, 2).reshape(b, s, self.local_heads * hd))


class SwiGLU(nn.Module):
    def __init__(self, cfg: ModelConfig, shape: LayerShape, index: int, mp_config, tp: int, rank: int):
        super().__init__()
        self.w_gate_up, self.w_down = _sub_block_layers(cfg, shape, index, MLP, mp_config, tp, rank)
        self.local_ffn = shape.ffn // tp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w_gate_up(x).split(self.local_ffn, dim=-1)
        return self.w_down(F.silu(gate.contiguous()) * up)


class Block(nn.Module):
    """Pre-norm attention and SwiGLU sub-blocks; a pruned block may lack either (then only the residual)."""

    def __init__(self, cfg: ModelConfig, index: int, mp_config, tp: int, rank: int):
        super().__init__()
        shape = cfg.layer_shape(index)
        self.attn_norm: RMSNorm | None = None
        self.attn: Attention | None = None
        self.mlp_norm: RMSNorm | None = None
        self.mlp: SwiGLU | None = None
        if ATTENTION.present(shape):
            self.attn_norm = RMSNorm(weight_key(index, ATTENTION.norm), cfg.hidden, cfg.norm_eps)
            self.attn = Attention(cfg, shape, index, mp_config, tp, rank)
        if MLP.present(shape):
            self.mlp_norm = RMSNorm(weight_key(index, MLP.norm), cfg.hidden, cfg.norm_eps)
            self.mlp = SwiGLU(cfg, shape, index, mp_config, tp, rank)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if self.attn is not None and self.attn_norm is not None:
            x = x + self.attn(self.attn_norm(x), cos, sin)
        if self.mlp is not None and self.mlp_norm is not None:
            x = x + self.mlp(self.mlp_norm(x))
        return x


def init_std_for(name: str, cfg: ModelConfig) -> float:
    """Output projections (wo, w_down) get the scaled init std/sqrt(2·layers). Under μP
    (``cfg.mup_base_width``) block matrices are further divided by sqrt(m) and the LM head by m."""
    m = cfg.width_multiplier
    if name == "embed.weight":
        return cfg.init_std
    if name == "head.weight":
        return cfg.init_std / m
    std = cfg.init_std / math.sqrt(m)
    linear = linear_of(name)
    if linear is not None and linear.is_output_projection:
        return std / math.sqrt(2 * cfg.layers)
    return std
