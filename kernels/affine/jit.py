"""Triton kernels for the affine word formats — ternary, binary and int2/3/4 — built to stream weights.

These formats share one value rule, ``w = s · (c − z) (+ μ)`` over an unsigned code ``c`` (ternary z = 1;
binary s·(2b − 1) = 2s·(b − ½); int the stored zero), and one layout: codes packed along K into int32 words
with N contiguous (:mod:`trilm.formats.packing`). The design, each choice made so that a batch-1 GEMV
streams the weights at close to the copy bandwidth:

* **Each word is loaded once, whole, with wide loads.** A program owns a (rows of words × BLOCK_N columns)
  tile; N is the contiguous axis, so a thread loads four neighbouring columns' words in one 128-bit load and
  decodes every code of them from registers (``tl.static_range`` over the codes of a word).
* **Two integer ops and one FMA per weight (GEMV).** The code moves into the top mantissa bits of 1.0 — a
  shift plus one and-or — which *is* the float ``f = 1 + c / 2^bits``, exact; the program accumulates
  ``A = Σ f·x`` and ``X = Σ x``, and since ``Σ c·x = 2^bits·(A − X)`` a scale group's contribution is
  ``s·(2^bits·A − (2^bits + z)·X) (+ μ·X)``: scales, zeros and means are applied once per group and column,
  not per weight.
* **Split-K only as deep as it takes to fill the SMs, in one launch.** With one K split a program stores its
  result in the output dtype. With several, each writes its fp32 partial to a workspace and bumps a per-tile
  counter; the last program of a tile sums the partials in split order (deterministic), writes the output,
  and resets the counter to zero, so the workspace is reusable by the next call or CUDA-graph replay with no
  zeroing kernel, no atomics on the output and no cast kernel.
* **GEMM** (batches of 2 rows and more; tensor cores) decodes a (BLOCK_K × BLOCK_N) tile of exact small
  integers in registers (magic-number conversion into the dot dtype: fp16/bf16 on a GPU) that ``tl.dot``
  consumes; the group's scale and zero are applied to the fp32 product. Decode batches (≤ 16 rows) run as
  one 16-row block, Marlin's shape, so a step of 16 sequences reads each word once, as one of 1 does.
  ``num_stages`` ≥ 2 pipelines the word and activation loads.

Act-order int weights gather their activations inside the kernel (``x[perm[k]]``), so no extra launch.
All arithmetic after a load is fp32 except the dot operands and the GEMV's fp16 pairs (a plan with
``"PAIRS": True``: two codes per packed instruction, :func:`_pair_tile`). Only core builtins are used (see
:mod:`trilm.kernels.jit_common` why), and :func:`trilm.kernels.triton_runtime.kernel_module` reloads this
module when ``TRITON_INTERPRET`` changes.
"""

from __future__ import annotations

import triton
import triton.language as tl
from trilm.kernels.jit_common import (
    FMT_BINARY,
    FMT_TERNARY,
    INTERPRET,
    exact_float,
    reduce_sum,
)

PAIR_ASM = tl.constexpr(not INTERPRET)
"""The pair decode's and-or and packed FMAs are inline PTX on a GPU; the interpreter, which cannot run PTX,
does the same arithmetic in Triton, half by half."""
LOP_MASKS = tl.constexpr(
    tuple(f"0x{((((1 << (i // 16)) - 1) << (i % 16)) * 0x10001) & 0xFFFFFFFF:08X}" for i in range(80))
)
"""``LOP_MASKS[16·bits + p]``: the mask of a ``bits``-bit code at bit p of both 16-bit halves, as the
immediate of the and-or (so that the magic number, the same for every code, is the register operand)."""


@triton.jit
def _move(w, FROM: tl.constexpr, TO: tl.constexpr):
    """Shift int32 words so that bit FROM lands on bit TO (bits that leave the word are masked by callers)."""
    if TO >= FROM:
        out = w << (TO - FROM)
    else:
        out = w >> (FROM - TO)
    return out


@triton.jit
def _unit_float(lo, hi, J: tl.constexpr, H: tl.constexpr, WBITS: tl.constexpr, BITS: tl.constexpr):
    """``1 + c / 2^BITS`` in fp32 for code J of every word: the code sits in the top BITS mantissa bits of
    1.0 (for 3-bit codes the low 2 bits come from ``lo`` and the high bit, bit H·16 + J, from ``hi``)."""
    TOP: tl.constexpr = 23 - BITS
    if BITS == 3:
        v = (_move(lo, J * 2, TOP) & (3 << TOP)) | (_move(hi, H * 16 + J, 22) & (1 << 22))
    else:
        v = _move(lo, J * WBITS, TOP) & (((1 << BITS) - 1) << TOP)
    return (v | 0x3F800000).to(tl.float32, bitcast=True)


@triton.jit
def _affine_terms(
    s_ptr, z_ptr, mu_ptr, rows, offs_n, mask, N, FMT: tl.constexpr, BITS: tl.constexpr, HAS_MEAN: tl.constexpr
):
    """Per (group row, column): the multipliers of A and X in ``s·(P·A − (P + z)·X) + μ·X``, P = 2^BITS."""
    P: tl.constexpr = 1 << BITS
    ptrs = rows * N + offs_n
    s = tl.load(s_ptr + ptrs, mask=mask, other=0.0).to(tl.float32)
    if FMT == FMT_TERNARY:
        z = 1.0
    elif FMT == FMT_BINARY:
        s = s * 2.0
        z = 0.5
    else:
        z = tl.load(z_ptr + ptrs, mask=mask, other=0).to(tl.float32)
    coef_a = s * P
    coef_x = -s * (P + z)
    if HAS_MEAN:
        coef_x += tl.load(mu_ptr + ptrs, mask=mask, other=0.0).to(tl.float32)
    return coef_a, coef_x


@triton.jit
def _pair_terms(
    s_ptr, z_ptr, mu_ptr, rows, offs_n, mask, N, FMT: tl.constexpr, QOFF: tl.constexpr, EXP: tl.constexpr,
    HAS_MEAN: tl.constexpr,
):  # fmt: skip
    """Per (group row, column): the multipliers of ``A = Σ q·x`` and ``X = Σ x`` for the pair decode, whose
    ``q = (c − QOFF)·2^-EXP``: ``w·x`` sums to ``s·2^EXP·A`` (ternary, QOFF = 1), ``2s·2^EXP·A − s·X``
    (binary ``s·(2b − 1)``, QOFF = 0: ``2b − 1`` scaled to fp16 needs 12 significant bits), and
    ``s·2^EXP·A − s·(z − QOFF)·X`` (int), plus ``μ·X`` with means."""
    ptrs = rows * N + offs_n
    s = tl.load(s_ptr + ptrs, mask=mask, other=0.0).to(tl.float32)
    coef_a = s * (1 << EXP)
    if FMT == FMT_TERNARY:
        coef_x = s * 0.0
    elif FMT == FMT_BINARY:
        coef_a = coef_a * 2.0
        coef_x = -s
    else:
        coef_x = -s * (tl.load(z_ptr + ptrs, mask=mask, other=0).to(tl.float32) - QOFF)
    if HAS_MEAN:
        coef_x += tl.load(mu_ptr + ptrs, mask=mask, other=0.0).to(tl.float32)
    return coef_a, coef_x


@triton.jit
def _finish(
    part, y_ptr, b_ptr, ws_ptr, cnt_ptr, offs_m, offs_n, M, N, tile, pid_k,
    SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
):  # fmt: skip
    """Write a (BM, BN) fp32 result: directly, or through the workspace when K is split (see module doc)."""
    y_offs = offs_m[:, None] * N + offs_n[None, :]
    mask_y = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    if SPLIT_K == 1:
        if HAS_BIAS:
            part += tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptr + y_offs, part.to(y_ptr.dtype.element_ty), mask=mask_y)
    else:
        tl.store(ws_ptr + pid_k * M * N + y_offs, part, mask=mask_y)
        tl.debug_barrier()
        arrived = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT_K - 1:
            tl.debug_barrier()
            total = tl.full((BM, BN), 0.0, tl.float32)
            for sk in tl.static_range(SPLIT_K):
                total += tl.load(ws_ptr + sk * M * N + y_offs, mask=mask_y, other=0.0, cache_modifier=".cg")
            if HAS_BIAS:
                total += tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
            tl.store(y_ptr + y_offs, total.to(y_ptr.dtype.element_ty), mask=mask_y)
            tl.atomic_xchg(cnt_ptr + tile, 0, sem="relaxed", scope="gpu")


@triton.jit
def _pair_bits(lo, hi):
    """The bits of two fp16/bf16 tensors as one int32 tensor, ``lo`` in the low half (an fp16x2 register)."""
    lo_bits = lo.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    return lo_bits | (hi.to(tl.int16, bitcast=True).to(tl.int32) << 16)


@triton.jit
def _half(v, H: tl.constexpr, PAIR_DTYPE: tl.constexpr):
    """Half H (0 low, 1 high) of int32 registers as PAIR_DTYPE values."""
    if H == 1:
        v = v >> 16
    return v.to(tl.int16).to(PAIR_DTYPE, bitcast=True)


@triton.jit
def _bf16_as_fp32(v, H: tl.constexpr):
    """Half H of int32 registers, read as bf16, widened exactly to fp32."""
    if H == 1:
        v = v >> 16
    return ((v & 0xFFFF) << 16).to(tl.float32, bitcast=True)


@triton.jit
def _bf16_bits(f):
    """fp32 → bf16 bits (in the low 16 bits of an int32), rounded to nearest even (finite values)."""
    b = f.to(tl.int32, bitcast=True)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF


@triton.jit
def _fma_pairs(t, xp, acc, scale, neg_bias, PAIR_DTYPE: tl.constexpr):
    """``acc + (t·scale − bias)·x`` on registers holding two fp16 (bf16) values each: two packed FMAs, the
    decode and the product, on the pairs the words hold (left to itself LLVM pairs neighbouring columns,
    which costs a byte permute per pair). The interpreter, which cannot run PTX, does the same arithmetic
    half by half."""
    if not PAIR_ASM and PAIR_DTYPE == tl.float16:  # noqa: SIM300 - a constexpr on the left compares by value
        q_lo = _half(t, 0, PAIR_DTYPE) * _half(scale, 0, PAIR_DTYPE) + _half(neg_bias, 0, PAIR_DTYPE)
        q_hi = _half(t, 1, PAIR_DTYPE) * _half(scale, 1, PAIR_DTYPE) + _half(neg_bias, 1, PAIR_DTYPE)
        lo = q_lo * _half(xp, 0, PAIR_DTYPE) + _half(acc, 0, PAIR_DTYPE)
        hi = q_hi * _half(xp, 1, PAIR_DTYPE) + _half(acc, 1, PAIR_DTYPE)
        out = _pair_bits(lo, hi)
    elif not PAIR_ASM:
        # the interpreter's bf16 arithmetic and fp32 → bf16 rounding are wrong: fp32 arithmetic (a product of
        # two bf16 values is exact in it) rounded to bf16 by hand, round to nearest even
        out = 0
        for h in tl.static_range(2):
            q = _bf16_as_fp32(t, h) * _bf16_as_fp32(scale, h) + _bf16_as_fp32(neg_bias, h)
            q = _bf16_as_fp32(_bf16_bits(q), 0)
            out = out | (_bf16_bits(q * _bf16_as_fp32(xp, h) + _bf16_as_fp32(acc, h)) << (16 * h))
    elif PAIR_DTYPE == tl.float16:  # noqa: SIM300 - a constexpr on the left compares by value
        out = tl.inline_asm_elementwise(
            "{ .reg .b32 q; fma.rn.f16x2 q, $1, $4, $5; fma.rn.f16x2 $0, q, $2, $3; }",
            "=r,r,r,r,r,r", [t, xp, acc, scale, neg_bias], dtype=tl.int32, is_pure=True, pack=1,
        )  # fmt: skip
    else:
        out = tl.inline_asm_elementwise(
            "{ .reg .b32 q; fma.rn.bf16x2 q, $1, $4, $5; fma.rn.bf16x2 $0, q, $2, $3; }",
            "=r,r,r,r,r,r", [t, xp, acc, scale, neg_bias], dtype=tl.int32, is_pure=True, pack=1,
        )  # fmt: skip
    return out


@triton.jit
def _pair_tile(
    a_acc, x_acc, w_ptr, w_offs, mask3, x_ptr, perm_ptr, offs_m, mask_m, offs_u, mask_u, stride_xm, K,
    WBITS: tl.constexpr, QOFF: tl.constexpr, EXP: tl.constexpr,
    PAIR_DTYPE: tl.constexpr, HAS_PERM: tl.constexpr, K_TAIL: tl.constexpr, NEED_X: tl.constexpr,
    FLUSH: tl.constexpr, FRESH: tl.constexpr, BM: tl.constexpr, BLOCK_R: tl.constexpr,
):  # fmt: skip
    """``Σ_k q·x`` over one tile of words (1, BLOCK_R, BLOCK_N) with ``q = (c − QOFF)·2^-EXP``, two codes per
    32-bit instruction. Code j of a word sits in its low 16 bits and code j + PER/2 in its high 16 bits; one
    and-or (after one shift per mantissa's worth of codes) puts both into the mantissas of a pair of
    PAIR_DTYPE values ``MAGIC + c·2^p``, one packed FMA turns the pair into exact ``q``, one more multiplies
    it by the pair (x_j, x_{j+PER/2}) into the pair of accumulators: three instructions per two weights.
    Returns ``a_acc`` plus the tile's sums in fp32 (each pair accumulator holds FLUSH products before it is
    added there; FRESH: ``a_acc`` is zero and not read) and ``x_acc`` plus ``Σ x`` (with NEED_X)."""
    PER: tl.constexpr = 32 // WBITS
    HALF: tl.constexpr = PER // 2
    if PAIR_DTYPE == tl.float16:  # noqa: SIM300 - a constexpr on the left compares by value
        MAGIC = 0x6400
        MAGIC_F = 1024.0
    else:
        MAGIC = 0x4300
        MAGIC_F = 128.0
    # bits of a 16-bit half that one shift brings into the mantissa (10 in fp16, 7 in bf16), whole codes
    SPAN: tl.constexpr = ((10 if PAIR_DTYPE == tl.float16 else 7) // WBITS) * WBITS  # noqa: SIM300
    X_WORDS: tl.constexpr = not (HAS_PERM or K_TAIL or NEED_X) and BM == 1
    lo = tl.load(w_ptr + w_offs, mask=mask3, other=0, eviction_policy="evict_first")
    acc = tl.full((BM, BLOCK_R, lo.shape[2]), 0, tl.int32)
    for j in tl.static_range(HALF):
        shift = (j * WBITS // SPAN) * SPAN
        pos = j * WBITS - shift
        if PAIR_ASM:
            # (word & mask) | magic with the mask as the immediate: left to ptxas, the magic number takes the
            # immediate and every mask is re-materialized by a move per use (0.4 instructions per weight)
            t = tl.inline_asm_elementwise(
                "lop3.b32 $0, $1, "
                + LOP_MASKS[16 * WBITS + j * WBITS - (j * WBITS // SPAN) * SPAN]  # pos (a constexpr here)
                + ", $2, 0xEA;",
                "=r,r,r", [lo >> shift, tl.full(lo.shape, MAGIC * 0x10001, tl.int32)],
                dtype=tl.int32, is_pure=True, pack=1,
            )  # fmt: skip
        else:
            t = ((lo >> shift) & ((((1 << WBITS) - 1) << pos) * 0x10001)) | (MAGIC * 0x10001)
        scale = tl.full((1, 1, 1), 1.0 / (1 << (pos + EXP)), PAIR_DTYPE)
        neg_bias = tl.full((1, 1, 1), -(MAGIC_F / (1 << (pos + EXP)) + QOFF / (1 << EXP)), PAIR_DTYPE)
        if X_WORDS:
            # (x_j, x_{j+HALF}) from two 32-bit loads of (x_{2i}, x_{2i+1}): one byte permute per pair
            x32 = x_ptr.to(tl.pointer_type(tl.int32), bitcast=True) + (offs_u * PER + j - j % 2) // 2
            w_lo = tl.load(x32, mask=mask_u, other=0)[None, :]
            w_hi = tl.load(x32 + HALF // 2, mask=mask_u, other=0)[None, :]
            if j % 2 == 0:
                xp = (w_lo & 0xFFFF) | (w_hi << 16)
            else:
                xp = ((w_lo >> 16) & 0xFFFF) | (w_hi & -65536)
        else:
            k_lo = offs_u * PER + j
            k_hi = k_lo + HALF
            mask_lo = mask_u
            mask_hi = mask_u
            if K_TAIL:
                mask_lo = mask_u & (k_lo < K)
                mask_hi = mask_u & (k_hi < K)
            if HAS_PERM:
                k_lo = tl.load(perm_ptr + k_lo, mask=mask_lo, other=0)
                k_hi = tl.load(perm_ptr + k_hi, mask=mask_hi, other=0)
            x_rows = x_ptr + offs_m[:, None] * stride_xm
            x_lo = tl.load(x_rows + k_lo[None, :], mask=mask_m[:, None] & mask_lo[None, :], other=0.0)
            x_hi = tl.load(x_rows + k_hi[None, :], mask=mask_m[:, None] & mask_hi[None, :], other=0.0)
            xp = _pair_bits(x_lo, x_hi)
            if NEED_X:
                x_acc += x_lo.to(tl.float32) + x_hi.to(tl.float32)
        acc = _fma_pairs(
            t, xp[:, :, None], acc, _pair_bits(scale, scale), _pair_bits(neg_bias, neg_bias), PAIR_DTYPE
        )
        if (j + 1) % FLUSH == 0 or j == HALF - 1:
            part = _half(acc, 0, PAIR_DTYPE).to(tl.float32) + _half(acc, 1, PAIR_DTYPE).to(tl.float32)
            if FRESH and j < FLUSH:
                a_acc = part  # adding it to zeros would cost an add per flush
            else:
                a_acc += part
            acc = tl.full((BM, BLOCK_R, lo.shape[2]), 0, tl.int32)
    return a_acc, x_acc


@triton.jit
def _unit_tile(
    a_acc, x_acc, w_ptr, hi_ptr, w_offs, mask3, x_ptr, perm_ptr, offs_m, mask_m, offs_u, mask_u, offs_n,
    stride_xm, N, K, BITS: tl.constexpr, WBITS: tl.constexpr, HS: tl.constexpr, HAS_PERM: tl.constexpr,
    K_TAIL: tl.constexpr,
):  # fmt: skip
    """``a_acc + Σ f·x`` and ``x_acc + Σ x`` over one tile of units, one code per instruction in fp32:
    ``f = 1 + c/2^BITS`` (:func:`_unit_float`)."""
    PER: tl.constexpr = 32 // WBITS
    if HS == 2:
        hi = tl.load(hi_ptr + offs_u[None, :, None] * N + offs_n[None, None, :], mask=mask3, other=0)
    else:
        hi = 0
    for h in tl.static_range(HS):
        lo = tl.load(w_ptr + w_offs + h * N, mask=mask3, other=0, eviction_policy="evict_first")
        for j in tl.static_range(PER):
            k = (offs_u * HS + h) * PER + j
            if K_TAIL:
                mask_k = mask_u & (k < K)
            else:
                mask_k = mask_u
            if HAS_PERM:
                k = tl.load(perm_ptr + k, mask=mask_k, other=0)
            xj = tl.load(
                x_ptr + offs_m[:, None] * stride_xm + k[None, :],
                mask=mask_m[:, None] & mask_k[None, :],
                other=0.0,
            ).to(tl.float32)
            a_acc += _unit_float(lo, hi, j, h, WBITS, BITS) * xj[:, :, None]
            x_acc += xj
    return a_acc, x_acc


@triton.jit
def _terms(
    s_ptr, z_ptr, mu_ptr, rows, offs_n, mask, N, FMT: tl.constexpr, BITS: tl.constexpr, QOFF: tl.constexpr,
    EXP: tl.constexpr, HAS_MEAN: tl.constexpr, PAIRS: tl.constexpr,
):  # fmt: skip
    """The multipliers of a tile's two sums for the decode that made them (:func:`_pair_terms` or
    :func:`_affine_terms`)."""
    if PAIRS:
        coef_a, coef_x = _pair_terms(s_ptr, z_ptr, mu_ptr, rows, offs_n, mask, N, FMT, QOFF, EXP, HAS_MEAN)
    else:
        coef_a, coef_x = _affine_terms(s_ptr, z_ptr, mu_ptr, rows, offs_n, mask, N, FMT, BITS, HAS_MEAN)
    return coef_a, coef_x


@triton.jit(do_not_specialize=["M", "stride_xm", "UNITS_PER_SPLIT"])
def affine_gemv_kernel(
    x_ptr, y_ptr, w_ptr, hi_ptr, s_ptr, z_ptr, mu_ptr, perm_ptr, b_ptr, ws_ptr, cnt_ptr,
    M, N, K, stride_xm, G, UNITS_PER_SPLIT,
    FMT: tl.constexpr, BITS: tl.constexpr, WBITS: tl.constexpr, HS: tl.constexpr,
    HAS_MEAN: tl.constexpr, HAS_PERM: tl.constexpr, HAS_BIAS: tl.constexpr, SCALE_ONCE: tl.constexpr,
    K_TAIL: tl.constexpr, SPLIT_K: tl.constexpr, BM: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr, NUM_STAGES: tl.constexpr, PAIR_DTYPE: tl.constexpr,
):  # fmt: skip
    """y[:M] = x[:M] @ W^T for M ≤ BM rows, reading every packed word of W once.

    Grid (N / BLOCK_N, SPLIT_K). A *unit* is HS rows of words (HS = 2 pairs 3-bit codes' low-bit rows with
    one high-bit row); a program walks UNITS_PER_SPLIT units in tiles of BLOCK_R. With SCALE_ONCE (one scale
    group spans K) A and X are folded once at the end, else once per tile with each unit's group row (the
    caller guarantees a unit never straddles a group). PAIR_DTYPE fp16/bf16 (one row of words per unit:
    ternary, binary, int2, int4) decodes two codes per instruction in that dtype (:func:`_pair_tile`); fp32
    decodes one code per instruction into fp32."""
    PAIRS: tl.constexpr = PAIR_DTYPE != tl.float32  # noqa: SIM300 - a constexpr on the left compares by value
    if FMT == FMT_TERNARY:
        QOFF = 1
        QMAX_LOG = 0
    elif FMT == FMT_BINARY:
        QOFF = 0
        QMAX_LOG = 0
    else:
        QOFF = 1 << (BITS - 1)
        QMAX_LOG = BITS - 1
    # a pair accumulator takes FLUSH products before it is added in fp32: a word's PER/2 for 2- and 4-bit
    # codes, half of binary's 16 (16 sums of bf16's 8-bit significands came close to the bf16 tolerance);
    # of |q·x| ≤ 2^QMAX_LOG·|x| each, so scaling q by 2^-EXP keeps every fp16 partial sum finite for any
    # finite fp16 x (bf16 has fp32's range)
    FLUSH: tl.constexpr = 8
    if PAIR_DTYPE == tl.float16:  # noqa: SIM300 - a constexpr on the left compares by value
        EXP = min(4 - WBITS // 2, 3) + QMAX_LOG
    else:
        EXP = 0
    NEED_X: tl.constexpr = HAS_MEAN or FMT != FMT_TERNARY
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    PER: tl.constexpr = 32 // WBITS
    UNIT_K: tl.constexpr = PER * HS
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    offs_m = tl.arange(0, BM)
    mask_m = offs_m < M
    n_units = (K + UNIT_K - 1) // UNIT_K
    u_start = pid_k * UNITS_PER_SPLIT
    u_end = tl.minimum(u_start + UNITS_PER_SPLIT, n_units)
    a_acc = tl.full((BM, BLOCK_R, BLOCK_N), 0.0, tl.float32)
    x_acc = tl.full((BM, BLOCK_R), 0.0, tl.float32)
    y_acc = tl.full((BM, BLOCK_R, BLOCK_N), 0.0, tl.float32)
    for u0 in tl.range(u_start, u_end, BLOCK_R, num_stages=NUM_STAGES):
        offs_u = u0 + tl.arange(0, BLOCK_R)
        mask_u = offs_u < u_end
        # words are loaded as (1, BLOCK_R, BLOCK_N) so that the 3-D products below keep the load's layout
        # (four neighbouring columns per thread, one 128-bit load) with all BM batch rows in each thread
        w_offs = offs_u[None, :, None] * (HS * N) + offs_n[None, None, :]
        mask3 = mask_u[None, :, None] & mask_n[None, None, :]
        if SCALE_ONCE:
            a_in, x_in = a_acc, x_acc
        else:
            a_in = tl.full((BM, BLOCK_R, BLOCK_N), 0.0, tl.float32)
            x_in = tl.full((BM, BLOCK_R), 0.0, tl.float32)
        if PAIRS:
            a_t, x_t = _pair_tile(
                a_in, x_in, w_ptr, w_offs, mask3, x_ptr, perm_ptr, offs_m, mask_m, offs_u, mask_u,
                stride_xm, K, WBITS, QOFF, EXP, PAIR_DTYPE, HAS_PERM, K_TAIL, NEED_X, FLUSH,
                not SCALE_ONCE, BM, BLOCK_R,
            )  # fmt: skip
        else:
            a_t, x_t = _unit_tile(
                a_in, x_in, w_ptr, hi_ptr, w_offs, mask3, x_ptr, perm_ptr, offs_m, mask_m, offs_u, mask_u,
                offs_n, stride_xm, N, K, BITS, WBITS, HS, HAS_PERM, K_TAIL,
            )  # fmt: skip
        if SCALE_ONCE:
            a_acc, x_acc = a_t, x_t
        else:
            group = (offs_u * UNIT_K) // G
            coef_a, coef_x = _terms(
                s_ptr, z_ptr, mu_ptr, group[None, :, None], offs_n[None, None, :], mask3, N,
                FMT, BITS, QOFF, EXP, HAS_MEAN, PAIRS,
            )  # fmt: skip
            y_acc += coef_a * a_t + coef_x * x_t[:, :, None]
    if SCALE_ONCE:
        coef_a, coef_x = _terms(
            s_ptr, z_ptr, mu_ptr, 0, offs_n, mask_n, N, FMT, BITS, QOFF, EXP, HAS_MEAN, PAIRS
        )
        part = coef_a[None, :] * reduce_sum(a_acc, 1) + coef_x[None, :] * reduce_sum(x_acc, 1)[:, None]
    else:
        part = reduce_sum(y_acc, 1)
    _finish(
        part,
        y_ptr,
        b_ptr,
        ws_ptr,
        cnt_ptr,
        offs_m,
        offs_n,
        M,
        N,
        pid_n,
        pid_k,
        SPLIT_K,
        HAS_BIAS,
        BM,
        BLOCK_N,
    )


@triton.jit
def _code_tile(
    w_ptr, hi_ptr, k0, offs_n, mask_n, N, K,
    WBITS: tl.constexpr, HS: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """Unsigned codes (BLOCK_K, BLOCK_N) of K rows k0.. as int32, each word loaded once and expanded."""
    PER: tl.constexpr = 32 // WBITS
    offs_k = k0 + tl.arange(0, BLOCK_K)
    mask = (offs_k < K)[:, None] & mask_n[None, :]
    rows = k0 // PER + tl.arange(0, BLOCK_K // PER)
    rmask = (rows < (K + PER - 1) // PER)[:, None] & mask_n[None, :]
    words = tl.load(
        w_ptr + rows[:, None] * N + offs_n[None, :], mask=rmask, other=0, eviction_policy="evict_first"
    )
    shifts = tl.arange(0, PER) * WBITS
    codes = (words[:, None, :] >> shifts[None, :, None]) & ((1 << WBITS) - 1)
    codes = tl.reshape(codes, (BLOCK_K, BLOCK_N))
    if HS == 2:
        hw = tl.load(hi_ptr + (offs_k // 32)[:, None] * N + offs_n[None, :], mask=mask, other=0)
        codes = codes | (((hw >> (offs_k % 32)[:, None]) & 1) << 2)
    return codes


@triton.jit(do_not_specialize=["M", "stride_xm", "TILES_PER_SPLIT"])
def affine_gemm_kernel(
    x_ptr, y_ptr, w_ptr, hi_ptr, s_ptr, z_ptr, mu_ptr, perm_ptr, b_ptr, ws_ptr, cnt_ptr,
    M, N, K, stride_xm, G, TILES_PER_SPLIT,
    FMT: tl.constexpr, BITS: tl.constexpr, WBITS: tl.constexpr, HS: tl.constexpr,
    HAS_MEAN: tl.constexpr, HAS_PERM: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr,
    DOT_DTYPE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """y = x @ W^T by (BLOCK_M × BLOCK_N) tiles on tensor cores: each K tile's codes are decoded once, in
    registers, into the exact small integers c − z (ternary c − 1, binary 2b − 1) of DOT_DTYPE that feed
    ``tl.dot`` with the activations cast to the same dtype; the caller picks BLOCK_K inside one scale group,
    whose scale multiplies the fp32 product once (``s·Σ q·x``, plus ``μ·Σ x`` for binary means).
    DOT_DTYPE is fp16/bf16 on a GPU (mma/wgmma) and fp32 under the interpreter, whose ``tl.dot`` takes fp32
    (an fp32 dot runs in IEEE precision, never tf32). Decode batches take BLOCK_M = 16, Marlin's shape: rows
    past M are masked to zero, not copied. Grid (M / BLOCK_M, N / BLOCK_N, SPLIT_K)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    n_tiles = (K + BLOCK_K - 1) // BLOCK_K
    t_start = pid_k * TILES_PER_SPLIT
    t_end = tl.minimum(t_start + TILES_PER_SPLIT, n_tiles)
    acc = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)
    for t in range(t_start, t_end):
        k0 = t * BLOCK_K
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < K
        if HAS_PERM:
            kx = tl.load(perm_ptr + offs_k, mask=mask_k, other=0)
        else:
            kx = offs_k
        x = tl.load(
            x_ptr + offs_m[:, None] * stride_xm + kx[None, :],
            mask=mask_m[:, None] & mask_k[None, :],
            other=0.0,
        ).to(DOT_DTYPE)
        codes = _code_tile(w_ptr, hi_ptr, k0, offs_n, mask_n, N, K, WBITS, HS, BLOCK_K, BLOCK_N)
        g = k0 // G
        if FMT == FMT_TERNARY:
            q = exact_float(codes, DOT_DTYPE, 1.0)  # c − 1
        elif FMT == FMT_BINARY:
            q = exact_float(codes << 1, DOT_DTYPE, 1.0)  # 2b − 1
        else:
            zero = tl.load(z_ptr + g * N + offs_n, mask=mask_n, other=0).to(DOT_DTYPE)
            q = exact_float(codes, DOT_DTYPE, 0.0) - zero[None, :]  # c − z, exact in fp16/bf16 (|c − z| ≤ 16)
        if DOT_DTYPE == tl.float32:  # noqa: SIM300 - a constexpr on the left compares by value
            part = tl.dot(x, q, input_precision="ieee")
        else:
            part = tl.dot(x, q)
        scale = tl.load(s_ptr + g * N + offs_n, mask=mask_n, other=0.0).to(tl.float32)
        acc += scale[None, :] * part
        if HAS_MEAN:
            mean = tl.load(mu_ptr + g * N + offs_n, mask=mask_n, other=0.0).to(tl.float32)
            acc += reduce_sum(x.to(tl.float32), 1)[:, None] * mean[None, :]
    tile = pid_m * tl.num_programs(1) + pid_n
    _finish(
        acc,
        y_ptr,
        b_ptr,
        ws_ptr,
        cnt_ptr,
        offs_m,
        offs_n,
        M,
        N,
        tile,
        pid_k,
        SPLIT_K,
        HAS_BIAS,
        BLOCK_M,
        BLOCK_N,
    )


@triton.jit
def affine_dequant_kernel(
    out_ptr, w_ptr, hi_ptr, s_ptr, z_ptr, mu_ptr, perm_ptr, N, K, G,
    FMT: tl.constexpr, BITS: tl.constexpr, WBITS: tl.constexpr, HS: tl.constexpr,
    HAS_MEAN: tl.constexpr, HAS_PERM: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """W^T (K, N) in out's dtype, for the large-batch path that hands the product to cuBLAS; act-order rows
    are scattered to their original input column, so ``x @ out`` needs no gathered x."""
    pid_k = tl.program_id(0)
    pid_n = tl.program_id(1)
    k0 = pid_k * BLOCK_K
    offs_k = k0 + tl.arange(0, BLOCK_K)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    mask2 = (offs_k < K)[:, None] & mask_n[None, :]
    codes = _code_tile(w_ptr, hi_ptr, k0, offs_n, mask_n, N, K, WBITS, HS, BLOCK_K, BLOCK_N).to(tl.float32)
    coef_a, coef_x = _affine_terms(
        s_ptr, z_ptr, mu_ptr, (offs_k // G)[:, None], offs_n[None, :], mask2, N, FMT, BITS, HAS_MEAN
    )
    scale = coef_a * (1.0 / (1 << BITS))
    w = scale * codes + (coef_x + coef_a)
    if HAS_PERM:
        rows = tl.load(perm_ptr + offs_k, mask=offs_k < K, other=0)
    else:
        rows = offs_k
    tl.store(out_ptr + rows[:, None] * N + offs_n[None, :], w.to(out_ptr.dtype.element_ty), mask=mask2)
