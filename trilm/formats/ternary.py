"""Ternary weights: 2-bit codes with a (K // g, N) scale table covering every TriLM scale group.

``W[n, k] = codes[n, k] * scales[k // g, n]`` with codes in {-1, 0, +1}, stored as ``code + 1`` in 2 bits
(16 per int32 along K, see :mod:`trilm.formats.packing`). The one scale layout expresses per-tensor (g = K,
all equal), per-row (g = K), per tensor-parallel partition of a column-parallel layer (g = K, values
constant over row blocks — fused q/k/v sub-matrices with their own scales included), per partition of a
row-parallel layer (g = K / P, constant across N) and per-group scales. The model hands over integer codes
and scales; nothing here re-quantizes floats.

Bits/weight: 2 + (bits of a scale) · (K / g) / K, e.g. 2.0039 for per-row fp32 scales at K = 8192.
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


def check_ternary_codes(fmt: str, codes: torch.Tensor) -> None:
    if codes.dim() != 2 or codes.is_floating_point() or codes.dtype == torch.bool:
        raise FormatError(
            f"{fmt}.codes: expected a 2-D integer tensor, got {codes.dtype} {tuple(codes.shape)}"
        )
    if codes.numel() and (int(codes.min()) < -1 or int(codes.max()) > 1):
        raise FormatError(f"{fmt}.codes: values must be in {{-1, 0, +1}}")


@register
@dataclasses.dataclass(eq=False, repr=False)
class TernaryWeight(PackedWeight):
    """2-bit ternary codes packed along K plus fp scales (K // g, N)."""

    FORMAT = "ternary"
    TENSORS = ("qweight", "scales")

    qweight: torch.Tensor
    scales: torch.Tensor

    def validate(self) -> None:
        n, k = self.out_features, self.in_features
        check_int32_words(self.FORMAT, "qweight", self.qweight, packed_rows(k, 2), n)
        check_group_table(self.FORMAT, "scales", self.scales, k, n)

    @property
    def group_size(self) -> int:
        return self.in_features // self.scales.shape[0]

    @classmethod
    def pack(cls, codes: torch.Tensor, scales: torch.Tensor) -> TernaryWeight:
        """codes int (N, K) in {-1, 0, +1}; scales float (K // g, N)."""
        check_ternary_codes(cls.FORMAT, codes)
        n, k = codes.shape
        return cls(n, k, pack_codes(codes.to(torch.int32) + 1, 2), scales.contiguous())

    def codes(self) -> torch.Tensor:
        """The int8 codes (N, K) in {-1, 0, +1}."""
        raw = unpack_codes(self.qweight, 2, self.in_features)
        if raw.numel() and int(raw.max()) > 2:
            raise FormatError(f"{self.FORMAT}.qweight: holds the unused 2-bit code 3")
        return raw.to(torch.int8) - 1

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return (self.codes().float() * expand_groups(self.scales, self.in_features)).to(dtype)

    def decode_args(self) -> DecodeArgs:
        return DecodeArgs(
            KernelId.TERNARY, self.out_features, self.in_features, self.qweight, self.scales, self.group_size
        )


def partition_scales(values: torch.Tensor, out_features: int, in_features: int, axis: str) -> torch.Tensor:
    """Expand one scale per tensor-parallel partition into the (K // g, N) table.

    ``axis="out"``: a column-parallel layer split into len(values) equal row blocks (g = K);
    ``axis="in"``: a row-parallel layer split into len(values) equal column blocks (g = K / P).
    """
    p = values.numel()
    values = values.float().flatten()
    if axis == "out":
        if out_features % p:
            raise FormatError(f"partition_scales: {p} partitions do not divide out_features={out_features}")
        return values.repeat_interleave(out_features // p).unsqueeze(0).contiguous()
    if axis == "in":
        if in_features % p:
            raise FormatError(f"partition_scales: {p} partitions do not divide in_features={in_features}")
        return values.unsqueeze(1).expand(p, out_features).contiguous()
    raise FormatError(f"partition_scales: axis must be 'out' or 'in', got {axis!r}")
