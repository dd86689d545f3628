"""Weight fake-quantization for TriLM (ternary) and BiLM (binary), with a straight-through estimator.

The latent float weights are what the optimizer updates; the forward pass multiplies by their quantized
image W̃. Ternary: γ = eps + mean|W| over a scale group, W̃ = γ·round(clip(W/γ, −1, 1)). Binary:
α = mean|W|, W̃ = α·sign(W) with sign(0) = +1. The backward pass is the identity (∂L/∂W := ∂L/∂W̃), so
training costs what FloatLM's does plus an elementwise pass over the weights.

Scale groups are described by a :class:`ScaleLayout`, which knows how a matrix is split across tensor-parallel
ranks. With ``shard`` scales the number of *scale partitions* P is a property of the checkpoint, not of the
current run: when the local shard holds whole partitions the scales are local; when one partition spans
several ranks (loaded at a higher TP than trained) their |W| sums are all-reduced, so the quantized weights
do not depend on how the model is split.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import torch
import torch.distributed as dist

from trilm.model.config import ModelConfig


@dataclasses.dataclass(frozen=True)
class ScaleLayout:
    """Everything needed to compute the scales of one (possibly fused, possibly sharded) weight matrix.

    ``segments`` are the full output sizes of fused sub-matrices (e.g. q, k, v), each with its own scales;
    ``parallel`` says which dimension tensor parallelism splits: ``column`` splits outputs (each segment
    separately), ``row`` splits inputs.
    """

    fmt: Literal["float", "ternary", "binary"]
    group: str = "shard"
    partitions: int = 1
    parallel: Literal["column", "row"] = "column"
    segments: tuple[int, ...] = ()
    eps: float = 1e-6
    tp_size: int = 1
    tp_rank: int = 0

    @property
    def kind(self) -> str:
        return "group" if self.group.startswith("group:") else self.group

    @property
    def group_size(self) -> int:
        return int(self.group.split(":")[1])

    @property
    def cells(self) -> int:
        """Scale cells of the full matrix along its tensor-parallel dimension, per segment."""
        return 1 if self.kind == "tensor" else self.partitions


def _all_reduce(t: torch.Tensor, op=dist.ReduceOp.SUM) -> torch.Tensor:
    from trilm.parallel import tp_group

    dist.all_reduce(t, op=op, group=tp_group())
    return t


def _block_absmean(w: torch.Tensor, blocks: int, dim: int, full_numel_per_block: int, layout: ScaleLayout):
    """Mean |w| per block along ``dim`` (blocks local or shared with other ranks), expanded like ``w``."""
    t, r = layout.tp_size, layout.tp_rank
    if (blocks >= t and blocks % t == 0) or t == 1:
        local_blocks = max(blocks // t, 1)
        if dim == 0:
            sums = w.reshape(local_blocks, -1).abs().sum(1, dtype=torch.float32)
            return (sums / full_numel_per_block).repeat_interleave(w.shape[0] // local_blocks)[:, None]
        sums = w.reshape(w.shape[0], local_blocks, -1).abs().sum((0, 2), dtype=torch.float32)
        return (sums / full_numel_per_block).repeat_interleave(w.shape[1] // local_blocks)[None, :]
    ranks_per_block = t // blocks
    vec = torch.zeros(blocks, dtype=torch.float32, device=w.device)
    vec[r // ranks_per_block] = w.abs().sum(dtype=torch.float32)
    _all_reduce(vec)
    return (vec[r // ranks_per_block] / full_numel_per_block).reshape(1, 1)


def weight_scales(w: torch.Tensor, layout: ScaleLayout) -> torch.Tensor:
    """Scales (fp32) broadcastable against the local weight ``w`` (out_local, in_local)."""
    kind = layout.kind
    binary = layout.fmt == "binary"
    if kind == "group":
        g = layout.group_size
        out, k = w.shape
        s = w.reshape(out, k // g, g).abs().mean(-1, dtype=torch.float32)
        s = s.repeat_interleave(g, dim=1)
    elif kind == "row":
        s = w.abs().sum(1, keepdim=True, dtype=torch.float32)
        if layout.parallel == "row" and layout.tp_size > 1:
            _all_reduce(s)
        s = s / (w.shape[1] * (layout.tp_size if layout.parallel == "row" else 1))
    elif layout.parallel == "column":
        parts = []
        start = 0
        for seg_full in layout.segments or (w.shape[0] * layout.tp_size,):
            rows = seg_full // layout.tp_size
            piece = w[start : start + rows]
            numel = seg_full // layout.cells * w.shape[1]
            parts.append(_block_absmean(piece, layout.cells, 0, numel, layout).expand(rows, 1))
            start += rows
        s = torch.cat(parts, 0)
    else:
        numel = w.shape[0] * (w.shape[1] * layout.tp_size // layout.cells)
        s = _block_absmean(w, layout.cells, 1, numel, layout)
    return s if binary else s + layout.eps


def quantize_weight(w: torch.Tensor, layout: ScaleLayout) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, scales): integer codes in {−1,0,1} (ternary) or {−1,1} (binary) and their fp32 scales."""
    s = weight_scales(w.detach(), layout)
    wf = w.detach().float()
    if layout.fmt == "binary":
        codes = torch.where(wf >= 0, 1.0, -1.0)
    else:
        codes = torch.clamp(torch.round(wf / s), -1.0, 1.0)
    return codes, s


class _StraightThrough(torch.autograd.Function):
    """Forward: the quantized image of the weight; backward: the incoming gradient, unchanged."""

    @staticmethod
    def forward(ctx, w: torch.Tensor, layout: ScaleLayout) -> torch.Tensor:
        codes, s = quantize_weight(w, layout)
        return (codes * s).to(w.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


def fake_quant_weight(w: torch.Tensor, layout: ScaleLayout) -> torch.Tensor:
    if layout.fmt == "float":
        return w
    return _StraightThrough.apply(w, layout)


class _ActivationSTE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, reduce_over_tp: bool) -> torch.Tensor:
        xf = x.float()
        amax = xf.abs().amax(-1, keepdim=True)
        if reduce_over_tp:
            _all_reduce(amax, op=dist.ReduceOp.MAX)
        scale = 127.0 / amax.clamp(min=1e-5)
        return (torch.clamp(torch.round(xf * scale), -128, 127) / scale).to(x.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


def fake_quant_activation(x: torch.Tensor, bits: int | None, reduce_over_tp: bool = False) -> torch.Tensor:
    """Per-token absmax int8 fake-quant (BitNet b1.58); ``reduce_over_tp`` when x is split along hidden."""
    if bits is None:
        return x
    return _ActivationSTE.apply(x, reduce_over_tp)


def packing_scales(w_full: torch.Tensor, layout: ScaleLayout) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Codes (int8, N×K) and scales laid out as (K // g, N) for the packing codec, from a full matrix.

    Dequantization is ``W[n, k] = codes[n, k] * scales[k // g, n]``; ``g`` is K for scales that vary
    only by output row (column-parallel partitions, rows, tensors) and K/P or the group size otherwise.
    """
    layout = dataclasses.replace(layout, tp_size=1, tp_rank=0)
    codes, s = quantize_weight(w_full, layout)
    n, k = w_full.shape
    s = s.expand(n, k)
    if layout.kind == "group":
        g = layout.group_size
    elif layout.parallel == "row" and layout.kind == "shard":
        g = k // layout.cells
    else:
        g = k
    scales = s[:, ::g].t().contiguous()
    return codes.to(torch.int8), scales, g


def canonical_layout(cfg: ModelConfig, name: str) -> ScaleLayout | None:
    """The TP=1 scale layout of one canonical block matrix (None for embeddings, head and norms)."""
    if cfg.family == "floatlm" or not name.startswith("layers.") or "norm" in name:
        return None
    parallel = "row" if name.endswith(("wo.weight", "w_down.weight")) else "column"
    full = ScaleLayout(
        fmt=cfg.weight_format,
        group=cfg.quant.scale_group,
        partitions=cfg.scale_partitions(1),
        parallel=parallel,
        eps=cfg.quant.eps,
    )
    return full
