"""llama.cpp's Q4_0, Q4_1 and Q8_0 blocks as :class:`~trilm.formats.IntWeight` grids, and their exact bytes.

Each type holds 32 consecutive weights of a row per block, with fp16 numbers (ggml-quants.c)::

    Q4_0  w = d · (q − 8)   q ∈ [0, 15]      d = max / −8    (max: the weight of largest magnitude, signed)
    Q4_1  w = d · q + m     q ∈ [0, 15]      d = (max − min) / 15, m = min
    Q8_0  w = d · q         q ∈ [−128, 127]  d = max|w| / 127

In :class:`IntWeight` terms these are group 32 with fp16 scales and: 4 bits with every zero 8 (Q4_0); 4 bits,
zero 0 and fp16 ``mins`` (Q4_1); 8 bits with every zero 128 (Q8_0). Both decode in fp32 as ``d · (q − z)
(+ m)``, the product of an fp16 and a small integer being exact, so a weight on one of these grids
dequantizes bit for bit as llama.cpp (and ``gguf.quants``) dequantizes its blocks.

:func:`fit_ggml_grid` fits a block's numbers as llama.cpp does and rounds them to fp16 *before* the codes are
chosen (:func:`ggml_codes`), so the codes are the best ones for the scale the file will hold — llama.cpp's
own quantizer picks them with the unrounded scale. :func:`ggml_type_of` says which type holds a packed
weight exactly (or why none does) and :func:`ggml_blocks` writes its block bytes; nothing is re-quantized.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from trilm.formats.base import FormatError, PackedWeight
from trilm.formats.intk import IntWeight

BLOCK = 32


@dataclasses.dataclass(frozen=True)
class GGMLType:
    """One llama.cpp block type as an int grid."""

    name: str
    bits: int
    zero: int
    has_min: bool
    block_bytes: int

    @property
    def maxq(self) -> int:
        return (1 << self.bits) - 1


GGML_TYPES = {
    "q4_0": GGMLType("q4_0", 4, 8, False, 2 + BLOCK // 2),
    "q4_1": GGMLType("q4_1", 4, 0, True, 4 + BLOCK // 2),
    "q8_0": GGMLType("q8_0", 8, 128, False, 2 + BLOCK),
}


def ggml_type(name: str) -> GGMLType:
    if name not in GGML_TYPES:
        raise FormatError(f"ggml type {name!r}: one of {sorted(GGML_TYPES)}")
    return GGML_TYPES[name]


def _fp16(t: torch.Tensor, what: str) -> torch.Tensor:
    half = t.to(torch.float16)
    if not bool(torch.isfinite(half).all()):
        raise FormatError(f"{what}: a block {'value' if 'min' in what else 'scale'} is beyond fp16's range")
    return half.float()


def fit_ggml_grid(w: torch.Tensor, qtype: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(scale, zero, mins or None) per row of ``w`` (rows, 32), scale and mins already rounded to fp16
    (held as fp32), fitted as llama.cpp fits the type."""
    t = ggml_type(qtype)
    w = w.float()
    zero = torch.full((w.shape[0],), float(t.zero), device=w.device)
    if t.name == "q4_0":
        idx = w.abs().argmax(dim=1, keepdim=True)
        scale = torch.gather(w, 1, idx).squeeze(1) / -8
        return _fp16(scale, "q4_0 scale"), zero, None
    if t.name == "q8_0":
        return _fp16(w.abs().amax(dim=1) / 127, "q8_0 scale"), zero, None
    lo, hi = w.amin(dim=1), w.amax(dim=1)
    return _fp16((hi - lo) / t.maxq, "q4_1 scale"), zero, _fp16(lo, "q4_1 min")


def ggml_codes(
    w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, mins: torch.Tensor | None, bits: int
) -> torch.Tensor:
    """Codes (uint8, like ``w``) of ``w`` on per-row grids (scale, zero, mins broadcast over columns);
    a zero scale (an all-zero block, or one fp16 cannot resolve) gives the code of 0 (of ``m`` for Q4_1)."""
    shape = (-1, *([1] * (w.dim() - 1)))
    s, z = scale.reshape(shape), zero.reshape(shape)
    x = w.float() if mins is None else w.float() - mins.reshape(shape)
    safe = torch.where(s == 0, torch.ones_like(s), s)
    codes = torch.where(s == 0, z.expand_as(x), torch.round(x / safe) + z)
    return codes.clamp(0, (1 << bits) - 1).to(torch.uint8)


def ggml_values(
    codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, mins: torch.Tensor | None
) -> torch.Tensor:
    """s · (codes − z) (+ m) in fp32, per-row numbers broadcast over columns: IntWeight's decode."""
    shape = (-1, *([1] * (codes.dim() - 1)))
    out = scale.reshape(shape) * (codes.float() - zero.reshape(shape))
    return out if mins is None else out + mins.reshape(shape)


def ggml_type_of(weight: PackedWeight) -> tuple[str | None, str]:
    """(the llama.cpp type that holds ``weight`` exactly, "") or (None, why none does)."""
    if not isinstance(weight, IntWeight):
        return None, f"a {weight.FORMAT} weight is not on an int grid"
    if weight.g_idx is not None:
        return None, "act-order g_idx (llama.cpp blocks are consecutive columns)"
    if weight.group_size != BLOCK:
        return None, f"group size {weight.group_size} (llama.cpp blocks hold {BLOCK})"
    if weight.scales.dtype != torch.float16 or (
        weight.mins is not None and weight.mins.dtype != torch.float16
    ):
        return None, f"{weight.scales.dtype} scales (llama.cpp stores fp16)"
    zeros = weight.zeros
    for t in GGML_TYPES.values():
        if weight.bits == t.bits and (weight.mins is not None) == t.has_min and bool((zeros == t.zero).all()):
            return t.name, ""
    kind = "with float mins" if weight.mins is not None else "without mins"
    return None, f"{weight.bits}-bit codes {kind} and zero points {sorted(set(zeros.unique().tolist()))[:4]}"


def ggml_blocks(weight: IntWeight, qtype: str) -> np.ndarray:
    """The llama.cpp block bytes (N, K / 32 · block bytes) of a weight that :func:`ggml_type_of` puts on
    ``qtype``."""
    found, why = ggml_type_of(weight)
    if found != qtype:
        raise FormatError(f"{qtype}: this weight is not on its grid ({why or found})")
    t = GGML_TYPES[qtype]
    n, k = weight.shape
    codes = weight.codes().reshape(n, k // BLOCK, BLOCK)
    parts = [weight.scales.t().contiguous().view(torch.uint8).reshape(n, k // BLOCK, 2)]
    if t.has_min:
        assert weight.mins is not None
        parts.append(weight.mins.t().contiguous().view(torch.uint8).reshape(n, k // BLOCK, 2))
    if t.bits == 4:
        parts.append(codes[..., : BLOCK // 2] | (codes[..., BLOCK // 2 :] << 4))
    else:
        parts.append((codes.to(torch.int16) - t.zero).to(torch.int8).view(torch.uint8))
    return torch.cat(parts, dim=-1).reshape(n, -1).numpy()
