"""The architecture spec: what a trilm decoder is made of, written once.

Every part of trilm that names a block's tensors — the training decoder's fused tensor-parallel layers,
the inference model, the post-hoc engine and its methods, pruning, the snapshot files, the Hugging Face and
GGUF mappings — reads them from here, so adding or renaming a tensor is one edit.

A block is two pre-norm sub-blocks, attention and a SwiGLU MLP, each with its RMSNorm gain and its linears.
For every block linear the spec says:

- its **canonical name** relative to the block (``attn.wq``; the snapshot key is ``layers.3.attn.wq.weight``);
- its **shape** in symbolic sizes, resolved per layer from :meth:`ModelConfig.layer_shape` (a structurally
  pruned model has its own head count and FFN width in every block; 0 removes a sub-block);
- its **input site**: linears that read the same tensor share one (q, k and v read the normed attention
  input), so methods collect one set of input statistics per site, and the training decoder fuses them into
  one column-parallel matrix;
- its **tensor-parallel style**: ``column`` splits the outputs, ``row`` the inputs (the output projections,
  whose sums are all-reduced into the residual stream);
- its **Hugging Face** and **GGUF** tensor names.

Shapes are (out_features, in_features), as ``nn.Linear`` stores them.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Literal

from trilm.model.config import LayerShape, ModelConfig

Dim = Literal["hidden", "q", "kv", "ffn"]
"""Symbolic sizes: ``hidden``; ``q`` = heads · head_dim; ``kv`` = kv_heads · head_dim; ``ffn``."""
Parallel = Literal["column", "row"]


@dataclasses.dataclass(frozen=True)
class BlockLinear:
    """One linear of a block (see the module docstring for what each field means)."""

    name: str
    out_dim: Dim
    in_dim: Dim
    site: str
    parallel: Parallel
    hf: str
    gguf: str
    rope: bool = False
    """Its output rows are RoPE-rotated head pairs (q and k): layouts with another pair order permute them."""
    fed_by: str | None = None
    """The linear whose outputs reach this one's inputs through a linear path (an attention head's output is
    a weighted sum of ``wv`` rows; ``w_down`` reads ``silu(gate) · up``): a per-input-column scale of this
    matrix can be folded into that one's rows."""

    @property
    def sub(self) -> str:
        """The sub-block it belongs to: ``attn`` or ``mlp``."""
        return self.name.split(".", 1)[0]

    @property
    def leaf(self) -> str:
        """Its module name inside the sub-block (``wq``)."""
        return self.name.split(".", 1)[1]

    @property
    def is_output_projection(self) -> bool:
        """Writes into the residual stream (row-parallel; gets the scaled init std/sqrt(2·layers))."""
        return self.parallel == "row"

    def shape(self, cfg: ModelConfig, layer: LayerShape) -> tuple[int, int]:
        """(out_features, in_features) in a block of shape ``layer``."""
        return dim_size(cfg, layer, self.out_dim), dim_size(cfg, layer, self.in_dim)


@dataclasses.dataclass(frozen=True)
class SubBlock:
    """A pre-norm sub-block: present in a layer when its ``size`` (kv heads, FFN width) is not 0."""

    name: str
    norm: str
    norm_hf: str
    norm_gguf: str
    size: Dim

    def present(self, layer: LayerShape) -> bool:
        return (layer.kv_heads if self.size == "kv" else layer.ffn) > 0

    @property
    def linears(self) -> tuple[BlockLinear, ...]:
        return tuple(lin for lin in LINEARS if lin.sub == self.name)


ATTENTION = SubBlock("attn", "attn_norm", "input_layernorm", "attn_norm", "kv")
MLP = SubBlock("mlp", "mlp_norm", "post_attention_layernorm", "ffn_norm", "ffn")
SUB_BLOCKS: tuple[SubBlock, ...] = (ATTENTION, MLP)

LINEARS: tuple[BlockLinear, ...] = (
    BlockLinear("attn.wq", "q", "hidden", "attn_in", "column", "self_attn.q_proj", "attn_q", rope=True),
    BlockLinear("attn.wk", "kv", "hidden", "attn_in", "column", "self_attn.k_proj", "attn_k", rope=True),
    BlockLinear("attn.wv", "kv", "hidden", "attn_in", "column", "self_attn.v_proj", "attn_v"),
    BlockLinear(
        "attn.wo", "hidden", "q", "attn_out", "row", "self_attn.o_proj", "attn_output", fed_by="attn.wv"
    ),
    BlockLinear("mlp.w_gate", "ffn", "hidden", "mlp_in", "column", "mlp.gate_proj", "ffn_gate"),
    BlockLinear("mlp.w_up", "ffn", "hidden", "mlp_in", "column", "mlp.up_proj", "ffn_up"),
    BlockLinear(
        "mlp.w_down", "hidden", "ffn", "mlp_act", "row", "mlp.down_proj", "ffn_down", fed_by="mlp.w_up"
    ),
)
"""The block linears in forward order."""
LINEAR_NAMES: tuple[str, ...] = tuple(lin.name for lin in LINEARS)
BY_NAME: dict[str, BlockLinear] = {lin.name: lin for lin in LINEARS}
SITES: tuple[str, ...] = tuple(dict.fromkeys(lin.site for lin in LINEARS))
"""Input sites in forward order: ``attn_in``, ``attn_out``, ``mlp_in``, ``mlp_act``."""

FINAL_NORM = "norm"
"""The norm before the head (canonical ``norm.weight``)."""

TOP_TENSORS: dict[str, tuple[str, str]] = {
    "embed.weight": ("model.embed_tokens.weight", "token_embd.weight"),
    f"{FINAL_NORM}.weight": ("model.norm.weight", "output_norm.weight"),
    "head.weight": ("lm_head.weight", "output.weight"),
}
"""The tensors outside the blocks: canonical name → (Hugging Face name, GGUF name)."""


def dim_size(cfg: ModelConfig, layer: LayerShape, dim: Dim) -> int:
    if dim == "hidden":
        return cfg.hidden
    if dim == "q":
        return layer.heads * cfg.head_dim
    if dim == "kv":
        return layer.kv_heads * cfg.head_dim
    return layer.ffn


def linears_of(layer: LayerShape) -> tuple[BlockLinear, ...]:
    """The linears a block of this shape has (a removed sub-block has none), in forward order."""
    return tuple(lin for sub in SUB_BLOCKS if sub.present(layer) for lin in sub.linears)


def site_groups(names: tuple[str, ...] = LINEAR_NAMES) -> tuple[tuple[str, ...], ...]:
    """``names`` grouped by input site, sites in forward order (each group reads one tensor)."""
    groups = tuple(tuple(n for n in names if BY_NAME[n].site == site) for site in SITES)
    return tuple(g for g in groups if g)


def weight_key(index: int, name: str) -> str:
    """The snapshot key of a block tensor: ``weight_key(3, "attn.wq")`` → ``layers.3.attn.wq.weight``."""
    return f"layers.{index}.{name}.weight"


_KEY = re.compile(r"^layers\.(\d+)\.(.+)\.weight$")


def parse_key(key: str) -> tuple[int, str] | None:
    """(layer index, name relative to the block) of a block tensor's key; None for the top tensors."""
    m = _KEY.match(key)
    return (int(m.group(1)), m.group(2)) if m else None


def linear_of(key: str) -> BlockLinear | None:
    """The block linear a snapshot key names (``layers.3.mlp.w_up.weight``), or None (norms, embeddings)."""
    parsed = parse_key(key)
    return BY_NAME.get(parsed[1]) if parsed else None


def canonical_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every canonical tensor of a model with this config and its full shape, in model order."""
    shapes: dict[str, tuple[int, ...]] = {"embed.weight": (cfg.padded_vocab, cfg.hidden)}
    for i, layer in enumerate(cfg.layer_shapes()):
        for sub in SUB_BLOCKS:
            if not sub.present(layer):
                continue
            shapes[weight_key(i, sub.norm)] = (cfg.hidden,)
            for lin in sub.linears:
                shapes[weight_key(i, lin.name)] = lin.shape(cfg, layer)
    shapes["norm.weight"] = (cfg.hidden,)
    shapes["head.weight"] = (cfg.padded_vocab, cfg.hidden)
    return shapes


def _block_names(kind: Literal["hf", "gguf"]) -> dict[str, str]:
    """Relative canonical name (``attn.wq``, ``attn_norm``) → the other format's relative name."""
    out = {sub.norm: sub.norm_hf if kind == "hf" else sub.norm_gguf for sub in SUB_BLOCKS}
    out.update({lin.name: getattr(lin, kind) for lin in LINEARS})
    return out


_HF_BLOCK, _GGUF_BLOCK = _block_names("hf"), _block_names("gguf")


def hf_name(key: str) -> str:
    """The Hugging Face ``LlamaForCausalLM`` name of a canonical tensor."""
    if key in TOP_TENSORS:
        return TOP_TENSORS[key][0]
    index, name = _split(key)
    return f"model.layers.{index}.{_HF_BLOCK[name]}.weight"


def gguf_name(key: str) -> str:
    """The llama.cpp GGUF name of a canonical tensor (``blk.3.attn_q.weight``)."""
    if key in TOP_TENSORS:
        return TOP_TENSORS[key][1]
    index, name = _split(key)
    return f"blk.{index}.{_GGUF_BLOCK[name]}.weight"


def _split(key: str) -> tuple[int, str]:
    parsed = parse_key(key)
    if parsed is None or parsed[1] not in _HF_BLOCK:
        raise KeyError(f"{key}: not a canonical tensor name")
    return parsed
