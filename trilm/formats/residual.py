"""Residual binary weights with salient columns, split groups and optional N:M pruning (BiLLM, STBLLM).

What the methods produce, per block of ``block_size`` input columns and per output row:

- a set of *salient columns* (shared by all rows of the block) whose weights are ``μ + Σ_{p<order} α_p·s_p``
  (residual binarization of order 2: two sign planes, three parameters μ, α₀, α₁ — the order-p means are
  summed into one μ);
- the other weights split into ``groups`` groups (BiLLM: 2 by a magnitude break point, STBLLM: 3 by the
  trisection), each ``μ_g + α_g·s``;
- with N:M (STBLLM) exactly ``nm_n`` of every ``nm_m`` consecutive inputs of a row kept; pruned weights are 0.

Layout — nothing stored that the output does not need (the parts that
:func:`~trilm.formats.accounting.residual_binary_minimum` counts):

| tensor | content | bits |
|---|---|---|
| ``salient_cols`` | bitmap of the salient input columns | K |
| ``patterns`` | rank of each N:M keep pattern among the C(M, N) | ceil(log2 C(M,N)) per group (4:8: 7) |
| ``signs`` | first sign of every kept weight, row-major | 1 per kept weight |
| ``signs_hi`` | the further signs of the kept weights in salient columns | order − 1 per such weight |
| ``group_ids`` | group of every kept non-salient weight, base-G digits | log2 G (+0.3 %) each |
| ``params`` | μ, α₀… of each salient part, μ_g, α_g of each group: non-empty ones only | fp16 each |

Parameters are a table (blocks, 1 + order + 2·groups, N) — μ, α₀…, then μ_g, α_g per group — of which only
the entries of non-empty (block, row, group) parts are stored, in table order: which ones those are follows
from the decoded masks, so no index is needed (small blocks and the trisection's often empty third group
would otherwise store a third of the table for nothing).

BiLLM at 10 % salient columns with fp16 parameters stores ≈ 1 + 0.1 + 0.9 + 7·16/128 ≈ 2.9 bits/weight:
the paper's 1.1 counts the signs only. The kernels read it through :meth:`ResidualBinaryWeight.kernel_layout`,
a :class:`~trilm.formats.MultiBinaryWeight` (bit-planes + per-block decode table, fp32 so it decodes to
exactly :meth:`dequantize`) built once at load time.
"""

from __future__ import annotations

import dataclasses

import torch

from trilm.formats.accounting import residual_binary_minimum
from trilm.formats.base import FormatError, PackedWeight, register
from trilm.formats.bitstream import (
    digit_stream_bytes,
    nm_rank,
    nm_rank_bits,
    nm_unrank,
    pack_bits,
    pack_digits,
    stream_bytes,
    unpack_bits,
    unpack_digits,
)
from trilm.formats.multibinary import MultiBinaryWeight, ResidualGroup


def param_count(order: int, groups: int) -> int:
    """Parameters per (block, row): μ and ``order`` α of the salient part, μ and α per split group."""
    return 1 + order + 2 * groups


def present_parts(
    salient: torch.Tensor, gid: torch.Tensor, order: int, groups: int, block_size: int
) -> torch.Tensor:
    """bool (blocks, 1 + order + 2·groups, N): the parameters of the parts that have members — the salient
    part of a (block, row) when it keeps a salient weight, group g's when some weight of the row's block is
    in g (``salient`` (N, K) bool: kept weights in salient columns; ``gid`` (N, K): group or −1)."""
    n, k = gid.shape
    blocks = -(-k // block_size)
    blk = torch.arange(k, device=gid.device) // block_size
    count = torch.zeros((blocks, n), dtype=torch.int64, device=gid.device)
    count.index_add_(0, blk, salient.to(torch.int64).t())
    parts = [count > 0] * (1 + order)
    for g in range(groups):
        count = torch.zeros_like(count).index_add_(0, blk, (gid == g).to(torch.int64).t())
        parts += [count > 0] * 2
    return torch.stack(parts, dim=1)


def expand_blocks(table: torch.Tensor, k: int, block_size: int) -> torch.Tensor:
    """(blocks, N) per-block values → (N, K) per weight, fp32."""
    return table.float().t().repeat_interleave(block_size, dim=1)[:, :k]


@register
@dataclasses.dataclass(eq=False, repr=False)
class ResidualBinaryWeight(PackedWeight):
    """BiLLM/STBLLM output: salient-column bitmap, N:M ranks, sign streams, group digits, per-block params."""

    FORMAT = "residual_binary"
    TENSORS = ("salient_cols", "signs", "params")
    OPTIONAL_TENSORS = ("signs_hi", "patterns", "group_ids")
    SETTINGS = ("block_size", "order", "groups", "nm_n", "nm_m", "salient_kept", "n_params")

    salient_cols: torch.Tensor
    signs: torch.Tensor
    params: torch.Tensor
    signs_hi: torch.Tensor | None = None
    patterns: torch.Tensor | None = None
    group_ids: torch.Tensor | None = None
    block_size: int = 128
    order: int = 2
    groups: int = 2
    nm_n: int = 1
    nm_m: int = 1
    salient_kept: int = 0
    n_params: int = 0

    # -- validation -----------------------------------------------------------------------------------------
    def validate(self) -> None:
        n, k, f = self.out_features, self.in_features, self.FORMAT
        if self.block_size <= 0 or self.order < 1 or self.groups < 1:
            raise FormatError(f"{f}: block_size, order and groups must be positive")
        if not 0 < self.nm_n <= self.nm_m <= 16 or k % self.nm_m:
            raise FormatError(
                f"{f}: N:M = {self.nm_n}:{self.nm_m} needs 0 < N ≤ M ≤ 16 and M dividing in_features={k}"
            )
        self._check_stream("salient_cols", self.salient_cols, stream_bytes(k, 1))
        self._check_stream("signs", self.signs, stream_bytes(self.kept, 1))
        if not 0 <= self.salient_kept <= self.kept:
            raise FormatError(f"{f}.salient_kept: {self.salient_kept} outside [0, {self.kept}]")
        self._check_optional("signs_hi", self.signs_hi, stream_bytes(self.salient_kept * (self.order - 1), 1))
        self._check_optional("patterns", self.patterns, stream_bytes(n * k // self.nm_m, self.rank_bits))
        nonsalient = self.kept - self.salient_kept
        ids = digit_stream_bytes(nonsalient, self.groups) if self.groups > 1 else 0
        self._check_optional("group_ids", self.group_ids, ids)
        limit = self.n_blocks * param_count(self.order, self.groups) * n
        if not 0 <= self.n_params <= limit:
            raise FormatError(f"{f}.n_params: {self.n_params} outside [0, {limit}]")
        if not self.params.is_floating_point() or tuple(self.params.shape) != (self.n_params,):
            raise FormatError(
                f"{f}.params: expected floats ({self.n_params},), got {self.params.dtype} "
                f"{tuple(self.params.shape)}"
            )
        if not bool(torch.isfinite(self.params).all()):
            raise FormatError(f"{f}.params: contains inf or nan")

    def _check_stream(self, name: str, t: torch.Tensor, nbytes: int) -> None:
        if t.dtype != torch.uint8 or t.dim() != 1 or t.numel() != nbytes:
            raise FormatError(
                f"{self.FORMAT}.{name}: expected a uint8 stream of {nbytes} bytes, "
                f"got {t.dtype} {tuple(t.shape)}"
            )

    def _check_optional(self, name: str, t: torch.Tensor | None, nbytes: int) -> None:
        if nbytes == 0:
            if t is not None and t.numel():
                raise FormatError(
                    f"{self.FORMAT}.{name}: not used by these settings but {t.numel()} bytes given"
                )
            return
        if t is None:
            raise FormatError(f"{self.FORMAT}.{name}: missing ({nbytes} bytes expected)")
        self._check_stream(name, t, nbytes)

    # -- sizes ----------------------------------------------------------------------------------------------
    @property
    def n_blocks(self) -> int:
        return -(-self.in_features // self.block_size)

    @property
    def rank_bits(self) -> int:
        return nm_rank_bits(self.nm_n, self.nm_m)

    @property
    def kept(self) -> int:
        """Non-zero (kept) weights: all of them without N:M."""
        return self.out_features * self.in_features // self.nm_m * self.nm_n

    # -- building -------------------------------------------------------------------------------------------
    @classmethod
    def pack(
        cls,
        *,
        salient_cols: torch.Tensor,
        signs: torch.Tensor,
        group_ids: torch.Tensor,
        params: torch.Tensor,
        kept: torch.Tensor | None = None,
        block_size: int = 128,
        groups: int = 2,
        nm_n: int = 1,
        nm_m: int = 1,
    ) -> ResidualBinaryWeight:
        """salient_cols bool (K,); signs (order, N, K) in {−1, +1} (plane 0 used for every kept weight, the
        others in salient columns); group_ids int (N, K) in [0, groups) (used for kept non-salient weights);
        params (blocks, 1 + order + 2·groups, N); kept bool (N, K) with exactly nm_n per nm_m (None: all)."""
        f = cls.FORMAT
        if signs.dim() != 3:
            raise FormatError(f"{f}.signs: expected (order, N, K), got shape {tuple(signs.shape)}")
        order, n, k = signs.shape
        if tuple(salient_cols.shape) != (k,):
            raise FormatError(f"{f}.salient_cols: expected ({k},), got {tuple(salient_cols.shape)}")
        if signs.is_floating_point() or bool(((signs != 1) & (signs != -1)).any()):
            raise FormatError(f"{f}.signs: expected integer values -1 or +1")
        if kept is None:
            if nm_n != nm_m:
                raise FormatError(f"{f}.kept: an N:M mask is needed for {nm_n}:{nm_m}")
            kept = torch.ones((n, k), dtype=torch.bool, device=signs.device)
        if tuple(kept.shape) != (n, k) or kept.dtype != torch.bool:
            raise FormatError(f"{f}.kept: expected bool ({n}, {k})")
        sal = salient_cols.to(torch.bool)
        sal_kept = kept & sal.unsqueeze(0)
        nonsal_kept = kept & ~sal.unsqueeze(0)
        ids = group_ids[nonsal_kept].to(torch.int64)
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= groups):
            raise FormatError(f"{f}.group_ids: ids of kept non-salient weights must lie in [0, {groups})")
        patterns = None
        if nm_n != nm_m:
            try:
                patterns = pack_bits(nm_rank(kept, nm_n, nm_m), nm_rank_bits(nm_n, nm_m))
            except ValueError as exc:
                raise FormatError(f"{f}.kept: {exc}") from None
        hi = torch.stack([signs[p][sal_kept] for p in range(1, order)]) if order > 1 else None
        shape = (-(-k // block_size), param_count(order, groups), n)
        if tuple(params.shape) != shape or not params.is_floating_point():
            raise FormatError(f"{f}.params: expected a float table {shape}, got {tuple(params.shape)}")
        gid = torch.where(nonsal_kept, group_ids.to(torch.int64), -1)
        present = present_parts(sal_kept, gid, order, groups, block_size)
        stored = params[present]
        return cls(
            n,
            k,
            pack_bits(sal, 1),
            pack_bits(signs[0][kept] > 0, 1),
            stored.contiguous(),
            None if hi is None else pack_bits(hi > 0, 1),
            patterns,
            pack_digits(ids, groups) if groups > 1 else None,
            block_size,
            order,
            groups,
            nm_n,
            nm_m,
            int(sal_kept.sum()),
            int(present.sum()),
        )

    # -- decoding -------------------------------------------------------------------------------------------
    def salient_columns(self) -> torch.Tensor:
        return unpack_bits(self.salient_cols, 1, self.in_features).to(torch.bool)

    def kept_mask(self) -> torch.Tensor:
        n, k = self.shape
        if self.patterns is None:
            return torch.ones((n, k), dtype=torch.bool, device=self.signs.device)
        ranks = unpack_bits(self.patterns, self.rank_bits, n * k // self.nm_m).reshape(n, k // self.nm_m)
        return nm_unrank(ranks, self.nm_n, self.nm_m)

    def planes(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(kept (N, K), salient columns (K,), signs (order, N, K) in {−1, 0, +1} (0 = unused), group ids
        (N, K) (−1 for salient or pruned weights))."""
        n, k = self.shape
        kept, sal = self.kept_mask(), self.salient_columns()
        sal_kept = kept & sal.unsqueeze(0)
        nonsal_kept = kept & ~sal.unsqueeze(0)
        if int(sal_kept.sum()) != self.salient_kept:
            raise FormatError(
                f"{self.FORMAT}: {int(sal_kept.sum())} kept weights in salient columns, "
                f"meta says {self.salient_kept}"
            )
        signs = torch.zeros((self.order, n, k), dtype=torch.int8, device=kept.device)
        signs[0][kept] = (unpack_bits(self.signs, 1, self.kept) * 2 - 1).to(torch.int8)
        if self.order > 1:
            hi = unpack_bits(self.signs_hi, 1, self.salient_kept * (self.order - 1)) * 2 - 1
            for p, plane in enumerate(hi.reshape(self.order - 1, -1).to(torch.int8), start=1):
                signs[p][sal_kept] = plane
        gid = torch.full((n, k), -1, dtype=torch.int64, device=kept.device)
        count = self.kept - self.salient_kept
        gid[nonsal_kept] = unpack_digits(self.group_ids, self.groups, count) if self.groups > 1 else 0
        return kept, sal, signs, gid

    def parameters(self) -> torch.Tensor:
        """The dense parameter table (blocks, 1 + order + 2·groups, N), 0 for empty parts."""
        kept, sal, _, gid = self.planes()
        return self.param_table(kept, sal, gid)

    def param_table(self, kept: torch.Tensor, sal: torch.Tensor, gid: torch.Tensor) -> torch.Tensor:
        """The (blocks, 1 + order + 2·groups, N) parameter table (0 for empty parts), params' dtype."""
        present = present_parts(kept & sal.unsqueeze(0), gid, self.order, self.groups, self.block_size)
        if int(present.sum()) != self.n_params:
            raise FormatError(
                f"{self.FORMAT}: the masks have {int(present.sum())} non-empty parts' parameters, "
                f"params holds {self.n_params}"
            )
        table = torch.zeros(present.shape, dtype=self.params.dtype, device=self.params.device)
        table[present] = self.params
        return table

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        n, k = self.shape
        kept, sal, signs, gid = self.planes()
        table = self.param_table(kept, sal, gid)
        b, o = self.block_size, self.order
        s = signs.float()
        w = torch.zeros((n, k), dtype=torch.float32, device=kept.device)
        cols = torch.nonzero(sal).reshape(-1)
        if cols.numel():
            part = expand_blocks(table[:, 0], k, b)[:, cols]
            for p in range(o):
                part = part + expand_blocks(table[:, 1 + p], k, b)[:, cols] * s[p][:, cols]
            w[:, cols] = part
        for g in range(self.groups):
            where = gid == g
            mu = expand_blocks(table[:, 1 + o + 2 * g], k, b)
            alpha = expand_blocks(table[:, 2 + o + 2 * g], k, b)
            w = torch.where(where, mu + alpha * s[0], w)
        return torch.where(kept, w, torch.zeros_like(w)).to(dtype)

    # -- bits -----------------------------------------------------------------------------------------------
    def value_bits(self) -> float:
        """The papers' count for this output: sign bits per weight (BiLLM 2·r + (1 − r), times N/M)."""
        signs = self.kept + self.salient_kept * (self.order - 1)
        return signs / (self.out_features * self.in_features)

    def minimum_bits(self) -> float:
        """Information-theoretic minimum of this output in bits (:func:`residual_binary_minimum`)."""
        n, k = self.shape
        kept, sal, _, gid = self.planes()
        b, o = self.block_size, self.order
        params = int(present_parts(kept & sal.unsqueeze(0), gid, o, self.groups, b).sum())
        sets = []
        for i in range(self.n_blocks):
            width = min(b, k - i * b)
            sets.append((width, int(sal[i * b : i * b + width].sum())))
        return residual_binary_minimum(
            kept=self.kept,
            salient_kept=self.salient_kept,
            groups=self.groups,
            order=o,
            nm_groups=n * k // self.nm_m,
            nm_n=self.nm_n,
            nm_m=self.nm_m,
            salient_column_sets=sets,
            params=params,
            param_bits=self.params.element_size() * 8,
        )

    # -- kernels --------------------------------------------------------------------------------------------
    def kernel_layout(self) -> MultiBinaryWeight:
        """The same weight as multi-plane binary (decode table in fp32, so it equals :meth:`dequantize`)."""
        kept, sal, signs, gid = self.planes()
        table = self.param_table(kept, sal, gid)
        o, g_count = self.order, self.groups
        pruned = self.nm_n != self.nm_m
        groups = [ResidualGroup(1, 0) for _ in range(g_count)]
        salient_group = len(groups)
        groups.append(ResidualGroup(o, 1))
        if pruned:
            groups += [ResidualGroup(0, 0), ResidualGroup(0, 1)]
        ids = torch.where(gid >= 0, gid, torch.full_like(gid, salient_group))
        if pruned:
            zero_id = torch.where(sal, g_count + 2, g_count + 1).unsqueeze(0).expand_as(ids)
            ids = torch.where(kept, ids, zero_id)
        nb, n = self.n_blocks, self.out_features
        alpha = torch.zeros((nb, len(groups), o, n), dtype=torch.float32, device=self.params.device)
        mu = torch.zeros((nb, len(groups), n), dtype=torch.float32, device=self.params.device)
        p = table.float()
        mu[:, salient_group] = p[:, 0]
        alpha[:, salient_group] = p[:, 1 : 1 + o]
        for g in range(g_count):
            mu[:, g] = p[:, 1 + o + 2 * g]
            alpha[:, g, 0] = p[:, 2 + o + 2 * g]
        plane_signs = torch.where(signs == 0, torch.ones_like(signs), signs)
        return MultiBinaryWeight.from_residual(
            plane_signs,
            ids,
            alpha,
            mu,
            groups,
            col_class=sal.to(torch.int64),
            block_size=self.block_size,
            lut_dtype=torch.float32,
        )
