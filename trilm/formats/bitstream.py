"""Dense bit streams for the compact post-hoc formats: fixed-width codes, digits, Elias–Fano sets, N:M ranks.

The GEMV layouts of :mod:`trilm.formats.packing` put 1/2/4/8-bit codes in int32 words so a kernel can read
them in place. The compact formats (:mod:`trilm.formats.residual`, :mod:`trilm.formats.partial`) instead
store what a layer *is* with as few bits as a fixed-length code allows, and are converted to a kernel layout
once at load time. Their pieces are all here, each exact and vectorized (no per-element Python loops):

- :func:`pack_bits` / :func:`unpack_bits`: codes of any width 0–62 bits, back to back, LSB first, in a
  uint8 stream (a 7-bit N:M rank costs 7 bits, not 8).
- :func:`pack_digits` / :func:`unpack_digits`: base-r digits, ``d`` per chunk of ceil(d·log2 r) bits
  (three groups: 39 digits in 62 bits, 1.590 bits each against log2 3 = 1.585).
- :func:`encode_subset` / :func:`decode_subset`: a set of positions of a known universe as a bitmap or as
  Elias–Fano (n·(2 + log2(U/n)) bits), whichever is smaller, over the set or its complement.
- :func:`nm_rank` / :func:`nm_unrank`: which N of M consecutive positions are kept, as the rank of the
  pattern among the C(M, N) possible ones (4 of 8: 70 patterns, 7 bits).
"""

from __future__ import annotations

import functools
import math

import torch

MAX_WIDTH = 62
CHUNK = 1 << 20
"""Values handled per step, bounding the temporary memory of the bit expansion."""


def stream_bytes(count: int, width: int) -> int:
    """Bytes a stream of ``count`` codes of ``width`` bits takes."""
    return -(-count * width // 8)


def pack_bits(values: torch.Tensor, width: int) -> torch.Tensor:
    """Non-negative integers (any shape, < 2**width) → uint8 stream, each ``width`` bits, LSB first."""
    if not 0 <= width <= MAX_WIDTH:
        raise ValueError(f"code width must be in 0..{MAX_WIDTH}, got {width}")
    flat = values.reshape(-1)
    if flat.is_floating_point() or flat.dtype == torch.bool:
        flat = flat.to(torch.int64)
    n = flat.numel()
    out = torch.zeros(stream_bytes(n, width), dtype=torch.uint8, device=flat.device)
    if n == 0 or width == 0:
        if n and width == 0 and bool((flat != 0).any()):
            raise ValueError("0-bit codes must all be 0")
        return out
    lo, hi = int(flat.min()), int(flat.max())
    if lo < 0 or hi >= (1 << width):
        raise ValueError(
            f"codes must lie in [0, {(1 << width) - 1}] for {width}-bit packing, got [{lo}, {hi}]"
        )
    shifts = torch.arange(width, device=flat.device, dtype=torch.int64)
    byte_weights = torch.tensor([1 << j for j in range(8)], dtype=torch.int32, device=flat.device)
    step = max(8, CHUNK // width // 8 * 8)
    for start in range(0, n, step):
        part = flat[start : start + step].to(torch.int64)
        bits = ((part.unsqueeze(1) >> shifts) & 1).to(torch.uint8).reshape(-1)
        pad = (-bits.numel()) % 8
        if pad:
            bits = torch.cat([bits, bits.new_zeros(pad)])
        packed = (bits.reshape(-1, 8).to(torch.int32) * byte_weights).sum(1).to(torch.uint8)
        first = start * width // 8
        out[first : first + packed.numel()] = packed
    return out


def unpack_bits(stream: torch.Tensor, width: int, count: int) -> torch.Tensor:
    """Inverse of :func:`pack_bits`: ``count`` codes of ``width`` bits as int64 (count,)."""
    if not 0 <= width <= MAX_WIDTH:
        raise ValueError(f"code width must be in 0..{MAX_WIDTH}, got {width}")
    if stream.dtype != torch.uint8 or stream.dim() != 1:
        raise ValueError(f"a bit stream is a 1-D uint8 tensor, got {stream.dtype} {tuple(stream.shape)}")
    if stream.numel() != stream_bytes(count, width):
        raise ValueError(
            f"{count} codes of {width} bits take {stream_bytes(count, width)} bytes, got {stream.numel()}"
        )
    out = torch.zeros(count, dtype=torch.int64, device=stream.device)
    if count == 0 or width == 0:
        return out
    bit_ids = torch.arange(8, device=stream.device, dtype=torch.int32)
    weights = torch.tensor([1 << j for j in range(width)], dtype=torch.int64, device=stream.device)
    step = max(8, CHUNK // width // 8 * 8)
    for start in range(0, count, step):
        stop = min(start + step, count)
        first, last = start * width // 8, -(-stop * width // 8)
        bits = ((stream[first:last].to(torch.int32).unsqueeze(1) >> bit_ids) & 1).reshape(-1)
        bits = bits[: (stop - start) * width].reshape(-1, width).to(torch.int64)
        out[start:stop] = (bits * weights).sum(1)
    return out


@functools.cache
def digits_per_chunk(radix: int) -> tuple[int, int]:
    """(digits, bits) per chunk for base-``radix`` digits: the most compact chunk of ≤ 62 bits."""
    if radix < 2:
        raise ValueError(f"radix must be ≥ 2, got {radix}")
    best = (1, math.ceil(math.log2(radix)))
    d = 1
    while radix ** (d + 1) < (1 << MAX_WIDTH):
        d += 1
        bits = (radix**d - 1).bit_length()
        if bits / d < best[1] / best[0] - 1e-12:
            best = (d, bits)
    return best


def digit_stream_bytes(count: int, radix: int) -> int:
    d, bits = digits_per_chunk(radix)
    return stream_bytes(-(-count // d), bits)


def pack_digits(digits: torch.Tensor, radix: int) -> torch.Tensor:
    """Base-``radix`` digits (< radix) → uint8 stream of chunks (digit i of a chunk has weight radix**i)."""
    flat = digits.reshape(-1).to(torch.int64)
    if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= radix):
        raise ValueError(f"digits must lie in [0, {radix - 1}]")
    d, bits = digits_per_chunk(radix)
    if radix & (radix - 1) == 0:
        return pack_bits(flat, radix.bit_length() - 1)
    pad = (-flat.numel()) % d
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    powers = torch.tensor([radix**i for i in range(d)], dtype=torch.int64, device=flat.device)
    return pack_bits((flat.reshape(-1, d) * powers).sum(1), bits)


def unpack_digits(stream: torch.Tensor, radix: int, count: int) -> torch.Tensor:
    """Inverse of :func:`pack_digits`: ``count`` digits as int64."""
    if radix & (radix - 1) == 0:
        return unpack_bits(stream, radix.bit_length() - 1, count)
    d, bits = digits_per_chunk(radix)
    chunks = unpack_bits(stream, bits, -(-count // d))
    powers = torch.tensor([radix**i for i in range(d)], dtype=torch.int64, device=stream.device)
    return ((chunks.unsqueeze(1) // powers) % radix).reshape(-1)[:count]


# -- sets of positions ------------------------------------------------------------------------------------
SUBSET_CODINGS = ("bitmap", "elias_fano", "elias_fano_complement")


def _ef_low_bits(universe: int, n: int) -> int:
    if n == 0:
        return universe.bit_length()
    return max(0, math.floor(math.log2(universe / n)))


def subset_code_bits(universe: int, n: int, coding: str) -> int:
    """Bits :func:`encode_subset` spends (whole bytes per stream) on ``n`` of ``universe`` positions."""
    if coding == "bitmap":
        return 8 * stream_bytes(universe, 1)
    if coding == "elias_fano_complement":
        n = universe - n
    elif coding != "elias_fano":
        raise ValueError(f"subset coding must be one of {SUBSET_CODINGS}, got {coding!r}")
    low = _ef_low_bits(universe, n)
    return 8 * (stream_bytes(n, low) + stream_bytes(n + (universe >> low) + 1, 1))


def best_subset_coding(universe: int, n: int) -> str:
    """The cheapest of :data:`SUBSET_CODINGS` for ``n`` members of ``universe`` positions."""
    return min(SUBSET_CODINGS, key=lambda c: subset_code_bits(universe, n, c))


def encode_subset(member: torch.Tensor, coding: str | None = None) -> tuple[str, dict[str, torch.Tensor]]:
    """A bool vector (the universe) → (coding, streams). Elias–Fano stores each member position p as its
    low l = floor(log2(U / n)) bits plus its high part p >> l in unary (one bit per member and one per
    high value), about n·(2 + log2(U / n)) bits; the complement variant codes the non-members."""
    member = member.reshape(-1).to(torch.bool)
    universe, n = member.numel(), int(member.sum())
    coding = coding or best_subset_coding(universe, n)
    if coding == "bitmap":
        return coding, {"bitmap": pack_bits(member, 1)}
    if coding == "elias_fano_complement":
        member = ~member
        n = universe - n
    elif coding != "elias_fano":
        raise ValueError(f"subset coding must be one of {SUBSET_CODINGS}, got {coding!r}")
    pos = torch.nonzero(member).reshape(-1)
    low = _ef_low_bits(universe, n)
    high_bits = torch.zeros(n + (universe >> low) + 1, dtype=torch.bool, device=member.device)
    high_bits[(pos >> low) + torch.arange(n, device=member.device)] = True
    return coding, {"ef_low": pack_bits(pos & ((1 << low) - 1), low), "ef_high": pack_bits(high_bits, 1)}


def decode_subset(coding: str, streams: dict[str, torch.Tensor], universe: int, n: int) -> torch.Tensor:
    """Inverse of :func:`encode_subset`: the bool membership vector (universe,) of ``n`` members."""
    if coding == "bitmap":
        return unpack_bits(streams["bitmap"], 1, universe).to(torch.bool)
    complement = coding == "elias_fano_complement"
    if not complement and coding != "elias_fano":
        raise ValueError(f"subset coding must be one of {SUBSET_CODINGS}, got {coding!r}")
    coded = universe - n if complement else n
    low = _ef_low_bits(universe, coded)
    lows = unpack_bits(streams["ef_low"], low, coded)
    ones = torch.nonzero(unpack_bits(streams["ef_high"], 1, coded + (universe >> low) + 1)).reshape(-1)
    if ones.numel() != coded:
        raise ValueError(f"Elias–Fano high bits hold {ones.numel()} members, expected {coded}")
    pos = ((ones - torch.arange(coded, device=ones.device)) << low) | lows
    if coded and (int(pos.max()) >= universe or bool((pos[1:] <= pos[:-1]).any())):
        raise ValueError("Elias–Fano positions are not strictly increasing inside the universe")
    member = torch.zeros(universe, dtype=torch.bool, device=ones.device)
    member[pos] = True
    return ~member if complement else member


# -- N:M patterns -----------------------------------------------------------------------------------------
@functools.cache
def _nm_tables(n: int, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(pattern bitmasks by rank, rank by bitmask (−1 = not n of m))."""
    if not 0 < m <= 16 or not 0 <= n <= m:
        raise ValueError(f"N:M patterns need 0 ≤ N ≤ M ≤ 16, got {n}:{m}")
    masks = [v for v in range(1 << m) if bin(v).count("1") == n]
    by_rank = torch.tensor(masks, dtype=torch.int64)
    rank_of = torch.full((1 << m,), -1, dtype=torch.int64)
    rank_of[by_rank] = torch.arange(len(masks))
    return by_rank, rank_of


def nm_rank_bits(n: int, m: int) -> int:
    """Bits of one pattern rank: ceil(log2 C(m, n)) (4 of 8 → 7; 0 when only one pattern exists)."""
    return (math.comb(m, n) - 1).bit_length()


def nm_rank(kept: torch.Tensor, n: int, m: int) -> torch.Tensor:
    """Ranks (rows, K / m) of the kept patterns of a bool (rows, K) mask with exactly n kept per m."""
    rows, k = kept.shape
    if k % m:
        raise ValueError(f"in_features={k} is not a multiple of M={m}")
    weights = 1 << torch.arange(m, dtype=torch.int64, device=kept.device)
    field = (kept.reshape(rows, k // m, m).to(torch.int64) * weights).sum(-1)
    ranks = _nm_tables(n, m)[1].to(kept.device)[field]
    if ranks.numel() and int(ranks.min()) < 0:
        r, g = torch.nonzero(ranks < 0)[0].tolist()
        count = int(kept.reshape(rows, k // m, m)[r, g].sum())
        raise ValueError(f"row {r}, group {g} keeps {count} weights, not N={n} of M={m}")
    return ranks


def nm_unrank(ranks: torch.Tensor, n: int, m: int) -> torch.Tensor:
    """Inverse of :func:`nm_rank`: bool (rows, groups·m)."""
    if ranks.numel() and (int(ranks.min()) < 0 or int(ranks.max()) >= math.comb(m, n)):
        raise ValueError(f"an N:M rank lies outside [0, C({m}, {n}) = {math.comb(m, n)})")
    field = _nm_tables(n, m)[0].to(ranks.device)[ranks]
    bits = (field.unsqueeze(-1) >> torch.arange(m, device=ranks.device)) & 1
    return bits.reshape(ranks.shape[0], -1).to(torch.bool)
