"""Uniform int2/3/4/8 weights with group scales and zeros (GPTQ, OmniQuant), act-order ``g_idx``, float mins.

Grid (GPTQ's): ``q = clamp(round(w / s) + z, 0, maxq)``, ``w ≈ s · (q − z)``, maxq = 2^bits − 1, groups of
``group_size`` input columns per output row. An optional per-group float offset ``mins`` makes the rule
``w = s · (q − z) + m``: llama.cpp's Q4_1 stores its blocks as ``d · q + m`` with an fp16 ``m`` that is no
integer multiple of ``d``, so without it those weights could not be held exactly
(:mod:`trilm.formats.ggml`). :func:`quantize_uniform` (round-to-nearest) and the two pieces
it is built from, :func:`fit_uniform_grid` and :func:`quantize_to_grid`, are the one uniform quantizer in
trilm; GPTQ/OmniQuant call them per column or group.

Layout. Codes are packed along K: 2-, 4- and 8-bit into one int32 plane (16 / 8 / 4 per word); **3-bit as two
bit-planes**, the low 2 bits in a 2-bit plane plus the high bit in a 1-bit plane. Bit-planes keep exactly
3.0 bits/weight (10 codes per int32 would cost 3.2, GPTQ's 32-codes-over-3-words straddles words), reuse the
2-bit and 1-bit decoders the ternary and binary kernels already have, and never split a code across words;
the cost is a second load per tile. Scales are stored as given (fp16 by default) with shape (K / g, N) and
zeros as uint8 (K / g, N), mins (when present) in the scales' dtype (K / g, N).

Act-order (``g_idx``, GPTQ ``desc_act``): GPTQ quantizes columns in a permuted order, so the columns of one
group are scattered over K. Here the codes are stored with the columns sorted by group (``perm`` = stable
argsort of ``g_idx``), which makes every group contiguous again; the kernels gather the activations once
(x[:, perm]) and then run the plain grouped path. ``g_idx`` (int32, K) is stored and ``perm`` is recomputed
from it.

Bits/weight: bits + (scale bits + 8) / g + 32 / N with act-order; int4 g128 with fp16 scales: 4.1875.
"""

from __future__ import annotations

import dataclasses

import torch

from trilm.formats.base import (
    SCALE_DTYPE,
    FormatError,
    PackedWeight,
    check_group_table,
    check_int32_words,
    register,
)
from trilm.formats.decode import DecodeArgs, KernelId
from trilm.formats.packing import pack_codes, packed_rows, unpack_codes

INT_BITS = (2, 3, 4, 8)


def fit_uniform_grid(w: torch.Tensor, bits: int, sym: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and zero per row of ``w`` (rows, cols) for a ``bits``-bit min/max grid, as GPTQ fits them.

    The range always contains 0; an all-zero row gets [-1, 1]. asym: s = (max − min) / maxq,
    z = round(−min / s); sym: max = max(|min|, max), min = −max where min < 0, z = (maxq + 1) / 2.
    Returns fp32 (rows,) tensors.
    """
    if bits < 1 or bits > 8:
        raise FormatError(f"fit_uniform_grid: bits must be in 1..8, got {bits}")
    maxq = (1 << bits) - 1
    w = w.float()
    zero_t = torch.zeros(w.shape[0], device=w.device)
    xmin = torch.minimum(w.min(dim=1).values, zero_t)
    xmax = torch.maximum(w.max(dim=1).values, zero_t)
    if sym:
        xmax = torch.maximum(xmin.abs(), xmax)
        xmin = torch.where(xmin < 0, -xmax, xmin)
    empty = (xmin == 0) & (xmax == 0)
    xmin = torch.where(empty, -torch.ones_like(xmin), xmin)
    xmax = torch.where(empty, torch.ones_like(xmax), xmax)
    scale = (xmax - xmin) / maxq
    if sym:
        zero = torch.full_like(scale, (maxq + 1) / 2)
    else:
        zero = torch.round(-xmin / scale)
    return scale, zero


def quantize_to_grid(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, bits: int) -> torch.Tensor:
    """Integer codes clamp(round(w / s) + z, 0, maxq), per-row ``scale``/``zero`` broadcast over columns."""
    maxq = (1 << bits) - 1
    s = scale.float().reshape(-1, *([1] * (w.dim() - 1)))
    z = zero.float().reshape(-1, *([1] * (w.dim() - 1)))
    return torch.clamp(torch.round(w.float() / s) + z, 0, maxq).to(torch.uint8)


def quantize_uniform(
    weight: torch.Tensor, bits: int, group_size: int | None = None, sym: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Round-to-nearest on the GPTQ grid, groups of ``group_size`` consecutive input columns (None: per row).

    Returns codes uint8 (N, K), scales fp32 (K / g, N), zeros fp32 (K / g, N) with w ≈ s · (codes − z).
    """
    if weight.dim() != 2:
        raise FormatError(f"quantize_uniform: expected a 2-D weight, got shape {tuple(weight.shape)}")
    n, k = weight.shape
    g = k if group_size in (None, -1, 0) else int(group_size)
    if k % g:
        raise FormatError(f"quantize_uniform: group_size={g} does not divide in_features={k}")
    blocks = weight.float().reshape(n, k // g, g).transpose(0, 1).reshape(-1, g)
    scale, zero = fit_uniform_grid(blocks, bits, sym)
    codes = quantize_to_grid(blocks, scale, zero, bits)
    codes = codes.reshape(k // g, n, g).transpose(0, 1).reshape(n, k)
    return codes, scale.reshape(k // g, n), zero.reshape(k // g, n)


@register
@dataclasses.dataclass(eq=False, repr=False)
class IntWeight(PackedWeight):
    """int2/3/4/8 codes packed along K (3-bit: 2-bit + 1-bit planes), scales and zeros (K / g, N), g_idx,
    optional float mins (K / g, N) added after scaling."""

    FORMAT = "int"
    TENSORS = ("qweight", "scales", "zeros")
    OPTIONAL_TENSORS = ("qweight_hi", "g_idx", "mins")
    SETTINGS = ("bits",)

    qweight: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor
    bits: int = 4
    qweight_hi: torch.Tensor | None = None
    g_idx: torch.Tensor | None = None
    mins: torch.Tensor | None = None

    def validate(self) -> None:
        n, k, f = self.out_features, self.in_features, self.FORMAT
        if self.bits not in INT_BITS:
            raise FormatError(f"{f}.bits: must be one of {INT_BITS}, got {self.bits}")
        low_bits = 2 if self.bits == 3 else self.bits
        check_int32_words(f, "qweight", self.qweight, packed_rows(k, low_bits), n)
        if self.bits == 3:
            if self.qweight_hi is None:
                raise FormatError(f"{f}.qweight_hi: 3-bit weights need the high bit-plane")
            check_int32_words(f, "qweight_hi", self.qweight_hi, packed_rows(k, 1), n)
        elif self.qweight_hi is not None:
            raise FormatError(f"{f}.qweight_hi: only 3-bit weights have a high bit-plane")
        g = check_group_table(f, "scales", self.scales, k, n)
        if self.zeros.dtype != torch.uint8 or self.zeros.shape != self.scales.shape:
            raise FormatError(f"{f}.zeros: expected uint8 {tuple(self.scales.shape)}, got {self.zeros.dtype}")
        if self.zeros.numel() and int(self.zeros.max()) > (1 << self.bits):
            raise FormatError(f"{f}.zeros: a zero point exceeds 2^bits={1 << self.bits}")
        if self.mins is not None:
            check_group_table(f, "mins", self.mins, k, n, rows=self.scales.shape[0])
        if self.g_idx is not None:
            if self.g_idx.dtype != torch.int32 or tuple(self.g_idx.shape) != (k,):
                raise FormatError(f"{f}.g_idx: expected int32 ({k},), got {self.g_idx.dtype}")
            counts = torch.bincount(self.g_idx.long(), minlength=k // g)
            if counts.numel() != k // g or bool((counts != g).any()):
                raise FormatError(f"{f}.g_idx: every group id in [0, {k // g}) must appear exactly {g} times")

    @property
    def group_size(self) -> int:
        return self.in_features // self.scales.shape[0]

    @property
    def perm(self) -> torch.Tensor | None:
        """Input-column order of the stored codes (stable argsort of g_idx), or None without act-order."""
        if self.g_idx is None:
            return None
        return torch.sort(self.g_idx.long(), stable=True).indices

    @classmethod
    def pack(
        cls,
        codes: torch.Tensor,
        scales: torch.Tensor,
        zeros: torch.Tensor,
        bits: int,
        g_idx: torch.Tensor | None = None,
        scale_dtype: torch.dtype = SCALE_DTYPE,
        mins: torch.Tensor | None = None,
    ) -> IntWeight:
        """codes (N, K) in [0, 2^bits); scales/zeros (K / g, N) (integer zeros); g_idx (K,) optional;
        mins (K / g, N) optional, stored in ``scale_dtype`` like the scales.

        With g_idx, column k uses group g_idx[k] (original column order); without, group k // g.
        """
        if bits not in INT_BITS:
            raise FormatError(f"{cls.FORMAT}.bits: must be one of {INT_BITS}, got {bits}")
        if codes.dim() != 2 or codes.is_floating_point():
            raise FormatError(f"{cls.FORMAT}.codes: expected 2-D integers, got {codes.dtype}")
        n, k = codes.shape
        if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= (1 << bits)):
            raise FormatError(f"{cls.FORMAT}.codes: values must be in [0, {(1 << bits) - 1}]")
        if not zeros.is_floating_point():
            zeros = zeros.float()
        if zeros.numel() and not bool((zeros == torch.round(zeros)).all()):
            raise FormatError(f"{cls.FORMAT}.zeros: zero points must be integers")
        stored = codes.to(torch.uint8)
        gi = None
        if g_idx is not None:
            gi = g_idx.to(torch.int32).contiguous()
            order = torch.sort(gi.long(), stable=True).indices
            stored = stored[:, order]
        if bits == 3:
            lo, hi = pack_codes(stored & 3, 2), pack_codes(stored >> 2, 1)
        else:
            lo, hi = pack_codes(stored, bits), None
        return cls(
            n,
            k,
            lo,
            scales.to(scale_dtype).contiguous(),
            zeros.to(torch.uint8).contiguous(),
            bits,
            hi,
            gi,
            None if mins is None else mins.to(scale_dtype).contiguous(),
        )

    @classmethod
    def from_float(
        cls,
        weight: torch.Tensor,
        bits: int,
        group_size: int | None = 128,
        sym: bool = False,
        scale_dtype: torch.dtype = SCALE_DTYPE,
    ) -> IntWeight:
        """Round-to-nearest quantization of a float weight (N, K) with :func:`quantize_uniform`."""
        codes, scales, zeros = quantize_uniform(weight, bits, group_size, sym)
        return cls.pack(codes, scales, zeros, bits, scale_dtype=scale_dtype)

    def stored_codes(self) -> torch.Tensor:
        """Codes (N, K) as stored: columns in group-sorted order when act-order is used."""
        k = self.in_features
        if self.bits == 3:
            assert self.qweight_hi is not None
            return unpack_codes(self.qweight, 2, k) | (unpack_codes(self.qweight_hi, 1, k) << 2)
        return unpack_codes(self.qweight, self.bits, k)

    def codes(self) -> torch.Tensor:
        """Codes (N, K) in the original input-column order."""
        stored = self.stored_codes()
        perm = self.perm
        if perm is None:
            return stored
        out = torch.empty_like(stored)
        out[:, perm] = stored
        return out

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        k, g = self.in_features, self.group_size
        group = torch.arange(k, device=self.qweight.device) // g if self.g_idx is None else self.g_idx.long()
        s = self.scales.float()[group].t()
        z = self.zeros.float()[group].t()
        w = s * (self.codes().float() - z)
        if self.mins is not None:
            w = w + self.mins.float()[group].t()
        return w.to(dtype)

    def decode_args(self) -> DecodeArgs:
        n, k = self.shape
        perm = self.perm
        return DecodeArgs(
            KernelId.INT,
            n,
            k,
            self.qweight,
            self.scales,
            self.group_size,
            self.bits,
            words_hi=self.qweight_hi,
            zeros=self.zeros,
            means=self.mins,
            perm=None if perm is None else perm.to(self.qweight.device),
        )
