"""The policy-gradient estimator, its baseline and the budget projection, checked exactly."""

import itertools

import pytest
import torch

from trilm.prune.estimator import MovingBaseline, pg_gradient, project_to_budget


def _quadratic(n: int, seed: int = 0):
    """L(m) = mᵀQm + bᵀm + c and its exact expectation gradient under independent Bernoulli(s)."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(n, n, generator=g, dtype=torch.float64)
    q = (a + a.T) / 2
    b = torch.randn(n, generator=g, dtype=torch.float64)
    c = 3.0

    def loss(m):
        return float(m @ q @ m + b @ m + c)

    def grad(s):
        # E[m_i m_j] = s_i s_j (i ≠ j), s_i (i = j)  →  ∂E[L]/∂s_i = 2 Σ_{j≠i} Q_ij s_j + Q_ii + b_i
        off = q - torch.diag(torch.diag(q))
        return 2 * off @ s + torch.diag(q) + b

    return loss, grad


def _expected_gradient(loss, s, k, baseline):
    """E[g] by enumerating every joint outcome of K masks over n units (exact, no sampling noise)."""
    n = s.numel()
    total = torch.zeros(n, dtype=torch.float64)
    outcomes = list(itertools.product([0.0, 1.0], repeat=n))
    for combo in itertools.product(outcomes, repeat=k):
        masks = torch.tensor(combo, dtype=torch.float64)
        prob = float(torch.prod(torch.where(masks > 0, s, 1 - s)))
        losses = torch.tensor([loss(m) for m in masks], dtype=torch.float64)
        delta = baseline(losses)
        total += prob * pg_gradient(losses, masks, s, delta)
    return total


@pytest.mark.parametrize("k", [2, 3])
def test_mean_is_the_preconditioned_gradient_with_a_fixed_baseline(k):
    loss, grad = _quadratic(3)
    s = torch.tensor([0.3, 0.65, 0.8], dtype=torch.float64)
    mean = _expected_gradient(loss, s, k, baseline=lambda losses: 1.7)
    analytic = k / (k - 1) * torch.sqrt(s * (1 - s)) * grad(s)
    # the estimator's EPS inside the square root is the only difference from the analytic form
    torch.testing.assert_close(mean, analytic, rtol=1e-6, atol=1e-9)


def test_mean_with_the_reference_moving_baseline_is_rescaled_not_biased():
    """δ includes the current mean loss with weight 1/W, which scales the mean by (K − 1/W)/(K − 1)."""
    loss, grad = _quadratic(3, seed=1)
    s = torch.tensor([0.2, 0.5, 0.9], dtype=torch.float64)
    k, window, previous = 2, 5.0, 0.4

    def moving(losses):
        b = MovingBaseline(window)
        b.update(previous)
        return b.update(float(losses.mean()))

    mean = _expected_gradient(loss, s, k, baseline=moving)
    analytic = (k - 1 / window) / (k - 1) * torch.sqrt(s * (1 - s)) * grad(s)
    torch.testing.assert_close(mean, analytic, rtol=1e-6, atol=1e-9)


def test_estimator_needs_two_samples_and_is_zero_for_decided_units():
    s = torch.tensor([0.0, 1.0, 0.5], dtype=torch.float64)
    masks = torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 0.0]], dtype=torch.float64)
    g = pg_gradient(torch.tensor([2.0, 1.0]), masks, s, baseline=1.5)
    assert g[0] == 0 and g[1] == 0 and g[2] != 0
    with pytest.raises(ValueError, match="K >= 2"):
        pg_gradient(torch.tensor([1.0]), masks[:1], s, 0.0)


def test_moving_baseline_starts_at_the_first_loss():
    b = MovingBaseline(5)
    assert b.update(3.0) == 3.0
    assert b.update(8.0) == pytest.approx(0.8 * 3.0 + 8.0 / 5)


@pytest.mark.parametrize("seed", range(5))
def test_projection_meets_the_budget_exactly_when_feasible(seed):
    g = torch.Generator().manual_seed(seed)
    s = torch.rand(1000, generator=g, dtype=torch.float64) * 1.6 - 0.3  # SGD steps leave [0, 1]
    for budget in (1.0, 137.0, 420.5, float(s.clamp(0, 1).sum()) - 1e-3):
        p = project_to_budget(s, budget)
        assert float(p.sum()) == pytest.approx(budget, abs=1e-9)
        assert float(p.min()) >= 0 and float(p.max()) <= 1
        shift = s - p  # a single shift v where the clamp is inactive
        inside = (p > 0) & (p < 1)
        assert float(shift[inside].max() - shift[inside].min()) < 1e-9
        assert float(shift[inside].min()) >= 0


def test_projection_is_one_sided():
    """When even the clamped scores sum below the budget, they are only clamped, never shifted up."""
    s = torch.tensor([0.1, 0.2, 1.4, -0.5], dtype=torch.float64)
    p = project_to_budget(s, 3.0)
    assert p.tolist() == [0.1, 0.2, 1.0, 0.0]


def test_projection_keeps_the_order():
    s = torch.tensor([0.9, 0.1, 0.5, 0.7, 0.3], dtype=torch.float64)
    p = project_to_budget(s, 1.0)
    assert torch.equal(torch.argsort(p[p > 0], descending=True), torch.argsort(s[p > 0], descending=True))
