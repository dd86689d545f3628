"""Bit accounting of packed layers: the papers' value bits, the information-theoretic minimum, stored bits.

The papers' formulas are defined once in :mod:`trilm.bits` and re-exported here for the codec. What this
module adds is the minimum number of bits a method's actual output needs, so the compact formats can be held
to a budget above it, and per-layer/model summaries of all three counts.
"""

from __future__ import annotations

import math

from trilm.bits import billm_bits, billm_storing_bits, gptq_bits, pbllm_bits, stbllm_bits

__all__ = [
    "billm_bits",
    "billm_storing_bits",
    "gptq_bits",
    "layer_bits",
    "log2_binomial",
    "model_bits_summary",
    "nm_pattern_bits",
    "partial_binary_minimum",
    "pbllm_bits",
    "residual_binary_minimum",
    "stbllm_bits",
    "subset_bits",
    "within_budget",
]


# -- the information-theoretic minimum of a method's actual output ------------------------------------------
# Self-contained (no torch): the packed formats count their parts and call these. "Minimum" is the Hartley
# information of the output: log2 of the number of outputs of the same form the method could have produced,
# part by part — a sign 1 bit, a group id among G groups log2 G, a b-bit code b bits, a stored float parameter
# its width, which N of M positions are kept log2 C(M, N), which n of U positions form a set log2 C(U, n) plus
# log2(U + 1) for n itself. No fixed-length code of that output can be shorter; entropy coding could go below
# it only for skewed outputs, by betting on their statistics.

BUDGET_RATIO = 1.10
BUDGET_SLACK = 0.05
"""Stored bits/weight must stay within BUDGET_RATIO · minimum + BUDGET_SLACK (the post-hoc II budget)."""


def log2_binomial(n: int, k: int) -> float:
    """log2 C(n, k), exact for small n and via lgamma beyond."""
    if not 0 <= k <= n:
        raise ValueError(f"C(n, k) needs 0 ≤ k ≤ n, got n={n}, k={k}")
    if n <= 1024:
        return math.log2(math.comb(n, k))
    return (math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)) / math.log(2)


def subset_bits(universe: int, members: int) -> float:
    """Which ``members`` of ``universe`` positions form a set, count included: log2 C(U, n) + log2(U + 1)."""
    return log2_binomial(universe, members) + math.log2(universe + 1)


def nm_pattern_bits(n: int, m: int) -> float:
    """Bits per weight of an N:M keep pattern: log2 C(M, N) / M (4:8 → 0.766, 2:4 → 0.646)."""
    if not 0 < n <= m:
        raise ValueError(f"N:M needs 0 < N ≤ M, got {n}:{m}")
    return math.log2(math.comb(m, n)) / m


def partial_binary_minimum(rows: int, cols: int, salient: int, high_bits: int, param_bits: int) -> float:
    """PB-LLM's output, in bits: the salient set, one sign per binarized weight, a ``high_bits`` code per
    salient weight, and per row α, μ (binary part) and the salient grid's scale and zero point."""
    total = rows * cols
    if not 0 <= salient <= total:
        raise ValueError(f"salient count {salient} outside [0, {total}]")
    per_row = 3 * param_bits + high_bits
    return subset_bits(total, salient) + (total - salient) + salient * high_bits + rows * per_row


def residual_binary_minimum(
    *,
    kept: int,
    salient_kept: int,
    groups: int,
    order: int,
    nm_groups: int,
    nm_n: int,
    nm_m: int,
    salient_column_sets: list[tuple[int, int]],
    params: int,
    param_bits: int,
) -> float:
    """BiLLM/STBLLM's output, in bits.

    ``kept`` weights are non-zero (all of them without N:M); each has one sign, the ``salient_kept`` of them
    in salient columns ``order − 1`` more, the others a group id among ``groups``; ``nm_groups`` groups of
    ``nm_m`` inputs each keep ``nm_n``; ``salient_column_sets`` lists (block width, salient columns) per
    block; ``params`` stored α/μ values are needed (those of non-empty groups).
    """
    nonsalient = kept - salient_kept
    if min(kept, salient_kept, nonsalient, params) < 0:
        raise ValueError("residual_binary_minimum: counts must be ≥ 0 and salient_kept ≤ kept")
    bits = kept + salient_kept * (order - 1) + nonsalient * math.log2(max(groups, 1))
    if nm_n < nm_m:
        bits += nm_groups * math.log2(math.comb(nm_m, nm_n))
    bits += sum(subset_bits(width, k) for width, k in salient_column_sets)
    return bits + params * param_bits


def within_budget(stored_bits_per_weight: float, minimum_bits_per_weight: float) -> bool:
    """Whether stored bits/weight ≤ 1.1 · minimum + 0.05."""
    return stored_bits_per_weight <= BUDGET_RATIO * minimum_bits_per_weight + BUDGET_SLACK + 1e-12


def layer_bits(packed) -> dict[str, float | None]:
    """Per weight: ``value`` (the paper's count for this output), ``minimum`` and ``stored`` bits of a packed
    layer. ``value``/``minimum`` are None for formats that do not define them."""
    weights = packed.out_features * packed.in_features
    value = packed.value_bits() if hasattr(packed, "value_bits") else None
    minimum = packed.minimum_bits() / weights if hasattr(packed, "minimum_bits") else None
    return {"value": value, "minimum": minimum, "stored": packed.storage_bits() / weights}


def model_bits_summary(layers) -> dict[str, float | None]:
    """Weight-averaged :func:`layer_bits` over a mapping or iterable of packed layers."""
    items = list(layers.values()) if hasattr(layers, "values") else list(layers)
    if not items:
        raise ValueError("model_bits_summary: no packed layers")
    total = sum(p.out_features * p.in_features for p in items)
    out: dict[str, float | None] = {}
    for key in ("value", "minimum", "stored"):
        parts = [(layer_bits(p)[key], p.out_features * p.in_features) for p in items]
        out[key] = None if any(v is None for v, _ in parts) else sum(v * w for v, w in parts) / total
    return out
