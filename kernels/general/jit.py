"""Triton kernels: low-bit weights decoded in registers, a split-K GEMV and a ``tl.dot`` GEMM.

Weights arrive in the :mod:`trilm.formats` layout: codes packed along K into int32 words with N contiguous,
so a (BLOCK_K, BLOCK_N) tile is BLOCK_K / per_word coalesced rows of words; each element's word is addressed
directly (repeated addresses hit L1) and shifted into place. Per format the decode yields either
integer-valued codes ``q`` (ternary c − 1, binary 2b − 1, N:M {-1, 0, +1}, int c − z) that are scaled per
group, or, for the multi-plane binary format, the weight itself from a per-(block, class) table.

When a K tile lies inside one scale group (``ALIGNED``) the scale is applied once per output column after
the reduction — ``Σ_k q·x · s`` (+ ``Σ_k x · μ`` for binary means) — so ``q`` stays exact in fp16/bf16 for
``tl.dot``; otherwise the tile is dequantized per element. All arithmetic after a load is fp32 (the
interpreter's bf16 is unreliable and fp32 accumulation is the contract). Only core builtins are used (see
:mod:`trilm.kernels.jit_common` why), and :func:`trilm.kernels.triton_runtime.kernel_module` reloads this
module when ``TRITON_INTERPRET`` changes, because ``@triton.jit`` picks interpreter or compiler at import.
"""

from __future__ import annotations

import triton
import triton.language as tl
from trilm.kernels.jit_common import (
    FMT_BINARY,
    FMT_INT,
    FMT_LUT,
    FMT_NM,
    FMT_TERNARY,
    INTERPRET,  # noqa: F401 - kernel_module compares it with the interpreter setting
    exact_float,
    reduce_sum,
)


@triton.jit
def _unpack(w_ptr, offs_k, offs_n, mask2, N, BITS: tl.constexpr):
    """Codes of ``BITS`` bits for a (BLOCK_K, BLOCK_N) tile, as int32."""
    words = tl.load(
        w_ptr + (offs_k // (32 // BITS))[:, None] * N + offs_n[None, :],
        mask=mask2,
        other=0,
        eviction_policy="evict_first",
    )
    shift = ((offs_k % (32 // BITS)) * BITS)[:, None]
    return (words >> shift) & ((1 << BITS) - 1)


@triton.jit
def _popcount16(v):
    v = v - ((v >> 1) & 0x5555)
    v = (v & 0x3333) + ((v >> 2) & 0x3333)
    v = (v + (v >> 4)) & 0x0F0F
    return (v + (v >> 8)) & 0x1F


@triton.jit
def _plus_minus_one(cond, DT: tl.constexpr):
    """+1 where cond, −1 elsewhere, in DT (a select, no conversion)."""
    return tl.where(cond, tl.full(cond.shape, 1.0, DT), tl.full(cond.shape, -1.0, DT))


@triton.jit
def _nm_tile(
    mask_ptr, sign_ptr, offs_k, offs_n, mask2, N, NM_N: tl.constexpr, NM_M: tl.constexpr, DT: tl.constexpr
):
    """{-1, 0, +1} from keep-bitmap and sign slots: a kept position's sign is slot popcount(bits below it)."""
    mw = tl.load(
        mask_ptr + (offs_k // 32)[:, None] * N + offs_n[None, :],
        mask=mask2,
        other=0,
        eviction_policy="evict_first",
    )
    pos = (offs_k % 32)[:, None]
    j = (offs_k % NM_M)[:, None]
    kept = (mw >> pos) & 1
    below = (mw >> (pos - j)) & ((1 << j) - 1)
    rank = _popcount16(below)
    slot0 = (offs_k // NM_M) * NM_N
    sw = tl.load(
        sign_ptr + (slot0 // 32)[:, None] * N + offs_n[None, :],
        mask=mask2,
        other=0,
        eviction_policy="evict_first",
    )
    sign = (sw >> ((slot0 % 32)[:, None] + rank)) & 1
    return tl.where(kept != 0, _plus_minus_one(sign != 0, DT), tl.full(kept.shape, 0.0, DT))


@triton.jit
def _q_tile(
    w0,
    w1,
    offs_k,
    offs_n,
    mask2,
    N,
    FMT: tl.constexpr,
    BITS: tl.constexpr,
    NM_N: tl.constexpr,
    NM_M: tl.constexpr,
    DT: tl.constexpr,
):
    """Integer-valued codes in DT before scaling: ternary c − 1, binary 2b − 1, N:M {-1, 0, +1}, int formats
    the raw code (the caller subtracts zeros). Exact in fp16/bf16, so they can feed ``tl.dot`` directly."""
    if FMT == FMT_TERNARY:
        q = exact_float(_unpack(w0, offs_k, offs_n, mask2, N, 2), DT, 1.0)
    elif FMT == FMT_BINARY:
        q = _plus_minus_one(_unpack(w0, offs_k, offs_n, mask2, N, 1) != 0, DT)
    elif FMT == FMT_NM:
        q = _nm_tile(w0, w1, offs_k, offs_n, mask2, N, NM_N, NM_M, DT)
    else:
        if BITS == 3:
            lo = _unpack(w0, offs_k, offs_n, mask2, N, 2)
            hi = _unpack(w1, offs_k, offs_n, mask2, N, 1)
            q = exact_float(lo | (hi << 2), DT, 0.0)
        else:
            q = exact_float(_unpack(w0, offs_k, offs_n, mask2, N, BITS), DT, 0.0)
    return q


@triton.jit
def _lut_tile(
    planes_ptr,
    lut_ptr,
    cls_ptr,
    offs_k,
    offs_n,
    mask_k,
    mask2,
    N,
    PLANE_STRIDE,
    LUT_BLOCK,
    NB: tl.constexpr,
    LUT_C: tl.constexpr,
):
    """Multi-plane binary: bit pattern from NB planes, then lut[block, class, pattern, n]."""
    pos = (offs_k % 32)[:, None]
    base = (offs_k // 32)[:, None] * N + offs_n[None, :]
    pat = (tl.load(planes_ptr + base, mask=mask2, other=0, eviction_policy="evict_first") >> pos) & 1
    for b in tl.static_range(1, NB):
        plane = tl.load(
            planes_ptr + b * PLANE_STRIDE + base, mask=mask2, other=0, eviction_policy="evict_first"
        )
        pat = pat | (((plane >> pos) & 1) << b)
    cls = tl.load(cls_ptr + offs_k, mask=mask_k, other=0).to(tl.int32)
    row = ((offs_k // LUT_BLOCK) * LUT_C + cls) * (1 << NB)
    return tl.load(lut_ptr + (row[:, None] + pat) * N + offs_n[None, :], mask=mask2, other=0.0).to(tl.float32)


@triton.jit
def _group_row(ptr, k0, G, offs_n, mask_row, N):
    """Per-column values (BLOCK_N,) of the group holding input column k0."""
    return tl.load(ptr + (k0 // G) * N + offs_n, mask=mask_row, other=0).to(tl.float32)


@triton.jit
def _group_tile(ptr, offs_k, G, offs_n, mask2, N):
    """Per-element group values for a (BLOCK_K, BLOCK_N) tile."""
    return tl.load(ptr + (offs_k // G)[:, None] * N + offs_n[None, :], mask=mask2, other=0).to(tl.float32)


@triton.jit
def _dequant_tile(
    w0,
    w1,
    s_ptr,
    z_ptr,
    offs_k,
    offs_n,
    mask2,
    N,
    G,
    FMT: tl.constexpr,
    BITS: tl.constexpr,
    HAS_MEAN: tl.constexpr,
    NM_N: tl.constexpr,
    NM_M: tl.constexpr,
):
    """Fully dequantized fp32 tile for affine formats whose groups may change inside the tile."""
    q = _q_tile(w0, w1, offs_k, offs_n, mask2, N, FMT, BITS, NM_N, NM_M, tl.float32)
    if FMT == FMT_INT:
        q = q - _group_tile(z_ptr, offs_k, G, offs_n, mask2, N)
    w = q * _group_tile(s_ptr, offs_k, G, offs_n, mask2, N)
    if HAS_MEAN:
        w = w + _group_tile(z_ptr, offs_k, G, offs_n, mask2, N)
    return w


@triton.jit(do_not_specialize=["M", "stride_xm"])
def gemv_kernel(
    x_ptr,
    y_ptr,
    w0,
    w1,
    s_ptr,
    z_ptr,
    c_ptr,
    M,
    N,
    K,
    stride_xm,
    G,
    PLANE_STRIDE,
    LUT_BLOCK,
    FMT: tl.constexpr,
    BITS: tl.constexpr,
    HAS_MEAN: tl.constexpr,
    NM_N: tl.constexpr,
    NM_M: tl.constexpr,
    NB: tl.constexpr,
    LUT_C: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    K_ITERS: tl.constexpr,
    ALIGNED: tl.constexpr,
):
    """y[m, :] += x[m, k-slice] @ W[:, k-slice]^T: one program per (N block, K split, row); fp32 partials
    are added atomically into y (zeroed by the caller)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    m = tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    acc = tl.full((BLOCK_N,), 0.0, tl.float32)
    for it in tl.static_range(K_ITERS):
        k0 = (pid_k * K_ITERS + it) * BLOCK_K
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < K
        mask2 = mask_k[:, None] & mask_n[None, :]
        x = tl.load(x_ptr + m * stride_xm + offs_k, mask=mask_k, other=0.0, eviction_policy="evict_last")
        x = x.to(tl.float32)
        if FMT == FMT_LUT:
            w = _lut_tile(
                w0, s_ptr, c_ptr, offs_k, offs_n, mask_k, mask2, N, PLANE_STRIDE, LUT_BLOCK, NB, LUT_C
            )
            acc += reduce_sum(w * x[:, None], axis=0)
        elif ALIGNED:
            kg = tl.minimum(
                k0, K - 1
            )  # a tile past K (last split) is all-masked; keep its group lookup in range
            q = _q_tile(w0, w1, offs_k, offs_n, mask2, N, FMT, BITS, NM_N, NM_M, tl.float32)
            if FMT == FMT_INT:
                q = q - _group_row(z_ptr, kg, G, offs_n, mask_n, N)[None, :]
            part = reduce_sum(q * x[:, None], axis=0) * _group_row(s_ptr, kg, G, offs_n, mask_n, N)
            if HAS_MEAN:
                part += reduce_sum(x, axis=0) * _group_row(z_ptr, kg, G, offs_n, mask_n, N)
            acc += part
        else:
            w = _dequant_tile(
                w0, w1, s_ptr, z_ptr, offs_k, offs_n, mask2, N, G, FMT, BITS, HAS_MEAN, NM_N, NM_M
            )
            acc += reduce_sum(w * x[:, None], axis=0)
    tl.atomic_add(y_ptr + m * N + offs_n, acc.to(y_ptr.dtype.element_ty), mask=mask_n, sem="relaxed")


@triton.jit(do_not_specialize=["M", "stride_xm", "MB", "SPLIT_K"])
def gemm_kernel(
    x_ptr,
    y_ptr,
    w0,
    w1,
    s_ptr,
    z_ptr,
    c_ptr,
    M,
    N,
    K,
    stride_xm,
    G,
    PLANE_STRIDE,
    LUT_BLOCK,
    MB,
    SPLIT_K,
    FMT: tl.constexpr,
    BITS: tl.constexpr,
    HAS_MEAN: tl.constexpr,
    NM_N: tl.constexpr,
    NM_M: tl.constexpr,
    NB: tl.constexpr,
    LUT_C: tl.constexpr,
    USE_ATOMIC: tl.constexpr,
    DOT_IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    ALIGNED: tl.constexpr,
):
    """y = x @ W^T with W decoded tile by tile in registers and multiplied with ``tl.dot`` (fp32 accumulator).

    The grid's third axis splits K into SPLIT_K slices whose partials are added atomically (USE_ATOMIC) into
    a zeroed ``y``; with one slice the tile is stored. ``MB`` (the M bucket) only keys the autotuner."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    n_tiles = (K + BLOCK_K - 1) // BLOCK_K
    per_split = (n_tiles + SPLIT_K - 1) // SPLIT_K
    t_start = pid_k * per_split
    t_end = tl.minimum(t_start + per_split, n_tiles)
    acc = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)
    for t in tl.range(t_start, t_end, num_stages=1):
        k0 = t * BLOCK_K
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < K
        mask2 = mask_k[:, None] & mask_n[None, :]
        x = tl.load(
            x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :],
            mask=mask_m[:, None] & mask_k[None, :],
            other=0.0,
            eviction_policy="evict_last",
        )
        if FMT == FMT_LUT:
            w = _lut_tile(
                w0, s_ptr, c_ptr, offs_k, offs_n, mask_k, mask2, N, PLANE_STRIDE, LUT_BLOCK, NB, LUT_C
            )
            if DOT_IEEE:
                acc += tl.dot(x, w, input_precision="ieee")
            else:
                acc += tl.dot(x, w.to(x.dtype))
        elif ALIGNED:
            q = _q_tile(w0, w1, offs_k, offs_n, mask2, N, FMT, BITS, NM_N, NM_M, x.dtype)
            if FMT == FMT_INT:
                q = q - _group_row(z_ptr, k0, G, offs_n, mask_n, N).to(x.dtype)[None, :]
            if DOT_IEEE:
                part = tl.dot(x, q, input_precision="ieee")
            else:
                part = tl.dot(x, q)
            acc += part * _group_row(s_ptr, k0, G, offs_n, mask_n, N)[None, :]
            if HAS_MEAN:
                xsum = reduce_sum(x.to(tl.float32), axis=1)
                acc += xsum[:, None] * _group_row(z_ptr, k0, G, offs_n, mask_n, N)[None, :]
        else:
            w = _dequant_tile(
                w0, w1, s_ptr, z_ptr, offs_k, offs_n, mask2, N, G, FMT, BITS, HAS_MEAN, NM_N, NM_M
            )
            if DOT_IEEE:
                acc += tl.dot(x, w, input_precision="ieee")
            else:
                acc += tl.dot(x, w.to(x.dtype))
    y_ptrs = y_ptr + offs_m[:, None] * N + offs_n[None, :]
    mask_y = mask_m[:, None] & mask_n[None, :]
    if USE_ATOMIC:
        tl.atomic_add(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask_y, sem="relaxed")
    else:
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask_y)


@triton.jit(do_not_specialize=["M", "NNZ", "stride_xm"])
def sparse_add_kernel(
    x_ptr,
    y_ptr,
    rows_ptr,
    cols_ptr,
    q_ptr,
    s8_ptr,
    z8_ptr,
    s_ptr,
    mean_ptr,
    M,
    NNZ,
    N,
    G,
    stride_xm,
    BLOCK: tl.constexpr,
    ROWS: tl.constexpr,
):
    """PB-LLM salient weights: y[m, r] += ((q − z8[r])·s8[r] − (μ − α)[c // G, r]) · x[m, c] per (r, c).

    The dense binary kernel already added μ − α (the binary value of a 0 bit) at salient positions. One
    program handles BLOCK stored weights for ROWS input rows, decoding them once."""
    pid = tl.program_id(0)
    m0 = tl.program_id(1) * ROWS
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < NNZ
    r = tl.load(rows_ptr + offs, mask=mask, other=0)
    c = tl.load(cols_ptr + offs, mask=mask, other=0).to(tl.int32)
    q = tl.load(q_ptr + offs, mask=mask, other=0).to(tl.float32)
    z8 = tl.load(z8_ptr + r, mask=mask, other=0).to(tl.float32)
    salient = (q - z8) * tl.load(s8_ptr + r, mask=mask, other=0).to(tl.float32)
    gidx = (c // G) * N + r
    mean = tl.load(mean_ptr + gidx, mask=mask, other=0).to(tl.float32)
    delta = salient - (mean - tl.load(s_ptr + gidx, mask=mask, other=0).to(tl.float32))
    for i in tl.static_range(ROWS):
        m = m0 + i
        if m < M:
            xv = tl.load(x_ptr + m * stride_xm + c, mask=mask, other=0.0).to(tl.float32)
            tl.atomic_add(y_ptr + m * N + r, delta * xv, mask=mask, sem="relaxed")
