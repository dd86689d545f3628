"""PB-LLM weights: a binary plane plus a sparse set of salient weights kept at 8 bits.

Non-salient weights are binary, ``w = α · sign + μ`` with α, μ per row (or group) as PB-LLM's XNOR binarizer
gives them. Salient weights (PB-LLM keeps 2–50 %) are stored in CSR — row pointers ``crow`` (N + 1), column
indices ``col`` (int16 when K ≤ 32768) and ``high_bits``-bit codes ``q8`` with a per-row asymmetric grid
``(q8 − z8[n]) · s8[n]`` (PB-LLM's per-channel min/max). The binary bit at a salient position is stored as
0, so the dense binary kernel computes μ − α there and the sparse kernel adds the difference to the 8-bit
value.

Bits/weight: 1 + salient share · (high_bits + column-index bits) + 32 / K (row pointers) + per-row tables.
At 10 % salient with int16 columns: 1 + 0.1 · 24 ≈ 3.4 (the paper's 2.7 counts binary bits only on
non-salient weights plus a 1-bit bitmap; see :mod:`trilm.formats.accounting`).
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
from trilm.formats.binary import sign_bits
from trilm.formats.decode import DecodeArgs, KernelId
from trilm.formats.packing import pack_codes, packed_rows, unpack_codes


@register
@dataclasses.dataclass(eq=False, repr=False)
class PBLLMWeight(PackedWeight):
    """Binary plane (bits, α, μ per group) + CSR salient weights with a per-row ``high_bits`` grid."""

    FORMAT = "pbllm"
    TENSORS = ("qweight", "scales", "means", "crow", "col", "q8", "s8", "z8")
    SETTINGS = ("high_bits",)

    qweight: torch.Tensor
    scales: torch.Tensor
    means: torch.Tensor
    crow: torch.Tensor
    col: torch.Tensor
    q8: torch.Tensor
    s8: torch.Tensor
    z8: torch.Tensor
    high_bits: int = 8

    def validate(self) -> None:
        n, k, f = self.out_features, self.in_features, self.FORMAT
        if not 2 <= self.high_bits <= 8:
            raise FormatError(f"{f}.high_bits: must be in 2..8, got {self.high_bits}")
        check_int32_words(f, "qweight", self.qweight, packed_rows(k, 1), n)
        check_group_table(f, "scales", self.scales, k, n)
        check_group_table(f, "means", self.means, k, n, rows=self.scales.shape[0])
        if self.crow.dtype != torch.int32 or tuple(self.crow.shape) != (n + 1,):
            raise FormatError(
                f"{f}.crow: expected int32 ({n + 1},), got {self.crow.dtype} {tuple(self.crow.shape)}"
            )
        nnz = int(self.crow[-1])
        if int(self.crow[0]) != 0 or bool((self.crow[1:] < self.crow[:-1]).any()):
            raise FormatError(f"{f}.crow: row pointers must start at 0 and never decrease")
        if self.col.dtype not in (torch.int16, torch.int32) or tuple(self.col.shape) != (nnz,):
            raise FormatError(
                f"{f}.col: expected int16/int32 ({nnz},), got {self.col.dtype} {tuple(self.col.shape)}"
            )
        if nnz and (int(self.col.min()) < 0 or int(self.col.max()) >= k):
            raise FormatError(f"{f}.col: column index outside [0, {k})")
        if self.q8.dtype != torch.uint8 or tuple(self.q8.shape) != (nnz,):
            raise FormatError(f"{f}.q8: expected uint8 ({nnz},), got {self.q8.dtype} {tuple(self.q8.shape)}")
        if nnz and int(self.q8.max()) >= (1 << self.high_bits):
            raise FormatError(f"{f}.q8: a code exceeds {self.high_bits} bits")
        if not self.s8.is_floating_point() or tuple(self.s8.shape) != (n,):
            raise FormatError(f"{f}.s8: expected float ({n},), got {self.s8.dtype} {tuple(self.s8.shape)}")
        if self.z8.dtype != torch.uint8 or tuple(self.z8.shape) != (n,):
            raise FormatError(f"{f}.z8: expected uint8 ({n},), got {self.z8.dtype} {tuple(self.z8.shape)}")

    @property
    def nnz(self) -> int:
        return int(self.crow[-1])

    @property
    def group_size(self) -> int:
        return self.in_features // self.scales.shape[0]

    @classmethod
    def pack(
        cls,
        signs: torch.Tensor,
        scales: torch.Tensor,
        means: torch.Tensor,
        salient_mask: torch.Tensor,
        salient_codes: torch.Tensor,
        salient_scale: torch.Tensor,
        salient_zero: torch.Tensor,
        high_bits: int = 8,
    ) -> PBLLMWeight:
        """signs (N, K) ±1 for the binary part; scales/means (K / g, N); salient_mask (N, K) bool;
        salient_codes (N, K) integer codes read at the mask; salient_scale/zero (N,) per-row grid."""
        f = cls.FORMAT
        bits = sign_bits(signs, f)
        n, k = bits.shape
        if salient_mask.dtype != torch.bool or tuple(salient_mask.shape) != (n, k):
            raise FormatError(f"{f}.salient_mask: expected bool ({n}, {k})")
        if tuple(salient_codes.shape) != (n, k) or salient_codes.is_floating_point():
            raise FormatError(f"{f}.salient_codes: expected integer ({n}, {k})")
        bits = bits * (~salient_mask).to(torch.uint8)
        rows, cols = torch.nonzero(salient_mask, as_tuple=True)
        counts = torch.bincount(rows, minlength=n)
        crow = torch.zeros(n + 1, dtype=torch.int32, device=signs.device)
        crow[1:] = torch.cumsum(counts, 0).to(torch.int32)
        col_dtype = torch.int16 if k <= 32768 else torch.int32
        zero = salient_zero.float()
        if zero.numel() and not bool((zero == torch.round(zero)).all()):
            raise FormatError(f"{f}.salient_zero: zero points must be integers")
        return cls(
            n,
            k,
            pack_codes(bits, 1),
            scales.contiguous(),
            means.contiguous(),
            crow,
            cols.to(col_dtype),
            salient_codes[rows, cols].to(torch.uint8),
            salient_scale.contiguous(),
            zero.to(torch.uint8),
            high_bits,
        )

    def salient_rows(self) -> torch.Tensor:
        """Row index of every stored salient weight (COO rows), int32 (nnz,)."""
        counts = (self.crow[1:] - self.crow[:-1]).long()
        return torch.repeat_interleave(torch.arange(self.out_features, device=self.crow.device), counts).to(
            torch.int32
        )

    def salient_values(self) -> torch.Tensor:
        """The dequantized salient weights, fp32 (nnz,)."""
        rows = self.salient_rows().long()
        return (self.q8.float() - self.z8.float()[rows]) * self.s8.float()[rows]

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        k = self.in_features
        signs = unpack_codes(self.qweight, 1, k).float() * 2 - 1
        w = signs * expand_groups(self.scales, k) + expand_groups(self.means, k)
        w[self.salient_rows().long(), self.col.long()] = self.salient_values()
        return w.to(dtype)

    def decode_args(self) -> DecodeArgs:
        """The binary plane's decode plus the salient weights, which replace its value where stored."""
        n, k = self.shape
        sparse = (self.salient_rows(), self.col, self.q8, self.s8, self.z8)
        return DecodeArgs(
            KernelId.BINARY,
            n,
            k,
            self.qweight,
            self.scales,
            self.group_size,
            1,
            means=self.means,
            sparse=sparse,
        )
