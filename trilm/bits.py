"""Bits per weight and per parameter: the one definition (no torch, so ``trilm scaling`` stays light).

Two counts are kept apart on purpose:

- **value bits**, as the papers count them: the information per linear weight. TriLM log2(3) ≈ 1.585,
  BiLM 1, FloatLM 16; group quantizers b + (scale bits + zero bits)/g (GPTQ/OmniQuant, 4-bit g128 →
  4.156); PB-LLM, BiLLM and STBLLM by their own formulas below. The results table's ``bits_per_param`` and
  the scaling fits' "size in bits" axis use these, as Spectra does.
- **stored bits**: what a file really holds per weight, metadata included: ``PackedWeight.storage_bits()``
  / (N·K) for each packed layer (:mod:`trilm.formats.base`), summed over a model by
  :func:`stored_linear_bits`. The packing codec is the only place that knows a layout; nothing here
  re-derives one.

A model's size counts its quantized block linears at their bits and everything else (token embedding, LM
head, norms) at 16 bits: :func:`model_bits`, :func:`bits_per_param`. Which family carries which bits is the
family registry's (:mod:`trilm.families`), built on the constants here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

FLOAT_BITS = 16.0
TERNARY_BITS = math.log2(3.0)
BINARY_BITS = 1.0


class BitsError(ValueError):
    """A bit count cannot be computed from what was given; the message names the input."""


# -- value bits of one linear weight, as the papers count them ----------------------------------------------
def group_quant_bits(
    bits: float, group_size: int | None, scale_bits: float = 16.0, zero_bits: float = 0.0
) -> float:
    """Codes plus one scale (and zero point) per group of ``group_size`` weights; None = per channel (≈ b)."""
    if group_size is None:
        return float(bits)
    if group_size <= 0:
        raise BitsError(f"group_size must be > 0 (or None for per-channel), got {group_size}")
    return bits + (scale_bits + zero_bits) / group_size


def gptq_bits(
    bits: float, group_size: int | None, scale_bits: int = 16, zero_bits: int | None = None
) -> float:
    """GPTQ/OmniQuant asymmetric groups: b + (scale bits + zero bits) / g, zero bits = b by default.

    4-bit g128 → 4.156, 3-bit g128 → 3.148; per-channel (``group_size`` None or ≤ 0) ≈ b.
    """
    if group_size is None or group_size <= 0:
        return float(bits)
    return group_quant_bits(bits, group_size, scale_bits, bits if zero_bits is None else zero_bits)


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
        raise BitsError(f"N:M needs 0 < N ≤ M, got {n}:{m}")
    return billm_bits(salient_frac) * n / m


def _check_frac(r: float) -> None:
    if not 0.0 <= r <= 1.0:
        raise BitsError(f"salient fraction must be in [0, 1], got {r}")


# -- a model's size ----------------------------------------------------------------------------------------
def model_bits(
    linear_params: float, other_params: float, linear_bits: float, other_bits: float = FLOAT_BITS
) -> float:
    """Size of a model in bits: quantized linears at ``linear_bits``, the rest at ``other_bits``."""
    if linear_params < 0 or other_params < 0:
        raise BitsError(f"model_bits: parameter counts must be ≥ 0, got {linear_params}, {other_params}")
    return linear_bits * linear_params + other_bits * other_params


def bits_per_param(
    params: int, linear_params: int, linear_bits: float, other_bits: float = FLOAT_BITS
) -> float:
    """Average bits per parameter: :func:`model_bits` / params."""
    if params <= 0:
        raise BitsError(f"bits_per_param: params must be > 0, got {params}")
    return model_bits(linear_params, params - linear_params, linear_bits, other_bits) / params


def stored_linear_bits(layers: Mapping[str, Any] | Iterable[Any]) -> float:
    """Stored bits per weight over packed layers: Σ ``storage_bits()`` / Σ N·K (any PackedWeight objects)."""
    weights: Iterable[Any] = layers.values() if isinstance(layers, Mapping) else layers
    bits = count = 0
    for w in weights:
        bits += w.storage_bits()
        count += w.out_features * w.in_features
    if count == 0:
        raise BitsError("stored_linear_bits: no packed layers")
    return bits / count
