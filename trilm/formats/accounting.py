"""The papers' nominal bits/weight formulas, next to the storage bits the packed formats really use.

The method papers count bits differently from what a file holds (scales, zeros, masks, indices): these
functions reproduce their numbers so a results table can show both "value bits" (the paper's) and
``PackedWeight.bits_per_weight()`` (bytes on disk / N·K).
"""

from __future__ import annotations


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
