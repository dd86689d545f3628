"""The general Triton kernels: every format's decode, zero + kernel + cast per call, autotuned on a GPU.

N:M binary, multi-plane binary and PB-LLM weights run here (ternary, binary and int weights run on the
affine kernels of :mod:`trilm.kernels.affine`, unless :func:`trilm.kernels.dispatch.prepare` is asked for the
general baseline). :class:`KernelWeight` is the argument set, built from any format's ``decode_args()``
without looking at its class. Under the CPU interpreter (``TRITON_INTERPRET=1``), which cannot autotune,
fixed large-block configs are used.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Any

import torch
import triton
import triton.testing
from trilm.kernels.triton_runtime import interpreting, kernel_module, on_reload, sm_count

from trilm.formats import DecodeArgs, KernelId

if TYPE_CHECKING:
    from trilm.kernels.affine.plan import AffineSpec

KERNELS = "trilm.kernels.general.jit"
GENERAL_GEMV_MAX_M = 4
"""The general GEMV runs one program row per input row; above this the general GEMM is used."""


# -- prepared arguments --------------------------------------------------------------------------------
@dataclasses.dataclass
class KernelWeight:
    """Everything a launch needs for one packed weight, in kernel layout (built once per layer and device).

    ``affine`` holds the same weight in the affine kernels' form when it has one
    (:func:`trilm.kernels.dispatch. prepare`); the general kernels read the rest."""

    n: int
    k: int
    fmt: int
    w0: torch.Tensor
    w1: torch.Tensor
    s: torch.Tensor
    z: torch.Tensor
    c: torch.Tensor
    group_size: int
    bits: int = 2
    has_mean: bool = False
    nm_n: int = 1
    nm_m: int = 2
    nb: int = 1
    lut_c: int = 1
    lut_block: int = 1
    plane_stride: int = 0
    perm: torch.Tensor | None = None
    sparse: tuple[torch.Tensor, ...] | None = None
    affine: AffineSpec | None = None

    @classmethod
    def from_args(cls, a: DecodeArgs) -> KernelWeight:
        """The general kernels' roles: ``w0``/``w1`` the code planes, ``s`` the scale (or decode) table,
        ``z`` the zeros, else the means, else the scales again; ``c`` per-column ids, else the codes."""
        offsets = a.zeros if a.zeros is not None else (a.means if a.means is not None else a.scales)
        lut = a.kernel == KernelId.LUT
        return cls(
            a.n,
            a.k,
            int(a.kernel),
            a.words,
            a.words_hi if a.words_hi is not None else a.words,
            a.scales,
            offsets,
            a.column_ids if a.column_ids is not None else a.words,
            a.group_size,
            bits=a.bits,
            has_mean=a.means is not None,
            nm_n=a.nm_n,
            nm_m=a.nm_m,
            nb=a.lut_bits,
            lut_c=a.lut_classes,
            lut_block=a.group_size if lut else 1,
            plane_stride=a.words.shape[1] * a.words.shape[2] if lut else 0,
            perm=a.perm,
            sparse=a.sparse,
        )

    def constexprs(self) -> dict[str, Any]:
        return {
            "FMT": self.fmt,
            "BITS": self.bits,
            "HAS_MEAN": self.has_mean,
            "NM_N": self.nm_n,
            "NM_M": self.nm_m,
            "NB": self.nb,
            "LUT_C": self.lut_c,
        }


# -- configs -------------------------------------------------------------------------------------------------
GENERAL_INTERP_GEMV = {"BLOCK_N": 128, "BLOCK_K": 128, "K_ITERS": 2, "num_warps": 4}
GENERAL_INTERP_GEMM = {"BLOCK_N": 128, "BLOCK_K": 128, "SPLIT_K": 1, "num_warps": 4}
"""Interpreter configs: large blocks, because the interpreter's cost is per program and loop iteration."""

GPU_GEMV = [
    {"BLOCK_N": 256, "BLOCK_K": 16, "K_ITERS": 2, "num_warps": 2},
    {"BLOCK_N": 128, "BLOCK_K": 32, "K_ITERS": 2, "num_warps": 2},
    {"BLOCK_N": 512, "BLOCK_K": 16, "K_ITERS": 2, "num_warps": 4},
    {"BLOCK_N": 128, "BLOCK_K": 16, "K_ITERS": 2, "num_warps": 1},
]
GPU_GEMM = [
    {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "num_warps": 4},
    {"BLOCK_M": 16, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 4},
    {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 64, "num_warps": 4},
    {"BLOCK_M": 32, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 8},
    {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "num_warps": 4},
    {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 8},
    {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32, "num_warps": 8},
]
"""GPU autotune spaces: GEMV after gemlite's reverse split-K shape (small K tiles, wide N, 2–4 warps); GEMM
pruned to the configs whose BLOCK_M matches the batch's M bucket."""


def m_bucket(m: int) -> int:
    """16, 32, 64 or 128: the GEMM BLOCK_M class a batch of ``m`` rows falls in."""
    for b in (16, 32, 64):
        if m <= b:
            return b
    return 128


def _aligned(args: dict[str, Any]) -> bool:
    """Scales are constant inside every K tile: g is a multiple of BLOCK_K, or one group spans K."""
    return args["G"] % args["BLOCK_K"] == 0 or args["G"] >= args["K"]


def _split(cfg: dict[str, Any]) -> tuple[dict[str, Any], int]:
    kw = {k: v for k, v in cfg.items() if k != "num_warps"}
    return kw, cfg.get("num_warps", 4)


def _fast_bench(fn, quantiles):

    return triton.testing.do_bench(fn, warmup=5, rep=20, quantiles=quantiles)


def _prune_gemm(configs, named_args, **kwargs):
    mb = named_args["MB"]
    keep = [c for c in configs if c.kwargs["BLOCK_M"] == mb or (mb == 128 and c.kwargs["BLOCK_M"] == 64)]
    return keep or configs[:1]


def _prune_gemv(configs, named_args, **kwargs):
    n = named_args["N"]
    keep = [c for c in configs if c.kwargs["BLOCK_N"] <= max(128, triton_next_pow2(n))]
    return keep or configs[:1]


def triton_next_pow2(v: int) -> int:
    return 1 << max(0, (int(v) - 1).bit_length())


@functools.cache
def _tuned(kind: str):
    """The autotuned (GPU) kernel of one kind, built over the current kernel module."""
    mod = kernel_module(KERNELS)
    keys = ["N", "K", "G", "FMT", "BITS", "HAS_MEAN", "NM_N", "NM_M", "NB", "LUT_C"]
    if kind == "gemv":
        base = triton.heuristics({"ALIGNED": _aligned})(mod.gemv_kernel)
        configs = [triton.Config(*_split(c), num_stages=1) for c in GPU_GEMV]
        return triton.autotune(
            configs,
            key=keys,
            reset_to_zero=["y_ptr"],
            prune_configs_by={"early_config_prune": _prune_gemv},
            do_bench=_fast_bench,
        )(base)
    base = triton.heuristics({"ALIGNED": _aligned})(mod.gemm_kernel)
    configs = [triton.Config(*_split(c), num_stages=1) for c in GPU_GEMM]
    return triton.autotune(
        configs,
        key=[*keys, "MB", "SPLIT_K", "USE_ATOMIC", "DOT_IEEE"],
        reset_to_zero=["y_ptr"],
        prune_configs_by={"early_config_prune": _prune_gemm},
        do_bench=_fast_bench,
    )(base)


on_reload(_tuned.cache_clear)


def gemm_split_k(m: int, n: int, k: int, device: torch.device) -> int:
    """Split K until the grid has about two programs per SM, keeping ≥ 2 K tiles of 128 per split."""
    sms = sm_count(device)
    tiles = -(-m // m_bucket(m)) * -(-n // 128)
    split = 1
    while split < 16 and tiles * split < 2 * sms and k // (128 * split * 2) >= 2:
        split *= 2
    return split


# -- launches ------------------------------------------------------------------------------------------------
def _common_args(kw: KernelWeight, x: torch.Tensor, y: torch.Tensor, m: int) -> list[Any]:
    return [
        x,
        y,
        kw.w0,
        kw.w1,
        kw.s,
        kw.z,
        kw.c,
        m,
        kw.n,
        kw.k,
        x.stride(0),
        kw.group_size,
        kw.plane_stride,
        kw.lut_block,
    ]


def general_matmul(
    x: torch.Tensor,
    kw: KernelWeight,
    *,
    path: str | None = None,
    config: dict[str, Any] | None = None,
    accumulate: str = "fp32",
) -> torch.Tensor:
    """x (M, K) @ W^T → (M, N) in x's dtype on the general kernels, GEMV (M ≤ GENERAL_GEMV_MAX_M) or GEMM;
    checked and routed by :func:`trilm.kernels.dispatch.triton_matmul`."""
    interp = interpreting()
    m = x.shape[0]
    mod = kernel_module(KERNELS)
    if kw.perm is not None:
        x = x.index_select(1, kw.perm)
    x = x.contiguous()
    if path is None:
        path = "gemv" if m <= GENERAL_GEMV_MAX_M else "gemm"
    native = accumulate == "native" and x.dtype == torch.float16 and kw.sparse is None
    const = kw.constexprs()

    if path == "gemv":
        y = torch.zeros((m, kw.n), dtype=torch.float16 if native else torch.float32, device=x.device)
        args = _common_args(kw, x, y, m)
        if config is None and not interp:
            tuned_grid = lambda meta: (  # noqa: E731
                triton.cdiv(kw.n, meta["BLOCK_N"]),
                triton.cdiv(kw.k, meta["BLOCK_K"] * meta["K_ITERS"]),
                m,
            )
            _tuned("gemv")[tuned_grid](*args, **const, enable_fp_fusion=True)
        else:
            cfg, warps = _split(config or GENERAL_INTERP_GEMV)
            grid = (
                triton.cdiv(kw.n, cfg["BLOCK_N"]),
                triton.cdiv(kw.k, cfg["BLOCK_K"] * cfg["K_ITERS"]),
                m,
            )
            cfg["ALIGNED"] = _aligned({"G": kw.group_size, "K": kw.k, **cfg})
            mod.gemv_kernel[grid](*args, **const, **cfg, num_warps=warps, enable_fp_fusion=True)
    elif path == "gemm":
        cfg, warps = _split(config or {})
        if config is None and interp:
            cfg, warps = _split(GENERAL_INTERP_GEMM)
            cfg["BLOCK_M"] = 16 if m <= 16 else 64
        split_k = cfg.pop("SPLIT_K", None) or gemm_split_k(m, kw.n, kw.k, x.device)
        direct = split_k == 1 and kw.sparse is None
        if direct:
            y = torch.empty((m, kw.n), dtype=x.dtype, device=x.device)
        else:
            y = torch.zeros((m, kw.n), dtype=torch.float16 if native else torch.float32, device=x.device)
        args = [*_common_args(kw, x, y, m), m_bucket(m), split_k]
        extra = {**const, "USE_ATOMIC": split_k > 1, "DOT_IEEE": x.dtype == torch.float32}
        if not cfg:
            tuned_grid = lambda meta: (  # noqa: E731
                triton.cdiv(m, meta["BLOCK_M"]),
                triton.cdiv(kw.n, meta["BLOCK_N"]),
                split_k,
            )
            _tuned("gemm")[tuned_grid](*args, **extra, enable_fp_fusion=True)
        else:
            grid = (triton.cdiv(m, cfg["BLOCK_M"]), triton.cdiv(kw.n, cfg["BLOCK_N"]), split_k)
            cfg["ALIGNED"] = _aligned({"G": kw.group_size, "K": kw.k, **cfg})
            mod.gemm_kernel[grid](*args, **extra, **cfg, num_warps=warps, enable_fp_fusion=True)
    else:
        raise ValueError(f"path must be 'gemv' or 'gemm', got {path!r}")

    if kw.sparse is not None:
        rows, cols, q8, s8, z8 = kw.sparse
        nnz = rows.numel()
        if nnz:
            block = min(8192, triton_next_pow2(nnz)) if interp else 1024
            rows_per = min(64 if interp else 8, triton_next_pow2(m))
            mod.sparse_add_kernel[(triton.cdiv(nnz, block), triton.cdiv(m, rows_per))](
                x,
                y,
                rows,
                cols,
                q8,
                s8,
                z8,
                kw.s,
                kw.z,
                m,
                nnz,
                kw.n,
                kw.group_size,
                x.stride(0),
                BLOCK=block,
                ROWS=rows_per,
                enable_fp_fusion=True,
            )
    return y if y.dtype == x.dtype else y.to(x.dtype)
