"""Fused projections for decoding: Q/K/V as one matrix and gate/up as one, so a block makes four matrix
launches instead of seven.

At one token a decoder layer is launch-bound, not byte-bound (the 1.1B FloatLM's weights need 0.52 ms at the
H200's copy rate but its graphed forward took 2.25 ms), and the three projections of the attention input and
the two of the MLP input read the same activation. Stacking their rows gives the same products: float
weights are concatenated, packed weights stacked through :func:`trilm.formats.concat.stack_out` (exact, the
same codes and scales). A sub-block whose linears cannot be stacked (different formats or settings, a bias)
is left as it is.

Fusion changes module names (``attn.wqkv`` replaces ``attn.wq``/``wk``/``wv``), so it is an inference-time
step after loading, for serving and benchmarks: snapshots, post-hoc methods and exports keep the canonical
per-projection names.
"""

from __future__ import annotations

import torch
from torch import nn

from trilm.formats.concat import can_stack, stack_out
from trilm.infer.model import InferenceModel

FUSED = {"attn": ("wqkv", ("wq", "wk", "wv")), "mlp": ("w_gate_up", ("w_gate", "w_up"))}
"""Sub-block → (fused module name, the projections it stacks, in order)."""


def _stacked(parts: list[nn.Module]) -> nn.Module | None:
    # deferred for start-up time: loads triton only when called
    from trilm.kernels import QuantLinear

    if all(type(p) is nn.Linear and p.bias is None for p in parts):
        w = torch.cat([p.weight.detach() for p in parts])
        fused = nn.Linear(w.shape[1], w.shape[0], bias=False, device=w.device, dtype=w.dtype)
        fused.weight.data.copy_(w)
        fused.weight.requires_grad_(parts[0].weight.requires_grad)
        return fused
    if all(isinstance(p, QuantLinear) and p.bias is None for p in parts):
        first = parts[0]
        packed = [p.packed for p in parts]
        if can_stack(packed) is not None or len({(p.backend, p.accumulate) for p in parts}) != 1:
            return None
        return QuantLinear(
            stack_out(packed),
            backend=first.backend,
            cache_dequantized=first.cache_dequantized,
            accumulate=first.accumulate,
            gemv_max_m=first.gemv_max_m,
        )
    return None


def fuse_projections(model: InferenceModel) -> int:
    """Stack every block's Q/K/V and gate/up projections in place; returns how many groups were fused."""
    count = 0
    for block in model.layers:
        for sub_name, (fused_name, names) in FUSED.items():
            sub = getattr(block, sub_name)
            if sub is None or getattr(sub, fused_name, None) is not None:
                continue
            parts = [getattr(sub, n) for n in names]
            fused = _stacked(parts)
            if fused is None:
                continue
            setattr(sub, fused_name, fused)
            sub.fused_sizes = tuple(p.out_features for p in parts)
            for n in names:
                setattr(sub, n, None)
            count += 1
    return count
