"""Multi-plane (residual) binary weights with group ids: what BiLLM and STBLLM produce.

Both methods approximate each weight as a sum of binary residuals ``w ≈ μ_g + Σ_{p < order_g} α_{g,p} ·
s_p`` (s_p ∈ {-1, +1}) where the group g of a weight decides the order and the (α, μ) it uses. Parameters
are per output row and per block of ``block_size`` input columns (BiLLM: 128). Groups belong to *column
classes*: BiLLM picks salient columns per block (class 1: one group of order 2) and splits the other
columns' weights into two magnitude groups (class 0: two groups of order 1); STBLLM adds N:M pruning (a
"pruned" group of order 0 and μ = 0 in each class) and splits the non-salient weights in three.

Storage. Every weight carries ``n_bits`` bits held as bit-planes (1 bit each, packed along K): in its
column's class, the low bits are its residual signs and the high bits its group's rank inside the class, so
a class with groups of order ≤ o and G_c groups needs o + ceil(log2 G_c) bits; n_bits is the maximum over
classes. The per-(block, class) decode table ``lut[block, class, pattern, n]`` holds μ + Σ α·s for every bit
pattern, so the kernels decode any mix of orders and groups with one gather.

Bits/weight: n_bits + (lut bits) · classes · 2^n_bits / block_size + 8 / N (column classes). BiLLM (n_bits
2, 2 classes, fp16 table, block 128): 2 + 1 = 3.0; STBLLM 4:8 (n_bits 3): 3 + 2 = 5.0. The papers' 1.08 /
0.55 bits count value bits only (see :mod:`trilm.formats.accounting`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import torch

from trilm.formats.base import FormatError, PackedWeight, check_int32_words, register
from trilm.formats.binary import sign_bits
from trilm.formats.decode import DecodeArgs, KernelId
from trilm.formats.packing import pack_codes, packed_rows, unpack_codes

MAX_BITS = 4


@dataclasses.dataclass(frozen=True)
class ResidualGroup:
    """One weight group: how many residual sign planes it uses and which column class it lives in."""

    order: int
    column_class: int = 0


def _class_layout(groups: Sequence[ResidualGroup]) -> tuple[list[list[int]], list[int], int]:
    """Per class: its groups (in order), the sign-bit width (max order); plus the total pattern width."""
    if not groups:
        raise FormatError("multibinary: at least one group is needed")
    n_classes = max(g.column_class for g in groups) + 1
    members: list[list[int]] = [[] for _ in range(n_classes)]
    for gid, g in enumerate(groups):
        if g.order < 0 or g.column_class < 0:
            raise FormatError(f"multibinary: group {gid} has a negative order or class: {g}")
        members[g.column_class].append(gid)
    sign_width = [max((groups[g].order for g in m), default=0) for m in members]
    width = max(
        (sw + math.ceil(math.log2(len(m))) if len(m) > 1 else sw) for sw, m in zip(sign_width, members)
    )
    return members, sign_width, max(width, 1)


def residual_value(
    signs: torch.Tensor,
    group_ids: torch.Tensor,
    alpha: torch.Tensor,
    mu: torch.Tensor,
    groups: Sequence[ResidualGroup],
    block_size: int,
) -> torch.Tensor:
    """Direct evaluation of μ_g + Σ_{p<order_g} α_{g,p}·s_p per weight (N, K) in fp32 — the reference."""
    p_max, n, k = signs.shape
    blk = torch.arange(k, device=signs.device) // block_size
    g = group_ids.long()
    cols = blk.unsqueeze(0).expand(n, k)
    rows = torch.arange(n, device=signs.device).unsqueeze(1).expand(n, k)
    out = mu.float()[cols, g, rows]
    orders = torch.tensor([gr.order for gr in groups], device=signs.device)[g]
    s = signs.float() if signs.dtype != torch.bool else signs.float() * 2 - 1
    for p in range(p_max):
        used = (orders > p).float()
        out = out + used * alpha.float()[cols, g, p, rows] * s[p]
    return out


@register
@dataclasses.dataclass(eq=False, repr=False)
class MultiBinaryWeight(PackedWeight):
    """Bit-planes (n_bits, ceil(K/32), N), column classes (K,), table (blocks, classes, 2^n_bits, N)."""

    FORMAT = "multibinary"
    TENSORS = ("planes", "col_class", "lut")
    SETTINGS = ("n_bits", "n_classes", "block_size")

    planes: torch.Tensor
    col_class: torch.Tensor
    lut: torch.Tensor
    n_bits: int = 2
    n_classes: int = 1
    block_size: int = 128

    def validate(self) -> None:
        n, k, f = self.out_features, self.in_features, self.FORMAT
        if not 1 <= self.n_bits <= MAX_BITS:
            raise FormatError(f"{f}.n_bits: must be in 1..{MAX_BITS}, got {self.n_bits}")
        if self.block_size <= 0 or self.n_classes <= 0:
            raise FormatError(f"{f}: block_size and n_classes must be positive")
        rows = packed_rows(k, 1)
        if self.planes.dtype != torch.int32 or tuple(self.planes.shape) != (self.n_bits, rows, n):
            raise FormatError(
                f"{f}.planes: expected int32 ({self.n_bits}, {rows}, {n}), got "
                f"{self.planes.dtype} {tuple(self.planes.shape)}"
            )
        for plane in self.planes:
            check_int32_words(f, "planes[i]", plane, rows, n)
        if self.col_class.dtype != torch.uint8 or tuple(self.col_class.shape) != (k,):
            raise FormatError(f"{f}.col_class: expected uint8 ({k},), got {self.col_class.dtype}")
        if k and int(self.col_class.max()) >= self.n_classes:
            raise FormatError(f"{f}.col_class: a class id is ≥ n_classes={self.n_classes}")
        shape = (self.n_blocks, self.n_classes, 1 << self.n_bits, n)
        if not self.lut.is_floating_point() or tuple(self.lut.shape) != shape:
            raise FormatError(
                f"{f}.lut: expected a float tensor {shape}, got {self.lut.dtype} {tuple(self.lut.shape)}"
            )
        if not bool(torch.isfinite(self.lut).all()):
            raise FormatError(f"{f}.lut: contains inf or nan")

    @property
    def n_blocks(self) -> int:
        return -(-self.in_features // self.block_size)

    @classmethod
    def from_residual(
        cls,
        signs: torch.Tensor,
        group_ids: torch.Tensor,
        alpha: torch.Tensor,
        mu: torch.Tensor,
        groups: Sequence[ResidualGroup],
        col_class: torch.Tensor | None = None,
        block_size: int = 128,
        lut_dtype: torch.dtype = torch.float16,
    ) -> MultiBinaryWeight:
        """Pack residual binarization output.

        signs (P, N, K) in {-1, +1} (or bool), P = max order (unused planes of low-order groups are ignored);
        group_ids (N, K) in [0, G); alpha (blocks, G, P, N); mu (blocks, G, N); groups[g] gives order and
        column class; col_class (K,) gives each input column's class (default: all class 0).
        """
        f = cls.FORMAT
        if signs.dim() != 3:
            raise FormatError(f"{f}.signs: expected (planes, N, K), got shape {tuple(signs.shape)}")
        p_max, n, k = signs.shape
        members, sign_width, n_bits = _class_layout(groups)
        if n_bits > MAX_BITS:
            raise FormatError(f"{f}: groups need {n_bits} bits per weight, more than {MAX_BITS}")
        if max(g.order for g in groups) > p_max:
            raise FormatError(
                f"{f}.signs: {p_max} planes given, a group has order {max(g.order for g in groups)}"
            )
        n_blocks = -(-k // block_size)
        g_count = len(groups)
        if tuple(alpha.shape) != (n_blocks, g_count, p_max, n):
            raise FormatError(
                f"{f}.alpha: expected {(n_blocks, g_count, p_max, n)}, got {tuple(alpha.shape)}"
            )
        if tuple(mu.shape) != (n_blocks, g_count, n):
            raise FormatError(f"{f}.mu: expected {(n_blocks, g_count, n)}, got {tuple(mu.shape)}")
        if tuple(group_ids.shape) != (n, k) or group_ids.is_floating_point():
            raise FormatError(f"{f}.group_ids: expected integer ({n}, {k}), got {tuple(group_ids.shape)}")
        gid = group_ids.long()
        if gid.numel() and (int(gid.min()) < 0 or int(gid.max()) >= g_count):
            raise FormatError(f"{f}.group_ids: ids must be in [0, {g_count})")
        dev = signs.device
        cls_of_col = torch.zeros(k, dtype=torch.long, device=dev) if col_class is None else col_class.long()
        if tuple(cls_of_col.shape) != (k,) or (k and int(cls_of_col.max()) >= len(members)):
            raise FormatError(f"{f}.col_class: expected ({k},) ids below {len(members)}")
        group_class = torch.tensor([g.column_class for g in groups], device=dev)
        mismatch = group_class[gid] != cls_of_col.unsqueeze(0)
        if bool(mismatch.any()):
            r, c = torch.nonzero(mismatch)[0].tolist()
            raise FormatError(
                f"{f}.group_ids: weight ({r}, {c}) is in group {int(gid[r, c])} of class "
                f"{int(group_class[gid[r, c]])} but column {c} is class {int(cls_of_col[c])}"
            )

        bits = torch.stack([sign_bits(s, f, "signs") for s in signs]).to(torch.int64)
        rank = torch.zeros(g_count, dtype=torch.int64, device=dev)
        for m in members:
            for r, g in enumerate(m):
                rank[g] = r
        order = torch.tensor([g.order for g in groups], device=dev)
        shift = torch.tensor(sign_width, device=dev)[group_class]
        pattern = rank[gid] << shift[gid]
        for p in range(p_max):
            pattern |= (bits[p] * (order[gid] > p)) << p
        planes = torch.stack([pack_codes(((pattern >> b) & 1).to(torch.uint8), 1) for b in range(n_bits)])

        lut = torch.zeros((n_blocks, len(members), 1 << n_bits, n), dtype=torch.float32, device=dev)
        for c, m in enumerate(members):
            for r, g in enumerate(m):
                o = groups[g].order
                for combo in range(1 << o):
                    value = mu[:, g].float().clone()
                    for p in range(o):
                        sign = 1.0 if (combo >> p) & 1 else -1.0
                        value += sign * alpha[:, g, p].float()
                    lut[:, c, (r << sign_width[c]) | combo] = value
        return cls(
            n,
            k,
            planes,
            cls_of_col.to(torch.uint8),
            lut.to(lut_dtype),
            n_bits,
            len(members),
            block_size,
        )

    def patterns(self) -> torch.Tensor:
        """Per-weight bit pattern (N, K) assembled from the planes (plane b = bit b)."""
        out = torch.zeros(self.shape, dtype=torch.int64, device=self.planes.device)
        for b in range(self.n_bits):
            out |= unpack_codes(self.planes[b], 1, self.in_features).to(torch.int64) << b
        return out

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        n, k = self.shape
        dev = self.planes.device
        blk = (torch.arange(k, device=dev) // self.block_size).unsqueeze(0).expand(n, k)
        cls_ = self.col_class.long().unsqueeze(0).expand(n, k)
        rows = torch.arange(n, device=dev).unsqueeze(1).expand(n, k)
        return self.lut.float()[blk, cls_, self.patterns(), rows].to(dtype)

    def decode_args(self) -> DecodeArgs:
        n, k = self.shape
        return DecodeArgs(
            KernelId.LUT, n, k, self.planes, self.lut, self.block_size, column_ids=self.col_class,
            lut_bits=self.n_bits, lut_classes=self.n_classes,
        )  # fmt: skip
