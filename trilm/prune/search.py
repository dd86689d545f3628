"""The policy-gradient mask search of "Bypass Back-propagation" (the method and the reference's defaults:
docs/references.md#policy-gradient-structural-pruning).

Per step: one calibration batch; K masks m_k ~ Bernoulli(s); K no-grad forward passes of the masked model
give losses L_k; the moving-average baseline takes their mean; s −= lr·g (plain SGD, cosine learning rate);
then the projection shifts s down so Σ s equals the number of units to keep (each granularity separately:
heads and channels have their own budgets, as the reference's attention and MLP). After the last step the
highest scores are kept (:func:`trilm.prune.slicing.select_units`).

The model never sees a gradient: its weights are frozen (checked before and after), the passes run under
``torch.inference_mode`` and the scores live outside autograd. Peak memory is that of an inference forward
pass on one batch plus K masks.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Literal

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from trilm.config import Config, ConfigError, require
from trilm.infer.model import InferenceModel
from trilm.memory import PeakMemory, measure_peak
from trilm.prune.estimator import (
    MovingBaseline,
    entropy_penalty_gradient,
    pg_gradient,
    project_to_budget,
)
from trilm.prune.masks import UnitMasks
from trilm.prune.units import UnitGroup, kept_count
from trilm.schedule import Schedule, ScheduleConfig

LR_DEFAULTS = {"head": 0.5, "channel": 0.02, "layer": 0.5}
"""Peak learning rates per granularity for the CPU-sized default budget (the reference: 2e-3 for 15,000
steps). Chosen by a calibration-only sweep (losses of the final masks on held-out *train* windows) on the
quickstart FloatLM: few units (heads, blocks) carry a strong signal per step and move fast at 0.5; with
thousands of channels each step's estimate is mostly noise, and larger rates only scramble the metric's
initial order (docs/pruning.md)."""


@dataclasses.dataclass
class PGConfig(Config):
    """The search's knobs; the reference's values where they transfer (K=2, W=5, cosine, penalty off).

    The reference runs 15,000 steps of 8 × 128 tokens at lr 2e-3; trilm's default is a CPU-sized run
    with larger learning rates (:data:`LR_DEFAULTS`).
    """

    steps: int = 150
    batch_size: int = 8
    seq_len: int = 128
    mask_samples: int = 2
    """K: masks sampled (and forward passes) per step; the estimator divides by K − 1."""
    lr: float = 0.0
    """Peak learning rate of every group; 0 = the granularity's default (:data:`LR_DEFAULTS`)."""
    min_lr_ratio: float = 0.0
    """The cosine ends at lr · min_lr_ratio."""
    warmup: int = 0
    baseline_window: float = 5.0
    penalty: float = 0.0
    """λ of the reference's optional λ·(log(1−s) − log s) term (off in the reference's runs)."""
    init: Literal["auto", "wanda", "magnitude", "block-importance", "uniform"] = "auto"
    """Score initialisation: a metric (auto = wanda for heads/channels, block-importance for layers) mapped
    through sigmoid(z-score) shifted to mean = keep, or uniform = keep everywhere."""
    seed: int = 0

    def validate(self) -> None:
        require(self.steps >= 0, f"steps: must be >= 0, got {self.steps}")
        require(self.batch_size > 0, f"batch_size: must be > 0, got {self.batch_size}")
        require(self.seq_len > 1, f"seq_len: must be > 1, got {self.seq_len}")
        require(
            self.mask_samples >= 2,
            f"mask_samples: the estimator needs K >= 2 masks per step, got {self.mask_samples}",
        )
        require(self.lr >= 0, f"lr: must be >= 0 (0 = per-granularity default), got {self.lr}")
        require(0 <= self.min_lr_ratio <= 1, f"min_lr_ratio: must be in [0, 1], got {self.min_lr_ratio}")
        require(self.warmup >= 0, f"warmup: must be >= 0, got {self.warmup}")
        require(self.baseline_window >= 1, f"baseline_window: must be >= 1, got {self.baseline_window}")
        require(self.penalty >= 0, f"penalty: must be >= 0, got {self.penalty}")

    def lr_for(self, granularity: str) -> float:
        return self.lr or LR_DEFAULTS[granularity]

    def init_metric(self, granularity: str) -> str:
        if self.init == "auto":
            return "block-importance" if granularity == "layer" else "wanda"
        return self.init


@dataclasses.dataclass
class SearchResult:
    scores: dict[str, torch.Tensor]
    """Final Bernoulli parameters s per granularity (float64, CPU)."""
    initial: dict[str, torch.Tensor]
    losses: list[float]
    """Mean sampled loss per step."""
    seconds: float
    skipped_steps: int = 0
    peak: PeakMemory | None = None
    """Peak tensor memory above the weights during a search step (see :mod:`trilm.memory`)."""


def budgets(group: UnitGroup, keep: float, per_layer: bool) -> list[tuple[slice, int]]:
    """(segment of the flat scores, units to keep in it): one global segment, or one per block."""
    if not per_layer:
        return [(slice(0, group.total), kept_count(keep, group.total, f"{group.granularity} units"))]
    out = []
    for start, count in zip(group.offsets, group.counts):
        if count:
            out.append((slice(start, start + count), kept_count(keep, count, "units of a block")))
    return out


def project(scores: torch.Tensor, segments: list[tuple[slice, int]]) -> torch.Tensor:
    out = scores.clone()
    for seg, budget in segments:
        out[seg] = project_to_budget(scores[seg], budget)
    return out


def initial_scores(
    metric: torch.Tensor | None, segments: list[tuple[slice, int]], total: int
) -> torch.Tensor:
    """sigmoid(z-score of the metric) shifted to mean = keep and clamped to [0, 1], then projected; uniform
    keep when there is no metric (or it is constant).

    The z-score runs over each budget segment (the whole group for global pruning), not per block as in the
    reference's per-block Wanda-SP: with a global budget this keeps the metric's order across blocks, so a
    search of 0 steps keeps exactly the units the metric baseline keeps."""
    s = torch.zeros(total, dtype=torch.float64)
    for seg, budget in segments:
        n = seg.stop - seg.start
        target = budget / n
        if metric is None:
            s[seg] = target
            continue
        m = metric[seg].double()
        std = m.std() if n > 1 else torch.tensor(0.0, dtype=torch.float64)
        if not torch.isfinite(std) or std == 0:
            s[seg] = target
            continue
        p = torch.sigmoid((m - m.mean()) / std)
        s[seg] = (p - p.mean() + target).clamp(0, 1)
    return project(s, segments)


class WindowSampler:
    """Calibration batches: the stream's disjoint windows in a seeded order, reshuffled every epoch."""

    def __init__(self, tokens: torch.Tensor, seq_len: int, batch_size: int, seed: int, source: str):
        n = tokens.numel() // seq_len
        if n < batch_size:
            raise ConfigError(
                f"{source}: {tokens.numel():,} calibration tokens hold {n} windows of {seq_len} tokens, "
                f"fewer than one search batch of {batch_size} (use more data, --pg-seq-len or --batch-size)"
            )
        self.windows = tokens[: n * seq_len].view(n, seq_len)
        self.batch_size = batch_size
        self.gen = torch.Generator().manual_seed(seed)
        self.order = torch.randperm(n, generator=self.gen)
        self.pos = 0
        self.epochs = 0

    def next(self) -> torch.Tensor:
        if self.pos + self.batch_size > len(self.order):
            self.order = torch.randperm(len(self.windows), generator=self.gen)
            self.pos = 0
            self.epochs += 1
        idx = self.order[self.pos : self.pos + self.batch_size]
        self.pos += self.batch_size
        return self.windows[idx]


def batch_loss(model: InferenceModel, batch: torch.Tensor) -> float:
    """Mean next-token cross entropy (nats) of a batch of windows."""
    logits = model(batch[:, :-1])
    return float(F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten()))


def assert_frozen(model: torch.nn.Module) -> None:
    """The search's contract: no weight can receive (or has received) a gradient."""
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    if trainable:
        raise AssertionError(f"model weights require gradients during the PG search: {trainable[:3]}")
    with_grad = [n for n, p in model.named_parameters() if p.grad is not None]
    if with_grad:
        raise AssertionError(f"model weights received gradients during the PG search: {with_grad[:3]}")


def pg_search(
    model: InferenceModel,
    groups: list[UnitGroup],
    keep: float,
    sampler: WindowSampler,
    cfg: PGConfig,
    *,
    metrics: dict[str, torch.Tensor | None] | None = None,
    per_layer: bool = False,
    progress: bool = True,
    measure_memory: bool = True,
) -> SearchResult:
    """Run the search; ``metrics[granularity]`` initialises the scores (None = uniform)."""
    assert_frozen(model)
    device = model.embed.weight.device
    metrics = metrics or {}
    segments = {g.granularity: budgets(g, keep, per_layer) for g in groups}
    scores = {
        g.granularity: initial_scores(metrics.get(g.granularity), segments[g.granularity], g.total)
        for g in groups
    }
    initial = {k: v.clone() for k, v in scores.items()}
    total_units = sum(g.total for g in groups)
    gen = torch.Generator().manual_seed(cfg.seed)
    baseline = MovingBaseline(cfg.baseline_window)
    losses: list[float] = []
    skipped = 0
    peak: PeakMemory | None = None
    bar = None
    if progress:
        bar = tqdm(total=cfg.steps, desc="pg search", unit="step", dynamic_ncols=True)
    cosine = ScheduleConfig(warmup=cfg.warmup, decay="cosine")
    schedules = {
        name: Schedule(cosine, cfg.steps, peak_lr=cfg.lr_for(name), min_lr_ratio=cfg.min_lr_ratio)
        for name in scores
    }
    start = time.perf_counter()
    with UnitMasks(model, groups) as masker, torch.inference_mode():

        def one_step(step: int) -> None:
            nonlocal skipped
            lrs = {name: schedules[name].lr(step) for name in scores}
            batch = sampler.next().to(device)
            sampled: dict[str, list[torch.Tensor]] = {name: [] for name in scores}
            step_losses = []
            for _ in range(cfg.mask_samples):
                masks = {name: torch.bernoulli(s, generator=gen) for name, s in scores.items()}
                masker.set({name: m.to(device=device, dtype=torch.float32) for name, m in masks.items()})
                loss = batch_loss(model, batch)
                if not math.isfinite(loss):
                    continue
                step_losses.append(loss)
                for name, m in masks.items():
                    sampled[name].append(m)
            masker.set(None)
            if len(step_losses) < 2:
                skipped += 1
                return
            mean = sum(step_losses) / len(step_losses)
            delta = baseline.update(mean)
            losses.append(mean)
            values = torch.tensor(step_losses, dtype=torch.float64)
            for group in groups:
                name = group.granularity
                s = scores[name]
                grad = pg_gradient(values, torch.stack(sampled[name]), s, delta)
                if cfg.penalty:
                    grad = grad + entropy_penalty_gradient(s, cfg.penalty)
                scores[name] = project(s - lrs[name] * grad, segments[name])
            if bar is not None:
                expected = sum(float(s.sum()) for s in scores.values()) / total_units
                lr = max(lrs.values())
                bar.set_postfix(
                    loss=f"{mean:.4f}", baseline=f"{delta:.4f}", keep=f"{expected:.3f}", lr=f"{lr:.2g}"
                )

        def run(first: int, last: int) -> None:
            for step in range(first, last):
                one_step(step)
                if bar is not None:
                    bar.update(1)

        try:
            if measure_memory and cfg.steps:
                # CUDA keeps exact counters for the whole search; on CPU the profiler replays one step
                # (every step allocates the same).
                measured = cfg.steps if device.type == "cuda" else 1
                with measure_peak(device) as peak:
                    run(0, measured)
                run(measured, cfg.steps)
            else:
                run(0, cfg.steps)
        finally:
            if bar is not None:
                bar.close()
    assert_frozen(model)
    return SearchResult(scores, initial, losses, time.perf_counter() - start, skipped, peak)
