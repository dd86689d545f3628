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

Training runs every linear through :class:`QuantizedLinear`, one autograd function that quantizes the latent
weight, multiplies, and keeps only the input, the latent weight (the parameter itself: no extra memory) and
the small scale tensor for backward; backward rebuilds W̃ from them instead of keeping a second copy of every
matrix alive from forward to backward. It also carries megatron-core's tensor-parallel communication
(input-gradient all-reduce, or sequence-parallel all-gather/reduce-scatter), so it is a drop-in for
megatron's ``linear_with_grad_accumulation_and_async_allreduce``.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import torch
import torch.distributed as dist

from trilm.model.config import ModelConfig
from trilm.model.spec import linear_of
from trilm.parallel import gather_sequence, reduce_scatter_sequence, tp_group


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


def compact_scales(w: torch.Tensor, layout: ScaleLayout) -> torch.Tensor:
    """The scales (fp32) in their smallest form: broadcastable against ``w`` (out_local, in_local), except
    for ``group:g`` scales, which are (out_local, in_local // g) and apply to ``w`` viewed as groups."""
    kind = layout.kind
    binary = layout.fmt == "binary"
    if kind == "group":
        g = layout.group_size
        out, k = w.shape
        s = w.reshape(out, k // g, g).abs().mean(-1, dtype=torch.float32)
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


def weight_scales(w: torch.Tensor, layout: ScaleLayout) -> torch.Tensor:
    """Scales (fp32) broadcastable against the local weight ``w`` (out_local, in_local)."""
    s = compact_scales(w, layout)
    if layout.kind == "group":
        s = s.repeat_interleave(layout.group_size, dim=1)
    return s


def _image(wf: torch.Tensor, s: torch.Tensor, fmt: str) -> torch.Tensor:
    """s·codes(wf/s), in place on one fp32 temporary (eager PyTorch would otherwise keep two alive)."""
    if fmt == "binary":
        return torch.where(wf >= 0, 1.0, -1.0).mul_(s)
    return torch.div(wf, s).round_().clamp_(-1.0, 1.0).mul_(s)


def _quantized_image_eager(w: torch.Tensor, s: torch.Tensor, layout: ScaleLayout) -> torch.Tensor:
    with torch.no_grad():
        wf = w.float()
        if layout.kind == "group":
            out, k = w.shape
            g = layout.group_size
            return _image(wf.view(out, k // g, g), s[..., None], layout.fmt).view(out, k).to(w.dtype)
        return _image(wf, s, layout.fmt).to(w.dtype)


_fused: dict | None = None


def set_fused_quantizer(enabled: bool) -> None:
    """Route :func:`quantize` (forward) and :func:`quantized_image` (backward) through ``torch.compile``: the
    scale reduction and the round/clip/scale pass become generated kernels that read W once each and keep
    no fp32 copy of it (a training lever; the same values up to the summation order of mean|W|)."""
    global _fused
    _fused = None
    if enabled:
        _fused = {
            "quantize": torch.compile(_quantize_eager, dynamic=False),
            "image": torch.compile(_quantized_image_eager, dynamic=False),
        }


def _quantize_eager(w: torch.Tensor, layout: ScaleLayout) -> tuple[torch.Tensor, torch.Tensor]:
    s = compact_scales(w, layout)
    return _quantized_image_eager(w, s, layout), s


def quantize(w: torch.Tensor, layout: ScaleLayout) -> tuple[torch.Tensor, torch.Tensor]:
    """(W̃, compact scales) of a (detached) latent weight; the fused kernels when enabled."""
    if _fused is not None and not torch.compiler.is_compiling():
        return _fused["quantize"](w, layout)
    return _quantize_eager(w, layout)


def quantized_image(w: torch.Tensor, s: torch.Tensor, layout: ScaleLayout) -> torch.Tensor:
    """W̃ = s·codes(W/s) in ``w``'s dtype from the latent weight and its :func:`compact_scales`.

    The arithmetic is fp32 whatever the weight dtype (the same values as :func:`weight_codes`); eager
    PyTorch materialises one fp32 temporary, the fused version (:func:`set_fused_quantizer`) none.
    """
    if _fused is not None and not torch.compiler.is_compiling():
        return _fused["image"](w, s, layout)
    return _quantized_image_eager(w, s, layout)


def weight_codes(w: torch.Tensor, layout: ScaleLayout) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, scales) of a latent TriLM/BiLM weight: integer codes in {−1,0,1} (ternary) or {−1,1}
    (binary) and their fp32 scales — the QAT quantizer (post-hoc methods are trilm.posthoc.quantize_layer)."""
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
        codes, s = weight_codes(w, layout)
        return (codes * s).to(w.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


def fake_quant_weight(w: torch.Tensor, layout: ScaleLayout) -> torch.Tensor:
    if layout.fmt == "float":
        return w
    return _StraightThrough.apply(w, layout)


_ramp: torch.Tensor | None = None
"""λ of a conversion's ramp (a 0-d fp32 tensor) while it is below 1; None otherwise (:func:`set_ramp`)."""


def set_ramp(value: float | None, device: torch.device | str = "cpu") -> None:
    """Make every quantized linear use W + λ·(W̃ − W) instead of W̃, with λ = ``value``.

    The phase-in of Hugging Face's 1.58-bit fine-tuning: a float model converted to ternary starts at
    λ = 0 (its own weights) and reaches W̃ at λ = 1, so the first steps do not start from the loss of the
    rounded model. The gradient stays the straight-through one (∂L/∂W := ∂L/∂W_λ, the ``.detach()`` form of
    the formula). ``None`` or λ ≥ 1 is W̃ itself, exactly (W + 1·(W̃ − W) can round otherwise). λ lives in
    one tensor updated in place, so a compiled block reads it as an input and is not recompiled per value.
    """
    global _ramp
    if value is None or value >= 1:
        _ramp = None
    elif _ramp is None or _ramp.device != torch.device(device):
        _ramp = torch.tensor(float(value), dtype=torch.float32, device=device)
    else:
        _ramp.fill_(float(value))


def ramp_value() -> float | None:
    """The λ :func:`set_ramp` set (None: the quantized weights themselves)."""
    return None if _ramp is None else float(_ramp)


def _blend(w: torch.Tensor, wq: torch.Tensor, lam: torch.Tensor | None) -> torch.Tensor:
    """W + λ·(W̃ − W) in fp32, in ``w``'s dtype (λ = 0 gives W bit for bit); W̃ when ``lam`` is None."""
    if lam is None:
        return wq
    return torch.lerp(w.detach().float(), wq.float(), lam).to(w.dtype)


class QuantizedLinear(torch.autograd.Function):
    """y = x·W̃ᵀ with the straight-through estimator, saving (x, latent W, scales) instead of W̃.

    Forward: W̃ from the latent weight (scales all-reduced over tensor-parallel ranks where a scale cell
    spans several), then the matmul; with ``sequence_parallel`` the input is first all-gathered along the
    sequence. Backward: W̃ is rebuilt from the saved latent weight and scales (elementwise; no collective),
    ∂L/∂x = g·W̃ (all-reduced over TP ranks when ``allreduce_dgrad``, reduce-scattered along the sequence
    under sequence parallelism), and ∂L/∂W := ∂L/∂W̃ = gᵀ·x goes to the latent weight unchanged (STE).
    For ``fmt="float"`` W̃ is W itself, so FloatLM runs the very same function. During a conversion's ramp
    (:func:`set_ramp`) the matrix is W + λ·(W̃ − W), rebuilt the same way in backward.
    """

    @staticmethod
    def forward(ctx, input, weight, layout: ScaleLayout, allreduce_dgrad, sequence_parallel, group):
        ramp = None
        if layout.fmt == "float":
            wq, s = weight, None
        else:
            wq, s = quantize(weight.detach(), layout)
            ramp = _ramp
            wq = _blend(weight, wq, ramp)
        total = gather_sequence(input, group) if sequence_parallel else input
        ctx.save_for_backward(input, weight, s)
        ctx.layout, ctx.allreduce_dgrad, ctx.sequence_parallel, ctx.group, ctx.ramp = (
            layout,
            allreduce_dgrad,
            sequence_parallel,
            group,
            ramp,
        )
        return torch.matmul(total, wq.t())

    @staticmethod
    def backward(ctx, grad_output):
        input, weight, s = ctx.saved_tensors
        wq = weight if s is None else _blend(weight, quantized_image(weight, s, ctx.layout), ctx.ramp)
        total = gather_sequence(input, ctx.group) if ctx.sequence_parallel else input
        grad_input = grad_output.matmul(wq)
        handle = None
        if ctx.sequence_parallel:
            grad_input = reduce_scatter_sequence(grad_input, ctx.group)
        elif ctx.allreduce_dgrad:
            handle = dist.all_reduce(grad_input, group=ctx.group, async_op=True)
        grad_weight = None
        if ctx.needs_input_grad[1]:
            g2 = grad_output.reshape(-1, grad_output.shape[-1])
            grad_weight = g2.t().matmul(total.reshape(-1, total.shape[-1]))
        if handle is not None:
            handle.wait()
        return grad_input, grad_weight, None, None, None, None


def quantized_linear(
    input: torch.Tensor,
    weight: torch.Tensor,
    layout: ScaleLayout,
    *,
    allreduce_dgrad: bool = False,
    sequence_parallel: bool = False,
    group=None,
) -> torch.Tensor:
    """``input @ W̃ᵀ`` through :class:`QuantizedLinear` (see there for the communication flags)."""
    return QuantizedLinear.apply(input, weight, layout, allreduce_dgrad, sequence_parallel, group)


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
    codes, s = weight_codes(w_full, layout)
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
    linear = linear_of(name)
    if cfg.family == "floatlm" or linear is None:
        return None
    return ScaleLayout(
        fmt=cfg.weight_format,
        group=cfg.quant.scale_group,
        partitions=cfg.scale_partitions(1),
        parallel=linear.parallel,
        eps=cfg.quant.eps,
    )


def dequantize_latent(cfg: ModelConfig, name: str, tensor: torch.Tensor) -> torch.Tensor:
    """The quantized image γ·Ŵ of a TriLM/BiLM block matrix (canonical ``name``); other tensors unchanged."""
    layout = canonical_layout(cfg, name)
    if layout is None:
        return tensor
    codes, scales = weight_codes(tensor, layout)
    return (codes * scales).to(tensor.dtype)
