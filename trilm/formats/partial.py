"""Partially binarized weights (PB-LLM): binary non-salient weights plus salient weights on a per-row grid.

PB-LLM keeps a fraction of the weights ("salient", chosen over the whole matrix) as ``high_bits`` codes on a
per-row asymmetric grid ``(q − z)·s`` and binarizes the rest as ``α·sign + μ`` with per-row α, μ. This layout
stores exactly that and no more (see :func:`trilm.formats.accounting.partial_binary_minimum`):

| tensor | content | bits |
|---|---|---|
| ``bitmap`` / ``ef_low`` + ``ef_high`` | salient positions in the N·K weights (1) | ≈ n·(2 + log2(NK/n)) |
| ``signs`` | one sign per binarized weight, row-major | NK − n |
| ``codes`` | one ``high_bits`` code per salient weight, row-major | high_bits each |
| ``alpha``, ``mu``, ``scale``, ``zero`` | per row: binary scale, mean; salient grid scale, zero | per row |

(1) a bitmap or Elias–Fano of the set or of its complement, whichever is smallest.

10 % salient at 8 bits: 0.9 + 0.8 + 0.525 ≈ 2.23 bits/weight against a minimum of 2.17 (the paper's bound
2.7 uses a 1-bit bitmap; the older ``pbllm`` CSR layout costs 3.4). The kernels read it through
:meth:`PartialBinaryWeight.kernel_layout`, the kernel format :class:`~trilm.formats.PBLLMWeight`, built once
at load time; both decode to the same floats.
"""

from __future__ import annotations

import dataclasses

import torch

from trilm.formats.accounting import partial_binary_minimum, pbllm_bits
from trilm.formats.base import FormatError, PackedWeight, register
from trilm.formats.bitstream import (
    SUBSET_CODINGS,
    decode_subset,
    encode_subset,
    pack_bits,
    stream_bytes,
    subset_code_bits,
    unpack_bits,
)
from trilm.formats.pbllm import PBLLMWeight

MASK_TENSORS = {"bitmap": ("bitmap",), "elias_fano": ("ef_low", "ef_high")}
MASK_TENSORS["elias_fano_complement"] = MASK_TENSORS["elias_fano"]


@register
@dataclasses.dataclass(eq=False, repr=False)
class PartialBinaryWeight(PackedWeight):
    """Salient set (bitmap / Elias–Fano), binary signs, salient codes, per-row α, μ, grid scale and zero."""

    FORMAT = "partial_binary"
    TENSORS = ("signs", "codes", "alpha", "mu", "scale", "zero")
    OPTIONAL_TENSORS = ("bitmap", "ef_low", "ef_high")
    SETTINGS = ("high_bits", "salient", "mask_coding")

    signs: torch.Tensor
    codes: torch.Tensor
    alpha: torch.Tensor
    mu: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor
    bitmap: torch.Tensor | None = None
    ef_low: torch.Tensor | None = None
    ef_high: torch.Tensor | None = None
    high_bits: int = 8
    salient: int = 0
    mask_coding: str = "bitmap"

    def validate(self) -> None:
        n, k, f = self.out_features, self.in_features, self.FORMAT
        total = n * k
        if not 2 <= self.high_bits <= 8:
            raise FormatError(f"{f}.high_bits: must be in 2..8, got {self.high_bits}")
        if not 0 <= self.salient <= total:
            raise FormatError(f"{f}.salient: {self.salient} outside [0, {total}]")
        if self.mask_coding not in SUBSET_CODINGS:
            raise FormatError(f"{f}.mask_coding: must be one of {SUBSET_CODINGS}, got {self.mask_coding!r}")
        for name, t, count, width in (
            ("signs", self.signs, total - self.salient, 1),
            ("codes", self.codes, self.salient, self.high_bits),
        ):
            if t.dtype != torch.uint8 or t.dim() != 1 or t.numel() != stream_bytes(count, width):
                raise FormatError(
                    f"{f}.{name}: expected a uint8 stream of {stream_bytes(count, width)} bytes, "
                    f"got {t.dtype} {tuple(t.shape)}"
                )
        used = MASK_TENSORS[self.mask_coding]
        for name in self.OPTIONAL_TENSORS:
            t = getattr(self, name)
            if name in used and (t is None or t.dtype != torch.uint8 or t.dim() != 1):
                raise FormatError(
                    f"{f}.{name}: a uint8 stream is needed for mask_coding={self.mask_coding!r}"
                )
            if name not in used and t is not None:
                raise FormatError(f"{f}.{name}: not part of mask_coding={self.mask_coding!r}")
        mask_bytes = sum(getattr(self, name).numel() for name in used)
        if 8 * mask_bytes != subset_code_bits(total, self.salient, self.mask_coding):
            raise FormatError(
                f"{f}: the salient-set streams have {mask_bytes} bytes, not what {self.salient} need"
            )
        for name in ("alpha", "mu", "scale"):
            t = getattr(self, name)
            if not t.is_floating_point() or tuple(t.shape) != (n,) or not bool(torch.isfinite(t).all()):
                raise FormatError(
                    f"{f}.{name}: expected finite floats of shape ({n},), got {t.dtype} {tuple(t.shape)}"
                )
        if self.zero.dtype != torch.uint8 or tuple(self.zero.shape) != (n,):
            raise FormatError(
                f"{f}.zero: expected uint8 ({n},), got {self.zero.dtype} {tuple(self.zero.shape)}"
            )

    @classmethod
    def pack(
        cls,
        salient_mask: torch.Tensor,
        signs: torch.Tensor,
        codes: torch.Tensor,
        alpha: torch.Tensor,
        mu: torch.Tensor,
        scale: torch.Tensor,
        zero: torch.Tensor,
        high_bits: int = 8,
        mask_coding: str | None = None,
    ) -> PartialBinaryWeight:
        """salient_mask bool (N, K); signs (N, K) in {−1, +1} (read where not salient); codes (N, K) integers
        (read where salient); alpha, mu, scale (N,) floats; zero (N,) integer zero points; the mask coding
        defaults to the smallest."""
        f = cls.FORMAT
        n, k = salient_mask.shape
        if salient_mask.dtype != torch.bool:
            raise FormatError(f"{f}.salient_mask: expected bool, got {salient_mask.dtype}")
        for name, t in (("signs", signs), ("codes", codes)):
            if tuple(t.shape) != (n, k) or t.is_floating_point():
                raise FormatError(f"{f}.{name}: expected integers ({n}, {k}), got {t.dtype} {tuple(t.shape)}")
        binary = ~salient_mask
        s = signs[binary]
        if bool(((s != 1) & (s != -1)).any()):
            raise FormatError(f"{f}.signs: binarized weights need signs -1 or +1")
        z = zero.float()
        if bool((z != torch.round(z)).any()) or bool(((z < 0) | (z > 255)).any()):
            raise FormatError(f"{f}.zero: zero points must be integers in [0, 255]")
        coding, streams = encode_subset(salient_mask, mask_coding)
        return cls(
            n,
            k,
            pack_bits(s > 0, 1),
            pack_bits(codes[salient_mask].to(torch.int64), high_bits),
            alpha.contiguous(),
            mu.contiguous(),
            scale.contiguous(),
            z.to(torch.uint8),
            streams.get("bitmap"),
            streams.get("ef_low"),
            streams.get("ef_high"),
            high_bits,
            int(salient_mask.sum()),
            coding,
        )

    def salient_mask(self) -> torch.Tensor:
        streams = {name: getattr(self, name) for name in MASK_TENSORS[self.mask_coding]}
        n, k = self.shape
        return decode_subset(self.mask_coding, streams, n * k, self.salient).reshape(n, k)

    def planes(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(salient mask (N, K), signs int8 (N, K) (+1 where salient), codes int64 (N, K) (0 elsewhere))."""
        n, k = self.shape
        mask = self.salient_mask()
        signs = torch.ones((n, k), dtype=torch.int8, device=mask.device)
        signs[~mask] = (unpack_bits(self.signs, 1, n * k - self.salient) * 2 - 1).to(torch.int8)
        codes = torch.zeros((n, k), dtype=torch.int64, device=mask.device)
        codes[mask] = unpack_bits(self.codes, self.high_bits, self.salient)
        return mask, signs, codes

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        mask, signs, codes = self.planes()
        binary = signs.float() * self.alpha.float().unsqueeze(1) + self.mu.float().unsqueeze(1)
        salient = (codes.float() - self.zero.float().unsqueeze(1)) * self.scale.float().unsqueeze(1)
        return torch.where(mask, salient, binary).to(dtype)

    def value_bits(self) -> float:
        """PB-LLM's own count for this output: 1·(1 − r) + high_bits·r + 1 (bitmap), r = salient share."""
        return pbllm_bits(self.salient / (self.out_features * self.in_features), self.high_bits)

    def minimum_bits(self) -> float:
        return partial_binary_minimum(
            self.out_features, self.in_features, self.salient, self.high_bits, self.alpha.element_size() * 8
        )

    def kernel_layout(self) -> PBLLMWeight:
        """The same weight in the kernels' PB-LLM layout (binary plane + CSR salient weights)."""
        mask, signs, codes = self.planes()
        return PBLLMWeight.pack(
            signs,
            self.alpha.unsqueeze(0),
            self.mu.unsqueeze(0),
            mask,
            codes,
            self.scale,
            self.zero,
            self.high_bits,
        )
