"""The papers' nominal bits/weight formulas, next to the storage bits the packed formats really use.

The method papers count bits differently from what a file holds (scales, zeros, masks, indices): these
functions reproduce their numbers so a results table can show both "value bits" (the paper's) and
``PackedWeight.bits_per_weight()`` (bytes on disk / N·K).
"""

from __future__ import annotations

import math


def gptq_bits(bits: int, group_size: int | None, scale_bits: int = 16, zero_bits: int | None = None) -> float:
    """GPTQ/OmniQuant asymmetric groups: b + (scale bits + zero bits) / g; per-channel (None) ≈ b.

    4-bit g128 → 4.156, 3-bit g128 → 3.148.
    """
    if group_size is None or group_size <= 0:
        return float(bits)
    return bits + (scale_bits + (bits if zero_bits is None else zero_bits)) / group_size


def pbllm_bits(salient_frac: float, high_bits: int = 8, index_bits: float = 1.0) -> float:
    """PB-LLM's bound 1·(1 − r) + high_bits·r + index bits (1 = a bitmap). 10 % at 8 bits → 2.7."""
    _check_frac(salient_frac)
    return (1.0 - salient_frac) + high_bits * salient_frac + index_bits


def billm_bits(salient_frac: float) -> float:
    """BiLLM's value bits N_param = 2·r + 1·(1 − r) (salient columns use two residual planes); 0.1 → 1.1."""
    _check_frac(salient_frac)
    return 2.0 * salient_frac + (1.0 - salient_frac)


def billm_storing_bits(block_size: int = 128) -> float:
    """BiLLM's N_storing = 1 + 1 / block_size (group flag per weight + salient-column bitmap per block)."""
    return 1.0 + 1.0 / block_size


def stbllm_bits(salient_frac: float, n: int, m: int) -> float:
    """STBLLM: BiLLM value bits times the kept fraction N/M. r = 0.1 at 4:8 → 0.55."""
    if not 0 < n <= m:
        raise ValueError(f"N:M needs 0 < N ≤ M, got {n}:{m}")
    return billm_bits(salient_frac) * n / m


def _check_frac(r: float) -> None:
    if not 0.0 <= r <= 1.0:
        raise ValueError(f"salient fraction must be in [0, 1], got {r}")


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
