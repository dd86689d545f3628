"""N:M-sparse binary weights: at most N non-zero ±1 values in every M consecutive inputs of a row.

Two forms, both exact:

* **As ternary** (:meth:`NMBinaryWeight.to_ternary`): a pruned ±1 matrix *is* a {-1, 0, +1} matrix, so it
  runs on the 2-bit ternary kernels at 2 bits/weight with no extra code.
* **Compressed** (this class): a keep-bitmap (1 bit per weight) plus one sign bit per kept slot, the slots
  of a group in input order: 1 + N/M bits/weight (2:4 → 1.5, 4:8 → 1.5, 2:8 and 1:4 → 1.25) plus scales. The
  kernels decode it in registers: the sign of position j of a group is slot popcount(bitmap bits below j).
  This needs M and N to be powers of two dividing 32 so a group's bitmap and sign slots never straddle an
  int32 word; other patterns (e.g. 6:8, STBLLM's adaptive N) use the ternary form. Index coding by
  combination number (2:4 → 1.25, 4:8 → 1.375 bits/weight) would save a further 0.125–0.25 bits but needs a
  table or division per group to decode; not implemented.

N counts the *kept* non-zeros per group (the 2:4 convention); groups are M consecutive input columns of a
row. ``W[n, k] = kept · sign · scales[k // g, n]``.
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
from trilm.formats.packing import pack_codes, packed_rows, popcount, unpack_codes
from trilm.formats.ternary import TernaryWeight, check_ternary_codes

NM_POWERS = (1, 2, 4, 8, 16)


def check_nm_pattern(codes: torch.Tensor, n: int, m: int, fmt: str = "nm_binary") -> None:
    """Raise unless every group of m consecutive inputs of each row has at most n non-zeros."""
    rows, k = codes.shape
    if k % m:
        raise FormatError(f"{fmt}: in_features={k} is not a multiple of M={m}")
    per_group = (codes != 0).reshape(rows, k // m, m).sum(-1)
    worst = int(per_group.max()) if per_group.numel() else 0
    if worst > n:
        bad = torch.nonzero(per_group > n)[0].tolist()
        raise FormatError(
            f"{fmt}: row {bad[0]}, group {bad[1]} (inputs {bad[1] * m}..{bad[1] * m + m - 1}) has {worst} "
            f"non-zeros, more than N={n} of M={m}"
        )


@register
@dataclasses.dataclass(eq=False, repr=False)
class NMBinaryWeight(PackedWeight):
    """Compressed N:M binary: keep-bitmap + packed sign slots + scales (K // g, N)."""

    FORMAT = "nm_binary"
    TENSORS = ("mask", "signs", "scales")
    SETTINGS = ("nm_n", "nm_m")

    mask: torch.Tensor
    signs: torch.Tensor
    scales: torch.Tensor
    nm_n: int = 2
    nm_m: int = 4

    def validate(self) -> None:
        n_out, k = self.out_features, self.in_features
        if self.nm_m not in (2, 4, 8, 16) or self.nm_n not in NM_POWERS or self.nm_n > self.nm_m:
            raise FormatError(
                f"{self.FORMAT}: compressed form needs N ≤ M, both powers of two dividing 32 with M ≥ 2 "
                f"(got {self.nm_n}:{self.nm_m}); store such a pattern as TernaryWeight (2 bits/weight)"
            )
        if k % self.nm_m:
            raise FormatError(f"{self.FORMAT}: in_features={k} is not a multiple of M={self.nm_m}")
        check_int32_words(self.FORMAT, "mask", self.mask, packed_rows(k, 1), n_out)
        check_int32_words(self.FORMAT, "signs", self.signs, packed_rows(self.n_slots, 1), n_out)
        check_group_table(self.FORMAT, "scales", self.scales, k, n_out)

    @property
    def n_slots(self) -> int:
        """Sign slots per row: N per group of M."""
        return self.in_features // self.nm_m * self.nm_n

    @property
    def group_size(self) -> int:
        return self.in_features // self.scales.shape[0]

    @classmethod
    def pack(cls, codes: torch.Tensor, scales: torch.Tensor, nm_n: int, nm_m: int) -> NMBinaryWeight:
        """codes int (N_out, K) in {-1, 0, +1}, ≤ nm_n non-zeros per nm_m group; scales (K // g, N_out)."""
        check_ternary_codes(cls.FORMAT, codes)
        check_nm_pattern(codes, nm_n, nm_m, cls.FORMAT)
        rows, k = codes.shape
        groups = codes.reshape(rows, k // nm_m, nm_m)
        kept = groups != 0
        rank = torch.cumsum(kept.to(torch.int64), dim=-1) - 1
        slot = torch.where(kept, rank, torch.full_like(rank, nm_n))
        slots = torch.zeros((rows, k // nm_m, nm_n + 1), dtype=torch.uint8, device=codes.device)
        slots.scatter_(-1, slot, (groups > 0).to(torch.uint8))
        sign_stream = slots[..., :nm_n].reshape(rows, -1)
        return cls(
            rows,
            k,
            pack_codes(kept.reshape(rows, k).to(torch.uint8), 1),
            pack_codes(sign_stream, 1),
            scales.contiguous(),
            nm_n,
            nm_m,
        )

    @classmethod
    def from_ternary(cls, weight: TernaryWeight, nm_n: int, nm_m: int) -> NMBinaryWeight:
        """Compress a ternary weight whose non-zeros follow an N:M pattern (raises where they do not)."""
        return cls.pack(weight.codes(), weight.scales, nm_n, nm_m)

    def codes(self) -> torch.Tensor:
        """The int8 codes (N, K) in {-1, 0, +1} (0 = pruned)."""
        rows, k, m = self.out_features, self.in_features, self.nm_m
        kept = unpack_codes(self.mask, 1, k).to(torch.int32).reshape(rows, k // m, m)
        sign_stream = unpack_codes(self.signs, 1, self.n_slots).reshape(rows, k // m, self.nm_n)
        weights = 1 << torch.arange(m, device=kept.device, dtype=torch.int32)
        field = (kept * weights).sum(-1, keepdim=True)
        below = field & (weights - 1)
        rank = popcount(below).to(torch.int64)
        if kept.numel() and int(kept.sum(-1).max()) > self.nm_n:
            raise FormatError(f"{self.FORMAT}.mask: a group keeps more than N={self.nm_n} weights")
        sign = torch.gather(sign_stream.to(torch.int32), -1, rank.clamp(max=self.nm_n - 1))
        return (kept * (2 * sign - 1)).reshape(rows, k).to(torch.int8)

    def to_ternary(self) -> TernaryWeight:
        """The same weight as 2-bit ternary codes (runs on the ternary kernels)."""
        return TernaryWeight.pack(self.codes(), self.scales)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return (self.codes().float() * expand_groups(self.scales, self.in_features)).to(dtype)

    def decode_args(self) -> DecodeArgs:
        n, k = self.shape
        return DecodeArgs(
            KernelId.NM, n, k, self.mask, self.scales, self.group_size, 1, words_hi=self.signs,
            nm_n=self.nm_n, nm_m=self.nm_m,
        )  # fmt: skip

    def affine_layout(self) -> TernaryWeight:
        return self.to_ternary()
