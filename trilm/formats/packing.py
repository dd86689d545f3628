"""Bit packing along the input dimension into int32 words, the one layout every trilm format uses.

A code matrix of shape (N, K) (N = out_features, K = in_features) with ``bits`` ∈ {1, 2, 4, 8} is stored as
an int32 tensor of shape (ceil(K / per_word), N), per_word = 32 // bits. Element k of row n lives in word
``k // per_word`` at bit offset ``(k % per_word) * bits`` (LSB first). K is the packed axis because a GEMV
reads each weight once along K while N stays contiguous in memory, so a block of output columns is one
coalesced row of words; padding codes past K are zero.
"""

from __future__ import annotations

import torch

WORD_BITS = 32
PACK_BITS = (1, 2, 4, 8)


def per_word(bits: int) -> int:
    """How many ``bits``-wide codes one int32 word holds."""
    if bits not in PACK_BITS:
        raise ValueError(f"bits must be one of {PACK_BITS} to pack into int32 words, got {bits}")
    return WORD_BITS // bits


def packed_rows(k: int, bits: int) -> int:
    """Number of int32 rows (along K) for ``k`` codes of ``bits`` bits."""
    return -(-k // per_word(bits))


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack unsigned integer codes (N, K), each < 2**bits, into int32 words (ceil(K/per_word), N)."""
    if codes.dim() != 2:
        raise ValueError(f"codes must be 2-D (out_features, in_features), got shape {tuple(codes.shape)}")
    if codes.is_floating_point() or codes.is_complex() or codes.dtype == torch.bool:
        if codes.dtype != torch.bool:
            raise ValueError(f"codes must be an integer tensor, got {codes.dtype}")
        codes = codes.to(torch.uint8)
    per = per_word(bits)
    n, k = codes.shape
    if codes.numel():
        lo, hi = int(codes.min()), int(codes.max())
        if lo < 0 or hi >= (1 << bits):
            raise ValueError(
                f"codes must lie in [0, {(1 << bits) - 1}] for {bits}-bit packing, got [{lo}, {hi}]"
            )
    rows = packed_rows(k, bits)
    padded = torch.zeros((n, rows * per), dtype=torch.int32, device=codes.device)
    padded[:, :k] = codes.to(torch.int32)
    lanes = padded.view(n, rows, per)
    words = torch.zeros((n, rows), dtype=torch.int32, device=codes.device)
    for j in range(per):
        words |= lanes[:, :, j] << (bits * j)
    return words.t().contiguous()


def unpack_codes(words: torch.Tensor, bits: int, k: int) -> torch.Tensor:
    """Inverse of :func:`pack_codes`: int32 words (rows, N) → codes (N, k) as uint8."""
    per = per_word(bits)
    if words.dtype != torch.int32 or words.dim() != 2:
        raise ValueError(f"packed words must be a 2-D int32 tensor, got {words.dtype} {tuple(words.shape)}")
    if words.shape[0] != packed_rows(k, bits):
        raise ValueError(
            f"{k} codes of {bits} bits need {packed_rows(k, bits)} packed rows, got {words.shape[0]}"
        )
    mask = (1 << bits) - 1
    rows, n = words.shape
    w = words.t()
    out = torch.empty((n, rows, per), dtype=torch.uint8, device=words.device)
    for j in range(per):
        out[:, :, j] = ((w >> (bits * j)) & mask).to(torch.uint8)
    return out.reshape(n, rows * per)[:, :k].contiguous()


def popcount(x: torch.Tensor) -> torch.Tensor:
    """Number of set bits of each element of a non-negative integer tensor below 2**16 (SWAR, no lookup)."""
    v = x.to(torch.int32)
    v = v - ((v >> 1) & 0x5555)
    v = (v & 0x3333) + ((v >> 2) & 0x3333)
    v = (v + (v >> 4)) & 0x0F0F
    return (v + (v >> 8)) & 0x1F
