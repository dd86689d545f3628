"""The policy-gradient pieces of the search: the estimator, its baseline, the budget projection, the schedule.

Each unit i is kept with probability s_i (a Bernoulli mask m_i). The search minimises E_m[L(m)] over s using
only losses of sampled masks — forward passes, no backpropagation through the model. For K masks m_k with
losses L_k and a baseline δ, the reference's estimator is

    g = Σ_k (L_k − δ)·(m_k − s) / sqrt(s(1 − s)) / (K − 1)

Since ∂E[L]/∂s_i = E[L·(m_i − s_i)] / (s_i(1 − s_i)), a baseline independent of the current samples gives
E[g] = K/(K−1) · sqrt(s(1−s)) · ∇_s E[L]: REINFORCE preconditioned by the Bernoulli standard deviation.
The reference's moving-average baseline includes the current mean loss with weight 1/W, which scales that
mean by (K − 1/W)/(K − 1) instead (1.8 instead of 2 at K = 2, W = 5): a positive factor per step, so
the direction is the same. Both are checked by exact enumeration in tests/prune/test_estimator.py.
"""

from __future__ import annotations

import torch

EPS = 1e-7
"""Inside the square root (as the reference), so units at s = 0 or 1 (deterministic masks, m = s) get 0."""


def pg_gradient(
    losses: torch.Tensor, masks: torch.Tensor, scores: torch.Tensor, baseline: float
) -> torch.Tensor:
    """The estimator g [n] from losses [K], masks [K, n] and scores [n] (K ≥ 2)."""
    k = losses.numel()
    if k < 2:
        raise ValueError(f"the estimator needs K >= 2 samples per step, got {k}")
    s = scores.to(torch.float64)
    centred = (masks.to(torch.float64) - s) / torch.sqrt((s + EPS) * (1 - s + EPS))
    advantage = (losses.to(torch.float64) - baseline).reshape(k, 1)
    return ((advantage * centred).sum(0) / (k - 1)).to(scores.dtype)


def entropy_penalty_gradient(scores: torch.Tensor, strength: float) -> torch.Tensor:
    """Gradient of the reference's optional penalty λ·(log(1−s) − log s) term (pushes s towards 0 or 1)."""
    return strength * (torch.log(1 - scores + EPS) - torch.log(scores + EPS))


class MovingBaseline:
    """δ ← (1 − 1/W)·δ + mean_k(L_k)/W, with δ = the first mean loss (so the first step's δ is that loss)."""

    def __init__(self, window: float):
        if window < 1:
            raise ValueError(f"baseline window must be >= 1, got {window}")
        self.window = float(window)
        self.value: float | None = None

    def update(self, mean_loss: float) -> float:
        if self.value is None:
            self.value = float(mean_loss)
        else:
            self.value = (1 - 1 / self.window) * self.value + float(mean_loss) / self.window
        return self.value


def project_to_budget(scores: torch.Tensor, budget: float, *, max_iter: int = 200) -> torch.Tensor:
    """clamp(s − v, 0, 1) with the shift v ≥ 0 that makes the sum equal ``budget``; v = 0 when even the
    unshifted clamp sums to at most the budget (one-sided: scores are only ever shifted down).

    The sum is piecewise linear and non-increasing in v, so bisection brackets v; the final step solves the
    linear piece inside the bracket exactly, so the budget is met to rounding (the reference stops at
    |Σ − k| < 1e-3 or 20 steps).
    """
    s = scores.detach().to(torch.float64)
    budget = float(budget)

    def total(v: float) -> float:
        return float((s - v).clamp(0, 1).sum())

    if total(0.0) <= budget:
        return s.clamp(0, 1).to(scores.dtype)
    lo, hi = 0.0, max(float(s.max()), 0.0)
    for _ in range(max_iter):
        mid = 0.5 * (lo + hi)
        if total(mid) > budget:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-15 * max(1.0, hi):
            break
    v = 0.5 * (lo + hi)
    shifted = s - v
    active = (shifted > 0) & (shifted < 1)
    if active.any():
        ones = float((shifted >= 1).sum())
        exact = (float(s[active].sum()) + ones - budget) / float(active.sum())
        if lo <= exact <= hi:
            v = exact
    return (s - v).clamp(0, 1).to(scores.dtype)
