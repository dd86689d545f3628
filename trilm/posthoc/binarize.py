"""The binarization pieces BiLLM and STBLLM share: residual binarization of masked weights, the salient-column
search, the magnitude split of the other weights (BiLLM's bell-shaped two groups, STBLLM's trisection) and
N:M keep masks. Pure functions of tensors; :mod:`trilm.posthoc.billm` runs them inside the GPTQ block loop.

Residual binarization of order o over a mask, per row: o times, μ = mean of the residual over the masked
entries, α = mean |residual − μ|, approximation += α·sign(residual − μ) + μ. sign(0) is +1 (the reference's
torch.sign gives 0, which no binary format can store; an exact tie needs the residual to equal its mean).

Salient columns are the top columns by Σ_rows |S| — S = W²/[H⁻¹]_jj² (diagonal of the upper Cholesky factor
of H⁻¹) for Hessian saliency, |W| for magnitude saliency — and every search scores a candidate by the
squared error of the binarized approximation:

- *reference* (``reference_mode``, BiLLM's code): the approximation and the error are of S itself, not of W;
  magnitude saliency uses S = W (signed); the other weights are split by |S|, at quantiles of |S| over the
  whole block with the salient columns' entries counted as zeros;
- *corrected* (default): the approximation and the error are of W — what is being approximated —, the error
  weighted per column by 1/[H⁻¹]_jj², the cost GPTQ's error feedback assigns to a column (so both saliency
  metrics minimize the same layer-output proxy and differ only in which columns are salient); the other
  weights are split by |W| (binarization groups should hold weights of similar magnitude; |S| would mix
  small weights of sensitive columns with large ones of insensitive columns), at quantiles over the
  non-salient kept weights only. On the fixture layer this lowers BiLLM's proxy loss from 41.6 to 27.5
  (Hessian) and from 46.9 to 39.2 (magnitude); see docs/posthoc.md.

Pruned (N:M) positions never enter a mean, an α, a quantile or an error: they stay exactly 0.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

SALIENT_ORDER = 2
CANDIDATE_ELEMENTS = 1 << 22
"""Searches evaluate their candidates in batches of about this many weights."""
SPLIT_QUANTILES = (0.10, 0.90, 81)
"""BiLLM's break-point candidates: 81 quantiles from 10 % to 90 %."""
TRISECTION_STEPS = (0.10, 0.90, 160)
"""STBLLM's candidates: 160 even steps of p₁ from 0.1 to 0.9 (of max |S|, or quantiles in reference mode)."""


@dataclasses.dataclass
class ResidualFit:
    """Residual binarization of the masked entries of x (rows, cols)."""

    approx: torch.Tensor
    """(rows, cols) the approximation on the mask, 0 elsewhere."""
    mu: torch.Tensor
    """(order, rows) the mean of each order."""
    alpha: torch.Tensor
    """(order, rows) the scale of each order."""
    signs: torch.Tensor
    """(order, rows, cols) int8 in {−1, +1}."""


def residual_fit(x: torch.Tensor, mask: torch.Tensor, order: int) -> ResidualFit:
    """Residual binarization of order ``order`` of x (rows, cols) over ``mask`` (…, rows, cols), per row
    (see the module docstring); leading dimensions of the mask fit several candidate masks at once."""
    m = mask.to(x.dtype)
    count = m.sum(-1).clamp(min=1)
    approx = torch.zeros_like(m)
    mus, alphas, signs = [], [], []
    for _ in range(order):
        residual = (x - approx) * m
        mu = residual.sum(-1) / count
        dev = (residual - mu.unsqueeze(-1)) * m
        alpha = dev.abs().sum(-1) / count
        sign = torch.where(dev >= 0, 1, -1).to(torch.int8)
        approx = approx + (alpha.unsqueeze(-1) * sign + mu.unsqueeze(-1)) * m
        mus.append(mu)
        alphas.append(alpha)
        signs.append(sign)
    return ResidualFit(approx, torch.stack(mus), torch.stack(alphas), torch.stack(signs))


def residual_approx(x: torch.Tensor, mask: torch.Tensor, order: int) -> torch.Tensor:
    """Only the approximation of :func:`residual_fit` (what the searches score)."""
    return residual_fit(x, mask, order).approx


def saliency(w: torch.Tensor, hinv_diag: torch.Tensor, metric: str, reference: bool) -> torch.Tensor:
    """S for a block of W: ``hessian`` W²/[H⁻¹]_jj²; ``magnitude`` |W| (reference: W, signed)."""
    if metric == "hessian":
        return w**2 / hinv_diag.unsqueeze(0) ** 2
    if metric == "magnitude":
        return w.clone() if reference else w.abs()
    raise ValueError(f"salient_metric must be 'hessian' or 'magnitude', got {metric!r}")


def quantiles(values: torch.Tensor, lo: float, hi: float, count: int) -> torch.Tensor:
    """Linear-interpolation quantiles at ``count`` even levels from lo to hi (numpy's default method),
    returned in the values' dtype (as the reference compares them)."""
    if values.numel() == 0:
        return values.new_zeros(0)
    levels = np.linspace(lo, hi, count)
    out = np.quantile(values.detach().cpu().numpy(), levels)
    return torch.as_tensor(out).to(device=values.device, dtype=values.dtype)


@dataclasses.dataclass
class SearchSpace:
    """What a block search approximates and how it scores a candidate."""

    target: torch.Tensor
    """(rows, cols): S (reference) or W (corrected)."""
    weights: torch.Tensor
    """(cols,) per-column weight of the squared error."""
    rank: torch.Tensor
    """(rows, cols) |S|: Σ over rows ranks the columns for saliency."""
    score: torch.Tensor
    """(rows, cols) what splits the non-salient weights: |S| (reference) or |W| (corrected)."""
    kept: torch.Tensor
    """(rows, cols) bool: not pruned."""
    reference: bool

    def errors(self, approx: torch.Tensor) -> torch.Tensor:
        """Squared error of candidate approximations (…, rows, cols) → (…,)."""
        diff = (self.target - approx) * self.kept
        if self.reference:
            return torch.mean(diff**2, dim=(-2, -1))
        return ((diff**2) * self.weights).sum(dim=(-2, -1))

    def chunk(self) -> int:
        """Candidates evaluated per batch (bounds the (candidates, rows, cols) temporaries)."""
        return max(1, CANDIDATE_ELEMENTS // self.target.numel())


def search_space(
    w: torch.Tensor, hinv_diag: torch.Tensor, kept: torch.Tensor, metric: str, reference: bool
) -> SearchSpace:
    s = saliency(w, hinv_diag, metric, reference)
    rank = s.abs() * kept
    if reference:
        return SearchSpace(s * kept, torch.ones_like(hinv_diag), rank, rank, kept, True)
    return SearchSpace(w, 1.0 / hinv_diag**2, rank, w.abs() * kept, kept, False)


def search_salient_columns(space: SearchSpace, max_columns: int = 50) -> torch.Tensor:
    """The salient columns of a block (bool (cols,)): the top-k columns by Σ_rows |S|, k = 1 … max − 1,
    chosen by the error of order-2 binarization of the salient columns plus order-2 of the rest."""
    cols = space.target.shape[1]
    limit = min(max_columns, cols)
    salient = torch.zeros(cols, dtype=torch.bool, device=space.target.device)
    if limit < 2:
        return salient
    ranked = torch.topk(space.rank.sum(0), limit).indices
    position = torch.full((cols,), limit, dtype=torch.int64, device=salient.device)
    position[ranked] = torch.arange(limit, device=salient.device)
    sizes = torch.arange(1, limit, device=salient.device)
    errors = []
    for part in sizes.split(space.chunk()):
        cand = (position.unsqueeze(0) < part.unsqueeze(1)).unsqueeze(1)  # (C, 1, cols)
        approx = residual_approx(space.target, space.kept & cand, SALIENT_ORDER)
        approx = approx + residual_approx(space.target, space.kept & ~cand, SALIENT_ORDER)
        errors.append(space.errors(approx))
    best_k = int(sizes[torch.argmin(torch.cat(errors))])
    salient[ranked[:best_k]] = True
    return salient


def split_groups(score: torch.Tensor, member: torch.Tensor, thresholds: torch.Tensor) -> torch.Tensor:
    """Group ids (…, rows, cols) by the score: g0 below the first threshold, g_i in [t_{i−1}, t_i), the last
    ≥ the last threshold; −1 outside ``member``. ``thresholds`` (…, G − 1), one row per candidate."""
    t = thresholds.reshape(*thresholds.shape[:-1], 1, 1, thresholds.shape[-1])
    gid = (score.unsqueeze(-1) >= t).sum(-1)
    return torch.where(member, gid, torch.full_like(gid, -1))


def search_split(space: SearchSpace, salient: torch.Tensor, groups: int, ratio: float = 2.0) -> torch.Tensor:
    """Group ids of the kept non-salient weights: BiLLM's break point (groups = 2) or STBLLM's trisection
    with p₂ = ratio·p₁ (groups = 3); −1 for salient and pruned weights."""
    member = space.kept & ~salient.unsqueeze(0)
    base = residual_approx(space.target, space.kept & salient.unsqueeze(0), SALIENT_ORDER)
    if groups == 1 or not bool(member.any()):
        return torch.where(member, 0, -1)
    if space.reference:
        pool = (space.score * ~salient.unsqueeze(0)).reshape(-1)
    else:
        pool = space.score[member]
    if groups == 2:
        candidates = quantiles(pool, *SPLIT_QUANTILES).unsqueeze(1)
    elif groups == 3:
        if space.reference:
            grid = quantiles(pool, *TRISECTION_STEPS)
            grid = grid[ratio * grid <= grid[-1]]
        else:
            grid = torch.linspace(*TRISECTION_STEPS, dtype=pool.dtype, device=pool.device) * pool.max()
        candidates = torch.stack([grid, ratio * grid], dim=1)
    else:
        raise ValueError(f"the non-salient weights split into 1, 2 or 3 groups, not {groups}")
    if candidates.shape[0] == 0:  # degenerate pool: one group
        return torch.where(member, 0, -1)
    errors = []
    for part in candidates.split(space.chunk()):
        gid = split_groups(space.score, member, part)
        approx = base.expand_as(gid).to(base.dtype)
        for g in range(groups):
            approx = approx + residual_approx(space.target, gid == g, 1)
        errors.append(space.errors(approx))
    best = candidates[torch.argmin(torch.cat(errors))]
    return split_groups(space.score, member, best)


# -- N:M keep masks ------------------------------------------------------------------------------------------
def nm_keep(metric: torch.Tensor, n: int, m: int) -> torch.Tensor:
    """bool (rows, cols): in every m consecutive columns of a row keep the n largest ``metric`` entries."""
    rows, cols = metric.shape
    if cols % m:
        raise ValueError(f"{cols} columns do not split into groups of M={m}")
    groups = metric.reshape(rows, cols // m, m)
    idx = torch.topk(groups, n, dim=-1).indices
    keep = torch.zeros_like(groups, dtype=torch.bool)
    keep.scatter_(-1, idx, True)
    return keep.reshape(rows, cols)


def standardized_importance(w: torch.Tensor, act_norm: torch.Tensor) -> torch.Tensor:
    """STBLLM's standardized importance: relative magnitude in its column and its row, times the input
    channel's activation norm ‖X_j‖₂, divided by its standard deviation over the matrix.

    (|W_ij| / Σ_i |W_ij| + |W_ij| / Σ_j |W_ij|) · ‖X_j‖₂ / std. Only the scale is standardized: subtracting
    the mean would make small weights of high-activation columns rank *below* those of quiet columns."""
    a = w.abs()
    rel = a / a.sum(0, keepdim=True).clamp(min=1e-30) + a / a.sum(1, keepdim=True).clamp(min=1e-30)
    si = rel * act_norm.unsqueeze(0)
    return si / si.std().clamp(min=1e-30)


def outlier_ratio(metric: torch.Tensor, factor: float = 6.0) -> float:
    """Share of entries above ``factor`` × the mean (OWL's layer outlier ratio)."""
    return float((metric > factor * metric.mean()).float().mean())


def adaptive_keep(ratios: list[float], sizes: list[int], n: int, m: int) -> list[int]:
    """Per-layer N around ``n`` from the layers' outlier ratios (STBLLM's adaptive layer-wise N).

    Ratios are min-max scaled to [0, 2] and centred (the shift each layer should get: more outliers, more
    kept weights per group); N = n + round(shift), clamped to [1, m]. Then, so that the model keeps the same
    share of weights as uniform N (equal value bits), single ±1 steps are applied greedily — each time the
    one that moves the weight-weighted excess toward zero at the least cost in squared distance from the
    layers' shifts — while the |excess| decreases."""
    if not ratios:
        return []
    lo, hi = min(ratios), max(ratios)
    scaled = [0.0 if hi == lo else 2.0 * (r - lo) / (hi - lo) for r in ratios]
    centre = sum(scaled) / len(scaled)
    target = [n + s - centre for s in scaled]
    keep = [min(m, max(1, round(t))) for t in target]

    def excess(values: list[int]) -> int:
        return sum((k - n) * s for k, s in zip(values, sizes, strict=True))

    while (e := excess(keep)) != 0:
        step = -1 if e > 0 else 1
        options = [i for i, k in enumerate(keep) if 1 <= k + step <= m and abs(e + step * sizes[i]) < abs(e)]
        if not options:
            break
        i = min(options, key=lambda j: (keep[j] + step - target[j]) ** 2 - (keep[j] - target[j]) ** 2)
        keep[i] += step
    return keep
