"""Stacking packed weights along the output dimension: Q/K/V or gate/up as one matrix, one kernel launch.

A decode step spends most of its time launching small kernels, and three projections that read the same
input are three launches. The affine formats (ternary, binary, int) lay every table out as (rows along K,
N) with N contiguous, so the weight of the stacked matrix is each table concatenated along its last axis —
exact, the same codes and scales, the same bits per weight. Per-input tables (an act-order permutation) must
be equal, and so must every setting (bits, group size, symmetry), or the stack is refused by name.
"""

from __future__ import annotations

import torch

from trilm.formats.base import FormatError, PackedWeight, from_tensors

STACKABLE = ("ternary", "binary", "int")
"""Formats whose tensors are (rows, N) tables, N contiguous, plus optional per-input vectors."""


def can_stack(weights: list[PackedWeight]) -> str | None:
    """None when :func:`stack_out` can stack ``weights``, else why not."""
    if not weights:
        return "nothing to stack"
    first = weights[0]
    if first.FORMAT not in STACKABLE:
        return f"format {first.FORMAT!r} is not one of {STACKABLE}"
    base = {k: v for k, v in first.meta().items() if k not in ("out_features", "bits_per_weight")}
    for i, w in enumerate(weights[1:], 1):
        meta = {k: v for k, v in w.meta().items() if k not in ("out_features", "bits_per_weight")}
        if meta != base:
            return f"weight {i} differs in its settings ({meta} vs {base})"
        if set(w.to_tensors()) != set(first.to_tensors()):
            return (
                f"weight {i} stores tensors {sorted(w.to_tensors())}, weight 0 {sorted(first.to_tensors())}"
            )
        for name, t in w.to_tensors().items():
            t0 = getattr(first, name)
            if t.dim() == 2 and (t.shape[0] != t0.shape[0] or t.dtype != t0.dtype):
                return f"weight {i}.{name}: {t.dtype} {tuple(t.shape)} vs {t0.dtype} {tuple(t0.shape)}"
            if t.dim() != 2 and not torch.equal(t, t0):
                return f"weight {i}.{name}: per-input tables differ"
    return None


def stack_out(weights: list[PackedWeight]) -> PackedWeight:
    """One packed weight whose rows are ``weights``' rows in order: ``dequantize()`` equals
    ``torch.cat([w.dequantize() for w in weights])``."""
    why = can_stack(weights)
    if why is not None:
        raise FormatError(f"stack_out: {why}")
    first = weights[0]
    tensors = {
        name: torch.cat([getattr(w, name) for w in weights], dim=1) if t.dim() == 2 else t
        for name, t in first.to_tensors().items()
    }
    meta = {**first.meta(), "out_features": sum(w.out_features for w in weights)}
    meta.pop("bits_per_weight")
    return from_tensors(tensors, meta)
