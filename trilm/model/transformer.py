"""The decoder: vocab-parallel embedding, blocks, final norm, column-parallel LM head.

``Decoder(input_ids)`` returns full-vocabulary logits (gathered across tensor-parallel ranks);
``Decoder(input_ids, labels=...)`` returns the per-token loss computed by megatron's vocab-parallel cross
entropy without ever materialising the full logits on one rank.

State is exchanged as *canonical full tensors* (``full_state_dict`` / ``load_full_state_dict``): names and
shapes that do not depend on the tensor-parallel degree, so a checkpoint written at TP=2 loads at TP=1.
"""

from __future__ import annotations

import hashlib

import torch
import torch.distributed as dist
import torch.nn.functional as F
from megatron.core import tensor_parallel
from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes
from torch import nn
from torch.utils.checkpoint import checkpoint

from trilm.model.config import ModelConfig
from trilm.model.layers import (
    Block,
    QuantColumnParallelLinear,
    RMSNorm,
    Rotary,
    _ShardSpec,
    init_std_for,
    megatron_config,
)
from trilm.model.quant import ScaleLayout
from trilm.parallel import ParallelInfo, current_parallel, scatter_to_sequence_parallel_region, tp_group


class _VocabEmbedding(tensor_parallel.VocabParallelEmbedding, _ShardSpec):
    def __init__(self, vocab: int, dim: int, *, config):
        super().__init__(vocab, dim, init_method=None, config=config)
        self.parts, self.part_sizes, self.shard_dim = ("embed.weight",), (vocab,), 0


class _GatherVocab(torch.autograd.Function):
    """All-gather vocab-parallel logits along the last dim (megatron's version allocates on CUDA)."""

    @staticmethod
    def forward(ctx, local: torch.Tensor) -> torch.Tensor:
        group = tp_group()
        pieces = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
        dist.all_gather(pieces, local.contiguous(), group=group)
        ctx.rank, ctx.width = dist.get_rank(group), local.shape[-1]
        return torch.cat(pieces, dim=-1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad.narrow(-1, ctx.rank * ctx.width, ctx.width).contiguous()


def _sum_over_tp(grad: torch.Tensor) -> torch.Tensor:
    grad = grad.clone()
    dist.all_reduce(grad, group=tp_group())
    return grad


class Decoder(nn.Module):
    """A LLaMA-style TriLM / FloatLM / BiLM on the current tensor-parallel layout."""

    def __init__(self, cfg: ModelConfig, parallel: ParallelInfo | None = None, seed: int | None = 0):
        super().__init__()
        parallel = parallel or current_parallel()
        tp, rank = parallel.tp_size, parallel.tp_rank
        cfg.check_tensor_parallel(tp)
        self.cfg = cfg.resolved(tp)
        self.tp_size, self.tp_rank = tp, rank
        mp = megatron_config(tp, sequence_parallel=parallel.sequence_parallel)
        self.sequence_parallel = mp.sequence_parallel
        self.recompute: frozenset[int] = frozenset()
        self.embed = _VocabEmbedding(cfg.padded_vocab, cfg.hidden, config=mp)
        self.layers = nn.ModuleList(Block(self.cfg, i, mp, tp, rank) for i in range(cfg.layers))
        self.norm = RMSNorm("norm.weight", cfg.hidden, cfg.norm_eps)
        head_layout = ScaleLayout(fmt="float")
        self.head = QuantColumnParallelLinear(
            cfg.hidden, {"head.weight": cfg.padded_vocab}, head_layout, None, config=mp
        )
        self.rotary = Rotary(cfg.head_dim, cfg.context, cfg.rope_theta, cfg.rope_scaling)
        self._owners = {name: m for m in self.shard_modules() for name in m.parts}
        for m in self.shard_modules():
            if m.shard_dim is not None:  # grad-norm and optimizer code count sharded weights once per rank
                set_tensor_model_parallel_attributes(m.weight, True, m.shard_dim, 1)
        if self.sequence_parallel:  # norm gains see 1/TP of the tokens: sum their gradients over TP
            for m in self.modules():
                if isinstance(m, RMSNorm):
                    m.weight.register_hook(_sum_over_tp)
        if seed is not None:
            self.reset_parameters(seed)

    def set_recompute(self, blocks: int | str) -> None:
        """Activation recompute: the first ``blocks`` blocks ("all": every one; 0: none) keep only their
        input for backward and run their forward again inside it (about a third more block compute)."""
        n = len(self.layers) if blocks == "all" else int(blocks)
        if not 0 <= n <= len(self.layers):
            raise ValueError(f"recompute: {blocks!r} blocks, the model has {len(self.layers)}")
        self.recompute = frozenset(range(n))

    # ---- canonical state ---------------------------------------------------------------------------
    def shard_modules(self) -> list[_ShardSpec]:
        return [m for m in self.modules() if isinstance(m, _ShardSpec)]

    def canonical_shapes(self) -> dict[str, tuple[int, ...]]:
        """Full (unsharded) tensor shapes by canonical name, in a fixed order."""
        shapes: dict[str, tuple[int, ...]] = {}
        for m in self.shard_modules():
            w = m.weight
            for name, size in zip(m.parts, m.part_sizes):
                if m.shard_dim is None:
                    shapes[name] = tuple(w.shape)
                elif m.shard_dim == 0:
                    shapes[name] = (size, w.shape[1])
                else:
                    shapes[name] = (w.shape[0], size)
        return shapes

    @torch.no_grad()
    def reset_parameters(self, seed: int) -> None:
        """Initialise from canonical full tensors drawn from ``seed``: the same weights at every TP degree."""
        for index, (name, shape) in enumerate(self.canonical_shapes().items()):
            if name.endswith("norm.weight"):
                continue
            gen = torch.Generator().manual_seed(int(seed) * 1_000_003 + index)
            full = torch.empty(shape).normal_(0.0, init_std_for(name, self.cfg), generator=gen)
            self._load_one(name, full)
        for m in self.shard_modules():
            if isinstance(m, RMSNorm):
                m.weight.fill_(1.0)

    def _load_one(self, name: str, full: torch.Tensor) -> None:
        owner = self._owners[name]
        owner.load_part(
            name, full.to(device=owner.weight.device, dtype=owner.weight.dtype), self.tp_size, self.tp_rank
        )

    @torch.no_grad()
    def load_full_state_dict(self, state: dict[str, torch.Tensor], strict: bool = True) -> None:
        expected = self.canonical_shapes()
        missing = [k for k in expected if k not in state]
        unexpected = [k for k in state if k not in expected]
        if strict and (missing or unexpected):
            raise KeyError(f"state dict mismatch: missing {missing[:5]}, unexpected {unexpected[:5]}")
        for name, shape in expected.items():
            if name not in state:
                continue
            tensor = state[name]
            if tuple(tensor.shape) != shape:
                raise ValueError(f"{name}: shape {tuple(tensor.shape)} does not match the model's {shape}")
            self._load_one(name, tensor)

    @torch.no_grad()
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Canonical full tensors (CPU, gathered over tensor-parallel ranks; every TP rank gets them)."""
        out: dict[str, torch.Tensor] = {}
        for m in self.shard_modules():
            w = m.weight.detach()
            if m.shard_dim is None or self.tp_size == 1:
                gathered = [w]
            else:
                gathered = [torch.empty_like(w) for _ in range(self.tp_size)]
                dist.all_gather(gathered, w.contiguous(), group=tp_group())
            if m.shard_dim is None:
                out[m.parts[0]] = w.cpu().clone()
            else:
                out.update({k: v.cpu().clone() for k, v in m.unshard(gathered).items()})
        shapes = self.canonical_shapes()
        return {k: out[k] for k in shapes}

    def quantized_linears(self) -> list[QuantColumnParallelLinear]:
        return [m for m in self.modules() if hasattr(m, "layout") and m is not self.head]

    # ---- forward -------------------------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [b, s, padded_vocab] (fp32 when the model is), or per-token loss [b, s] given labels."""
        _b, s = input_ids.shape
        if s > self.cfg.context:
            raise ValueError(f"sequence length {s} exceeds the model context {self.cfg.context}")
        x = self.embed(input_ids)
        cos, sin = self.rotary.cos_sin(s, x.device, x.dtype)
        if self.sequence_parallel:
            x = scatter_to_sequence_parallel_region(x)
        for i, layer in enumerate(self.layers):
            if i in self.recompute and torch.is_grad_enabled():
                x = checkpoint(layer, x, cos, sin, use_reentrant=False, preserve_rng_state=False)
            else:
                x = layer(x, cos, sin)
        x = self.norm(x)
        logits = self.head(x)
        if labels is None:
            if self.tp_size > 1:
                logits = _GatherVocab.apply(logits)
            return logits
        if self.tp_size == 1:  # same math, one fused kernel instead of megatron's sharded steps
            flat = F.cross_entropy(logits.float().flatten(0, -2), labels.flatten(), reduction="none")
            return flat.view_as(labels)
        return tensor_parallel.vocab_parallel_cross_entropy(logits.float(), labels)

    def parameter_fingerprint(self) -> str:
        """A short hash of the canonical weights (tests and logs compare runs with it)."""
        h = hashlib.sha256()
        for name, t in self.full_state_dict().items():
            h.update(name.encode())
            h.update(t.float().numpy().tobytes())
        return h.hexdigest()[:16]
