"""From unit scores to kept units, and from kept units to a physically smaller model.

Slicing works on canonical tensors (latent weights for TriLM/BiLM, which re-quantize on load), so the result
is an ordinary snapshot with per-layer shapes: ``layer_kv_heads`` / ``layer_ffn`` (0 = sub-block removed),
or fewer ``layers`` after block removal. When every block ends with the same FFN width the config is
normalised back to a global ``ffn`` (what Hugging Face's LLaMA can express). Head counts cannot be
normalised that way: trilm's config derives head_dim from hidden/heads, so a model with fewer heads in every
block keeps its per-layer list (and the HF export refuses it).
"""

from __future__ import annotations

import torch

from trilm.config import ConfigError
from trilm.model.config import LayerShape, ModelConfig
from trilm.model.spec import SUB_BLOCKS, TOP_TENSORS, weight_key
from trilm.prune.units import UnitGroup, kept_count


def select_units(
    scores: torch.Tensor,
    group: UnitGroup,
    keep: float,
    *,
    per_layer: bool = False,
    tiebreak: torch.Tensor | None = None,
) -> torch.Tensor:
    """Boolean keep-mask [group.total]: the highest scores, round(keep·units) of them.

    Globally by default; ``per_layer`` keeps round(keep·units of the block) in every block (the same
    width everywhere when blocks start equal). Ties are broken by ``tiebreak`` (higher first), then by the
    lower unit index, so a PG run that never moves its metric initialisation keeps the metric's units.
    """
    scores = scores.detach().double().cpu()
    tie = torch.zeros_like(scores) if tiebreak is None else tiebreak.detach().double().cpu()

    def top(idx: torch.Tensor, n: int) -> torch.Tensor:
        by_tie = idx[torch.argsort(-tie[idx], stable=True)]
        ranked = by_tie[torch.argsort(-scores[by_tie], stable=True)]
        return ranked[:n]

    mask = torch.zeros(group.total, dtype=torch.bool)
    if per_layer:
        if group.granularity == "layer":
            raise ConfigError("--per-layer: layer pruning has one unit per block; it is global by nature")
        for start, count in zip(group.offsets, group.counts):
            if count:
                idx = torch.arange(start, start + count)
                n = kept_count(keep, count, f"{group.granularity} units of a block")
                mask[top(idx, n)] = True
    else:
        n = kept_count(keep, group.total, f"{group.granularity} units")
        mask[top(torch.arange(group.total), n)] = True
    return mask


def check_sliceable(cfg: ModelConfig, granularities: tuple[str, ...]) -> None:
    """Refuse the TriLM/BiLM scale layouts that slicing would split (the rest re-quantize on load)."""
    if cfg.family == "floatlm":
        return
    q = cfg.quant
    parts = cfg.scale_partitions(1)
    if q.scale_group == "shard" and parts > 1 and granularities != ("layer",):
        raise ConfigError(
            f"{cfg.name}: a {cfg.family} with {parts} scale partitions per matrix (trained at "
            f"tensor-parallel {parts}) shares one absmean scale per partition; removing heads or channels "
            "unevenly would move weights across partitions and change every scale; only --granularity "
            "layer applies"
        )
    group = q.group_size
    if group is not None:
        if "channel" in granularities and group > 1:
            raise ConfigError(
                f"{cfg.name}: scale_group {q.scale_group} groups {group} consecutive inputs of w_down; "
                "removing single channels would split the groups. Only head or layer pruning applies"
            )
        if "head" in granularities and cfg.head_dim % group:
            raise ConfigError(
                f"{cfg.name}: scale_group {q.scale_group} does not divide head_dim {cfg.head_dim}; "
                "removing heads would split scale groups of wo"
            )


def _kept_by_layer(group: UnitGroup, mask: torch.Tensor) -> list[torch.Tensor]:
    return group.split(mask)


def slice_model(
    cfg: ModelConfig, state: dict[str, torch.Tensor], kept: dict[str, tuple[UnitGroup, torch.Tensor]]
) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """(smaller config, its canonical state) keeping the units ``kept[granularity] = (group, mask)``."""
    shapes = cfg.layer_shapes()
    rep, hd = cfg.heads // cfg.num_kv_heads, cfg.head_dim
    head_masks = _kept_by_layer(*kept["head"]) if "head" in kept else None
    ffn_masks = _kept_by_layer(*kept["channel"]) if "channel" in kept else None
    keep_layers = [bool(m) for m in kept["layer"][1].tolist()] if "layer" in kept else [True] * cfg.layers
    out: dict[str, torch.Tensor] = {name: state[name] for name in TOP_TENSORS}
    layer_kv: list[int] = []
    layer_ffn: list[int] = []
    for i, shape in enumerate(shapes):
        if not keep_layers[i]:
            continue
        new_index = len(layer_kv)
        kv, ffn = shape.kv_heads, shape.ffn
        rows: dict[str, torch.Tensor] = {}  # kept rows of each symbolic size the pruning changed
        if kv and head_masks is not None and int(head_masks[i].sum()) != kv:
            group_mask = head_masks[i]
            rows["q"], rows["kv"] = group_mask.repeat_interleave(rep * hd), group_mask.repeat_interleave(hd)
            kv = int(group_mask.sum())
        if ffn and ffn_masks is not None and int(ffn_masks[i].sum()) != ffn:
            rows["ffn"] = ffn_masks[i]
            ffn = int(ffn_masks[i].sum())
        new_shape = LayerShape(kv * rep, kv, ffn)
        for sub in SUB_BLOCKS:
            if not sub.present(new_shape):
                continue
            out[weight_key(new_index, sub.norm)] = state[weight_key(i, sub.norm)]
            for lin in sub.linears:
                w = state[weight_key(i, lin.name)]
                if lin.out_dim in rows:
                    w = w[rows[lin.out_dim]]
                if lin.in_dim in rows:
                    w = w[:, rows[lin.in_dim]]
                out[weight_key(new_index, lin.name)] = w
        layer_kv.append(kv)
        layer_ffn.append(ffn)
    new_cfg = normalised_config(cfg, layer_kv, layer_ffn)
    out = {k: v.contiguous().clone() for k, v in out.items()}
    return new_cfg, out


def normalised_config(cfg: ModelConfig, layer_kv: list[int], layer_ffn: list[int]) -> ModelConfig:
    """The config of blocks with these KV-head counts and FFN widths, in the simplest form that holds them:
    global ``ffn`` when every block has the same non-zero width, no per-layer list that says "all full"."""
    layers = len(layer_kv)
    ffn = cfg.ffn
    ffn_list: list[int] | None = list(layer_ffn)
    if len(set(layer_ffn)) == 1 and layer_ffn[0] > 0:
        ffn, ffn_list = layer_ffn[0], None
    kv_list = None if all(k == cfg.num_kv_heads for k in layer_kv) else list(layer_kv)
    return cfg.replace(layers=layers, ffn=ffn, layer_ffn=ffn_list, layer_kv_heads=kv_list)
