"""Metric scores of pruning units: magnitude, Wanda-SP-style structured scores and block importance.

All three come from one no-grad pass over the calibration windows on the dense model (hooks record what
the metrics need), so the baselines and the PG initialisation see the same data.

- ``magnitude``: the ℓ2 norm of every weight the unit owns (a KV group: its q/k/v rows and wo columns; a
  channel: its w_gate and w_up rows and its w_down column).
- ``wanda``: Wanda's |W_ij|·‖X_j‖ on the input columns of ``wo`` / ``w_down`` (‖X_j‖ the root-mean-square of
  input feature j over the calibration tokens), averaged over output rows; a head sums its head_dim columns,
  a KV group averages its query heads (as the reference's Wanda-SP initialisation, which hard-codes
  head_dim 128; here it is the model's). The reference gathers each block's inputs from the outputs of
  the already-masked blocks before it, which presumes per-block budgets; with a global budget the masks
  are not known block by block, so the statistics are those of the dense model.
- ``block-importance`` (ShortGPT's Block Influence): 1 − the mean cosine similarity between a block's input
  and output hidden states over the calibration tokens; a block that barely turns the residual stream is
  the first to go.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from trilm.config import ConfigError
from trilm.infer.model import InferenceModel
from trilm.prune.units import UnitGroup

METRICS = ("magnitude", "wanda", "block-importance")
METRIC_GRANULARITIES = {
    "magnitude": ("head", "channel"),
    "wanda": ("head", "channel"),
    "block-importance": ("layer",),
}


@dataclasses.dataclass
class CalibrationStats:
    """Per-block sums over the calibration tokens (None where a block lacks the sub-block)."""

    wo_sq: list[torch.Tensor | None]
    """Σ x_j² of the inputs of ``attn.wo`` [heads·head_dim]."""
    down_sq: list[torch.Tensor | None]
    """Σ x_j² of the inputs of ``mlp.w_down`` [ffn]."""
    block_cos: list[float]
    """Σ over tokens of cos(block input, block output)."""
    tokens: int


@torch.no_grad()
def collect_stats(
    model: InferenceModel, windows: torch.Tensor, batch_size: int = 8, progress: bool = False
) -> CalibrationStats:
    """One forward pass over ``windows`` [n, seq] with hooks accumulating what the metrics need."""
    layers = list(model.layers)
    n = len(layers)
    wo_sq: list[torch.Tensor | None] = [None] * n
    down_sq: list[torch.Tensor | None] = [None] * n
    cos = torch.zeros(n, dtype=torch.float64)
    handles = []

    def accumulate(store, i):
        def hook(_module, args):
            x = args[0].detach().float()
            sq = x.pow(2).sum(dim=tuple(range(x.dim() - 1))).double().cpu()
            store[i] = sq if store[i] is None else store[i] + sq

        return hook

    def block_hook(i):
        def hook(_module, args, out):
            sim = F.cosine_similarity(args[0].float(), out.float(), dim=-1)
            cos[i] += sim.double().sum().cpu()

        return hook

    for i, layer in enumerate(layers):
        if layer.attn is not None:
            handles.append(layer.attn.wo.register_forward_pre_hook(accumulate(wo_sq, i)))
        if layer.mlp is not None:
            handles.append(layer.mlp.w_down.register_forward_pre_hook(accumulate(down_sq, i)))
        handles.append(layer.register_forward_hook(block_hook(i)))
    device = model.embed.weight.device
    batches = windows.split(batch_size)
    if progress:
        batches = tqdm(batches, desc="calibration statistics", unit="batch", dynamic_ncols=True)
    try:
        for batch in batches:
            model(batch.to(device))
    finally:
        for h in handles:
            h.remove()
    return CalibrationStats(wo_sq, down_sq, cos.tolist(), int(windows.numel()))


def check_metric(metric: str, granularity: str) -> None:
    if metric not in METRICS:
        raise ConfigError(f"--method: unknown metric {metric!r}; choose from {', '.join(METRICS)}")
    if granularity not in METRIC_GRANULARITIES[metric]:
        allowed = ", ".join(METRIC_GRANULARITIES[metric])
        raise ConfigError(
            f"--method {metric} scores {allowed} units, not {granularity}s "
            f"(layers: block-importance; heads and channels: magnitude or wanda)"
        )


@torch.no_grad()
def unit_scores(
    model: InferenceModel, group: UnitGroup, metric: str, stats: CalibrationStats | None = None
) -> torch.Tensor:
    """Flat scores [group.total] (float64, CPU), higher = more important."""
    check_metric(metric, group.granularity)
    if metric != "magnitude" and stats is None:
        raise ValueError(f"{metric} needs calibration statistics")
    cfg = model.cfg
    rep, hd = cfg.heads // cfg.num_kv_heads, cfg.head_dim
    out: list[torch.Tensor] = []
    for i, layer in enumerate(model.layers):
        if group.counts[i] == 0:
            continue
        if metric == "block-importance":
            assert stats is not None  # only magnitude goes without statistics (checked above)
            out.append(torch.tensor([1.0 - stats.block_cos[i] / max(stats.tokens, 1)], dtype=torch.float64))
            continue
        if group.granularity == "head":
            attn = layer.attn
            kv = group.counts[i]
            if metric == "magnitude":
                sq = attn.wq.weight.double().pow(2).sum(1).view(kv, rep * hd).sum(1)
                sq += attn.wk.weight.double().pow(2).sum(1).view(kv, hd).sum(1)
                sq += attn.wv.weight.double().pow(2).sum(1).view(kv, hd).sum(1)
                sq += attn.wo.weight.double().pow(2).sum(0).view(kv, rep * hd).sum(1)
                out.append(sq.sqrt().cpu())
            else:
                wo_sq = stats.wo_sq[i] if stats is not None else None
                assert stats is not None and wo_sq is not None  # a block with heads has their statistics
                rms = (wo_sq / stats.tokens).sqrt()
                col = (attn.wo.weight.double().abs().cpu() * rms).mean(0)
                out.append(col.view(kv, rep, hd).sum(2).mean(1))
        else:
            mlp = layer.mlp
            if metric == "magnitude":
                sq = mlp.w_gate.weight.double().pow(2).sum(1) + mlp.w_up.weight.double().pow(2).sum(1)
                sq += mlp.w_down.weight.double().pow(2).sum(0)
                out.append(sq.sqrt().cpu())
            else:
                down_sq = stats.down_sq[i] if stats is not None else None
                assert stats is not None and down_sq is not None  # a block with channels has their statistics
                rms = (down_sq / stats.tokens).sqrt()
                out.append((mlp.w_down.weight.double().abs().cpu() * rms).mean(0))
    return torch.cat(out)
