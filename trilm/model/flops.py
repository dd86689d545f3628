"""Parameter counts and the one FLOPs function (used by ``trilm model info``, MFU logging and scaling fits).

Counting is analytic from the config, so it works for a 3.9B preset without building it; a test checks it
against the parameters of a built model.
"""

from __future__ import annotations

import dataclasses

from trilm.model.config import ModelConfig
from trilm.model.spec import SUB_BLOCKS, linears_of


@dataclasses.dataclass(frozen=True)
class ParamCounts:
    embedding: int
    head: int
    linear: int
    """The block linears (attention + MLP): the weights TriLM/BiLM quantize."""
    norm: int

    @property
    def total(self) -> int:
        return self.embedding + self.head + self.linear + self.norm

    @property
    def nonembedding(self) -> int:
        """Everything but the token embedding and the (untied) LM head."""
        return self.linear + self.norm


def parameter_counts(cfg: ModelConfig) -> ParamCounts:
    """Counts per block from its own shape, so structurally pruned models count what they store."""
    d = cfg.hidden
    linear = norm = 0
    for shape in cfg.layer_shapes():
        for lin in linears_of(shape):
            out_features, in_features = lin.shape(cfg, shape)
            linear += out_features * in_features
        norm += d * sum(sub.present(shape) for sub in SUB_BLOCKS)
    return ParamCounts(
        embedding=cfg.padded_vocab * d,
        head=cfg.padded_vocab * d,
        linear=linear,
        norm=norm + d,
    )


def flops_per_token(cfg: ModelConfig, seq_len: int | None = None, training: bool = True) -> float:
    """Matmul FLOPs per token: 2·(block linears + LM head) + attention scores/values, ×3 when training.

    Attention counts QKᵀ and AV over the full ``seq_len`` window (2·2·layers·heads·head_dim·seq_len per
    token forward), as PaLM and nanoGPT do, i.e. without halving for the causal mask; the embedding lookup
    and elementwise work (norms, SwiGLU, fake-quant) are not matmuls and are not counted.
    """
    seq_len = cfg.context if seq_len is None else seq_len
    counts = parameter_counts(cfg)
    heads = sum(shape.heads for shape in cfg.layer_shapes())
    forward = 2 * (counts.linear + counts.head) + 4 * heads * cfg.head_dim * seq_len
    return float(3 * forward if training else forward)
