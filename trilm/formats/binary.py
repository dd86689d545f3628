"""Binary weights: 1-bit signs with per-row or per-group scales and optional per-group means.

``W[n, k] = scales[k // g, n] * sign[n, k] + means[k // g, n]`` with sign in {-1, +1} stored as one bit (1 →
+1), 32 per int32 along K. Without ``means`` this is BiLM's γ·{-1, +1}; with them it holds the
XNOR/BiLLM-style α·sign(w − μ) + μ binarization that PB-LLM and BiLLM produce per row or group.

Bits/weight: 1 + (scale bits [+ mean bits]) / g, e.g. 1.0039 for per-row fp32 scales at K = 8192 and 1.25
for g = 128 with fp16 scale and mean.
"""

from __future__ import annotations

import dataclasses

import torch

from trilm.formats.base import (
    FormatError,
    PackedWeight,
    check_group_table,
    check_int32_words,
    expand_groups,
    register,
)
from trilm.formats.decode import DecodeArgs, KernelId
from trilm.formats.packing import pack_codes, packed_rows, unpack_codes


def sign_bits(signs: torch.Tensor, fmt: str, field: str = "signs") -> torch.Tensor:
    """{-1, +1} integers (or bool, True = +1) → {0, 1} uint8 bits."""
    if signs.dim() != 2:
        raise FormatError(f"{fmt}.{field}: expected a 2-D tensor, got shape {tuple(signs.shape)}")
    if signs.dtype == torch.bool:
        return signs.to(torch.uint8)
    if signs.is_floating_point():
        raise FormatError(f"{fmt}.{field}: expected integer signs in {{-1, +1}}, got {signs.dtype}")
    if signs.numel() and not bool(((signs == 1) | (signs == -1)).all()):
        raise FormatError(f"{fmt}.{field}: values must be -1 or +1")
    return (signs > 0).to(torch.uint8)


@register
@dataclasses.dataclass(eq=False, repr=False)
class BinaryWeight(PackedWeight):
    """1-bit signs packed along K, scales (K // g, N), optional means (K // g, N)."""

    FORMAT = "binary"
    TENSORS = ("qweight", "scales")
    OPTIONAL_TENSORS = ("means",)

    qweight: torch.Tensor
    scales: torch.Tensor
    means: torch.Tensor | None = None

    def validate(self) -> None:
        n, k = self.out_features, self.in_features
        check_int32_words(self.FORMAT, "qweight", self.qweight, packed_rows(k, 1), n)
        check_group_table(self.FORMAT, "scales", self.scales, k, n)
        if self.means is not None:
            check_group_table(self.FORMAT, "means", self.means, k, n, rows=self.scales.shape[0])

    @property
    def group_size(self) -> int:
        return self.in_features // self.scales.shape[0]

    @classmethod
    def pack(
        cls, signs: torch.Tensor, scales: torch.Tensor, means: torch.Tensor | None = None
    ) -> BinaryWeight:
        """signs (N, K) in {-1, +1} (or bool); scales and optional means (K // g, N)."""
        bits = sign_bits(signs, cls.FORMAT)
        n, k = bits.shape
        return cls(
            n, k, pack_codes(bits, 1), scales.contiguous(), None if means is None else means.contiguous()
        )

    def signs(self) -> torch.Tensor:
        """The int8 signs (N, K) in {-1, +1}."""
        return unpack_codes(self.qweight, 1, self.in_features).to(torch.int8) * 2 - 1

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        k = self.in_features
        w = self.signs().float() * expand_groups(self.scales, k)
        if self.means is not None:
            w = w + expand_groups(self.means, k)
        return w.to(dtype)

    def decode_args(self) -> DecodeArgs:
        n, k = self.shape
        return DecodeArgs(
            KernelId.BINARY, n, k, self.qweight, self.scales, self.group_size, 1, means=self.means
        )
