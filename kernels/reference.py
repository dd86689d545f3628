"""Pure-PyTorch reference for every packed format: dequantize with the codec, then a float matmul.

This is what the kernel tests compare against (in fp64 for a tight reference) and what :class:`QuantLinear`
falls back to where Triton cannot run (no CUDA and no interpreter).
"""

from __future__ import annotations

import torch

from trilm.formats import PackedWeight


def reference_matmul(
    x: torch.Tensor, weight: PackedWeight, compute_dtype: torch.dtype | None = None
) -> torch.Tensor:
    """x (..., K) @ W^T → (..., N), computed in ``compute_dtype`` (default fp32) and returned in x's dtype."""
    if x.shape[-1] != weight.in_features:
        raise ValueError(f"expected x with last dim {weight.in_features}, got {tuple(x.shape)}")
    dt = compute_dtype or torch.float32
    w = weight.dequantize(dt).to(x.device)
    return (x.to(dt) @ w.t()).to(x.dtype)
