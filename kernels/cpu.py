"""The CPU backend: torch's weight-only int4 kernel for every affine weight, converted once at load.

``torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, G, scale_zeros)`` computes ``x @ W^T`` with
``W = (q − 8) · S + Z`` per group of ``G`` ∈ {32, 64, 128, 256} input columns, 4-bit codes ``q`` in the
layout of ``_convert_weight_to_int4pack_for_cpu`` and an (K / G, N, 2) table of (S, Z). Every affine decode
fits that grid exactly (:mod:`trilm.formats.decode`): ternary ``s·(c − 1)``, binary ``s·(2b − 1) + μ`` and
int2/3/4 ``s·(c − z)`` are stored as ``q = c − z + 8``, ``S = s``, ``Z = μ`` (or, for an int4 group whose
codes would leave 0..15 that way, ``q = c`` and ``Z = s·(8 − z)``). N:M binary goes through its ternary
form. A per-row scale (one group spanning K) is repeated over groups of G; N is padded to a
multiple of 16 (zero rows) and K to a multiple of 32 (zero activations) where the kernel needs it.

Why this kernel, and why only for bf16 activations (``python -m benchmarks.kernels.cpu``, this machine, one
thread): torch's x86 build vectorizes it (AVX-512) for bf16 only — activations, scales and output in bf16,
products accumulated in fp32. With fp32 (or fp16) activations it takes a scalar loop, many times slower
than the dense fp32 matmul. ``_weight_int8pack_mm`` has the same shape (fast in bf16 only) at twice the
bytes, and torchao's CPU int4 weight-only layout calls this same operator. So:

* bf16 activations → the int4 kernel (weights read at 4 bits; results equal the fp64 product of the
  bf16-rounded activations and the bf16-rounded table within one bf16 rounding of the output);
* any other dtype → the weight dequantized once, kept, and multiplied densely: exact in that dtype, the
  speed of a float layer (and its memory besides the packed buffers).

Formats without an affine form (multi-plane binary, PB-LLM) are dequantized once in every dtype.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from trilm.formats import PackedWeight

GROUPS = (256, 128, 64, 32)
"""Group sizes the CPU int4 kernel accepts, largest first."""
N_ALIGN, K_ALIGN = 16, 32
INT4_DTYPE = torch.bfloat16
"""The only activation dtype torch's x86 int4 kernel vectorizes."""


def _kernel_group(group_size: int, k: int) -> tuple[int, int] | None:
    """(kernel group G, padded K) for a weight with groups of ``group_size`` columns, or None."""
    if group_size >= k:
        k_pad = -(-k // K_ALIGN) * K_ALIGN
        return next(g for g in GROUPS if k_pad % g == 0), k_pad
    for g in GROUPS:
        if group_size % g == 0:
            return g, k
    return None


def _code_shift(codes: torch.Tensor, offsets: torch.Tensor, group_size: int) -> torch.Tensor:
    """Per (group, column) the integer ``t`` with stored code ``q − t + 8``: the group's own offset where
    every code of it then fits 0..15 (the table's zero is then just the mean: no rounding of a large
    ``s·(8 − z)``), else 8 (the code as it is)."""
    n, k = codes.shape
    g = min(group_size, k)
    grouped = codes.reshape(n, k // g, g)
    lo, hi = grouped.amin(-1).t().float(), grouped.amax(-1).t().float()
    fits = (lo - offsets + 8 >= 0) & (hi - offsets + 8 <= 15) & (offsets == offsets.round())
    return torch.where(fits, offsets, torch.full_like(offsets, 8.0))


@dataclasses.dataclass
class Int4Weight:
    """A packed weight in the CPU int4 kernel's layout; call it with bf16 activations."""

    n: int
    k: int
    k_pad: int
    group: int
    packed: torch.Tensor
    scale_zeros: torch.Tensor
    perm: torch.Tensor | None = None

    @classmethod
    def convert(cls, weight: PackedWeight) -> Int4Weight | None:
        """The weight in kernel layout, or None when it has no affine form or its groups do not fit G."""
        affine = weight.affine_layout()
        if affine is None:
            return None
        args = affine.decode_args()
        fit = _kernel_group(args.group_size, args.k)
        if fit is None or args.code_range > 16:
            return None
        group, k_pad = fit
        codes, scales, offsets, means = args.affine_codes()
        codes, scales, offsets = codes.cpu(), scales.cpu(), offsets.cpu()
        means = means.cpu() if means is not None else None
        shift = _code_shift(codes, offsets, args.group_size)
        zeros = scales * (shift - offsets) + (0.0 if means is None else means)
        g = min(args.group_size, args.k)
        codes = codes - shift.repeat_interleave(g, 0).t().to(torch.int32) + 8
        repeat = (k_pad if args.group_size >= args.k else args.group_size) // group
        n_pad = -(-args.n // N_ALIGN) * N_ALIGN
        q = torch.full((n_pad, k_pad), 8, dtype=torch.int32)
        q[: args.n, : args.k] = codes
        table = torch.zeros((k_pad // group, n_pad, 2), dtype=torch.float32)
        table[:, : args.n, 0] = scales.repeat_interleave(repeat, 0)
        table[:, : args.n, 1] = zeros.repeat_interleave(repeat, 0)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
        perm = None if args.perm is None else args.perm.cpu()
        return cls(args.n, args.k, k_pad, group, packed, table.to(INT4_DTYPE), perm)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x (M, K) bf16 → x @ W^T (M, N) bf16."""
        if self.perm is not None:
            x = x.index_select(1, self.perm)
        if self.k_pad != self.k:
            x = F.pad(x, (0, self.k_pad - self.k))
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(
            x.contiguous(), self.packed, self.group, self.scale_zeros
        )
        return y if y.shape[1] == self.n else y[:, : self.n]


class CpuLinearState:
    """What a layer keeps for the CPU backend: the int4 form (bf16 activations) and dense copies by dtype."""

    def __init__(self, weight: PackedWeight) -> None:
        self.weight = weight
        self.int4 = Int4Weight.convert(weight)
        self.dense: dict[torch.dtype, torch.Tensor] = {}

    def prepare(self, dtype: torch.dtype) -> None:
        """Make the form ``dtype`` activations run on now (at load): the dense copy where the int4 kernel does
        not apply. A compiled step must find it made: dequantizing inside a traced graph is not traceable."""
        if not (self.int4 is not None and dtype == INT4_DTYPE) and dtype not in self.dense:
            self.dense[dtype] = self.weight.dequantize(torch.float32).to(dtype)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x (M, K) on the CPU → (M, N) in x's dtype."""
        if self.int4 is not None and x.dtype == INT4_DTYPE:
            return self.int4(x)
        self.prepare(x.dtype)
        return F.linear(x, self.dense[x.dtype])
