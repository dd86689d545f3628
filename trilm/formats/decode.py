"""How a packed weight is decoded: its kernel id and its tensors in the roles every decoder reads.

Each format class names the decode its codes need (:class:`KernelId`, the one place these ids are defined:
the Triton kernels compile them in as constants) and hands its tensors over by role with
:meth:`~trilm.formats.PackedWeight.decode_args`. Kernels then pick a backend from the id and read the
roles; they never ask which class a weight is. Nothing here launches anything: this package knows no
kernel.

The **affine** decodes (ternary, binary, int) share one value rule over an unsigned code ``c`` stored in
int32 bit-planes along K (:mod:`trilm.formats.packing`)::

    ternary  w = s · (c − 1)            c ∈ {0, 1, 2}       (2-bit plane)
    binary   w = s · (2c − 1) (+ μ)     c ∈ {0, 1}          (1-bit plane)
    int      w = s · (c − z)            c < 2^bits          (2- or 4-bit plane; 3-bit: 2-bit + 1-bit planes)

with ``s``, ``z``, ``μ`` per (group of K, output column). :meth:`DecodeArgs.affine_codes` turns these into
plain integer codes, scales and offsets for backends that repack them (the CPU int4 kernel).
"""

from __future__ import annotations

import dataclasses
import enum

import torch

from trilm.formats.packing import unpack_codes


class KernelId(enum.IntEnum):
    """The decode a weight's codes need; the Triton kernels take these values as their ``FMT`` constant."""

    TERNARY = 0
    BINARY = 1
    NM = 2
    INT = 3
    LUT = 4


AFFINE_KERNELS = frozenset({KernelId.TERNARY, KernelId.BINARY, KernelId.INT})
"""Decodes with the affine value rule (module docstring)."""


@dataclasses.dataclass
class DecodeArgs:
    """A packed weight's tensors by role (no copies of the big tensors).

    ``words``/``words_hi``: the code planes (N:M: keep-bitmap / sign slots; int3: low 2 bits / high bit);
    ``scales``: the per-group scale table (multi-plane binary: the decode table); ``zeros``: int zero points;
    ``means``: binary means; ``column_ids``: per-input-column ids (multi-plane binary classes); ``perm``:
    act-order column order of the stored codes; ``sparse``: PB-LLM's salient weights added on top
    (rows, cols, codes, row scales, row zeros)."""

    kernel: KernelId
    n: int
    k: int
    words: torch.Tensor
    scales: torch.Tensor
    group_size: int
    bits: int = 2
    words_hi: torch.Tensor | None = None
    zeros: torch.Tensor | None = None
    means: torch.Tensor | None = None
    column_ids: torch.Tensor | None = None
    perm: torch.Tensor | None = None
    sparse: tuple[torch.Tensor, ...] | None = None
    nm_n: int = 1
    nm_m: int = 2
    lut_bits: int = 1
    lut_classes: int = 1

    @property
    def affine(self) -> bool:
        """True when the affine value rule covers the whole weight (no salient weights on top)."""
        return self.kernel in AFFINE_KERNELS and self.sparse is None

    def affine_codes(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(codes, scales, offsets, means) with ``w = s · (codes − offsets) (+ means)`` per group: codes
        int32 (N, K) in stored column order (``perm`` applies), scales/offsets fp32 (K // g, N)."""
        if not self.affine:
            raise ValueError(f"{self.kernel.name}: not an affine decode")
        k = self.k
        if self.kernel == KernelId.TERNARY:
            codes = unpack_codes(self.words, 2, k).to(torch.int32)
            offsets = torch.ones_like(self.scales, dtype=torch.float32)
        elif self.kernel == KernelId.BINARY:
            codes = unpack_codes(self.words, 1, k).to(torch.int32) * 2
            offsets = torch.ones_like(self.scales, dtype=torch.float32)
        else:
            low_bits = 2 if self.bits == 3 else self.bits
            codes = unpack_codes(self.words, low_bits, k).to(torch.int32)
            if self.bits == 3:
                assert self.words_hi is not None
                codes = codes | (unpack_codes(self.words_hi, 1, k).to(torch.int32) << 2)
            assert self.zeros is not None
            offsets = self.zeros.float()
        means = None if self.means is None else self.means.float()
        return codes, self.scales.float(), offsets, means

    @property
    def code_range(self) -> int:
        """One more than the largest value :meth:`affine_codes` can return."""
        return {KernelId.TERNARY: 3, KernelId.BINARY: 3}.get(self.kernel, 1 << self.bits)
