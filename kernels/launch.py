"""Launching the Triton kernels: packed weight → kernel arguments, path choice, the general kernels' configs.

Ternary, binary and int weights run on the affine kernels through launch plans (:mod:`kernels.plan`: config
resolved once, one launch per call). The other formats — N:M binary, multi-plane binary, PB-LLM — run on the
general kernels of :mod:`kernels.triton_kernels`, autotuned on a GPU and zero + kernel + cast per call.
Under the CPU interpreter (``TRITON_INTERPRET=1``), which cannot autotune, fixed large-block configs are
used. ``@triton.jit`` decides between interpreter and compiler when a kernel module is imported, so
:func:`kernel_module` re-imports one whenever the ``TRITON_INTERPRET`` setting has changed since.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import os
import sys
from types import ModuleType
from typing import Any

import torch
import triton

from kernels import plan as plans
from kernels import tuning
from trilm.formats import (
    BinaryWeight,
    IntWeight,
    MultiBinaryWeight,
    NMBinaryWeight,
    PackedWeight,
    PBLLMWeight,
    TernaryWeight,
)

FMT_IDS = {"ternary": 0, "binary": 1, "nm_binary": 2, "int": 3, "multibinary": 4, "pbllm": 1}
GEMV_MAX_M = tuning.GEMV_MAX_M
LEGACY_GEMV_MAX_M = 4
"""The general GEMV runs one program row per input row; above this the general GEMM is used."""


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "yes", "on")


def kernel_module(name: str = "kernels.triton_kernels") -> ModuleType:
    """A kernel module, (re)imported so its ``@triton.jit`` matches the interpreter setting."""
    mod = sys.modules.get(name)
    if mod is None:
        return importlib.import_module(name)
    if interpreting() != mod.INTERPRET:
        mod = importlib.reload(mod)
        _tuned.cache_clear()
    return mod


# -- prepared arguments --------------------------------------------------------------------------------
@dataclasses.dataclass
class KernelWeight:
    """Everything a launch needs for one packed weight, in kernel layout (built once per layer and device)."""

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
    affine: plans.AffineSpec | None = None

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


def prepare(weight: PackedWeight, *, general: bool = False) -> KernelWeight:
    """Map a packed weight of any format onto the kernels' argument set (no copies of the big tensors).

    Ternary, binary and int weights also get their affine form (``.affine``), which :func:`triton_matmul`
    prefers; ``general=True`` leaves it out, so the general kernels serve every format (the baseline the
    benchmark and the instruction counts compare against). Compact storage formats (``partial_binary``,
    ``residual_binary``) are converted once to their kernel layout (``PackedWeight.kernel_layout``)."""
    layout = weight.kernel_layout()
    if layout is not weight:
        return prepare(layout, general=general)
    kw = _prepare_general(weight)
    if not general:
        kw.affine = plans.affine_spec(weight)
    return kw


def _prepare_general(weight: PackedWeight) -> KernelWeight:
    n, k = weight.shape
    if isinstance(weight, TernaryWeight):
        w = weight.qweight
        return KernelWeight(n, k, 0, w, w, weight.scales, weight.scales, w, weight.group_size)
    if isinstance(weight, PBLLMWeight):
        w = weight.qweight
        sparse = (
            weight.salient_rows(),
            weight.col,
            weight.q8,
            weight.s8,
            weight.z8,
        )
        return KernelWeight(
            n, k, 1, w, w, weight.scales, weight.means, w, weight.group_size, has_mean=True, sparse=sparse
        )
    if isinstance(weight, BinaryWeight):
        w = weight.qweight
        z = weight.means if weight.means is not None else weight.scales
        return KernelWeight(
            n, k, 1, w, w, weight.scales, z, w, weight.group_size, has_mean=weight.means is not None
        )
    if isinstance(weight, NMBinaryWeight):
        return KernelWeight(
            n,
            k,
            2,
            weight.mask,
            weight.signs,
            weight.scales,
            weight.scales,
            weight.mask,
            weight.group_size,
            nm_n=weight.nm_n,
            nm_m=weight.nm_m,
        )
    if isinstance(weight, IntWeight):
        w1 = weight.qweight_hi if weight.qweight_hi is not None else weight.qweight
        perm = weight.perm
        return KernelWeight(
            n,
            k,
            3,
            weight.qweight,
            w1,
            weight.scales,
            weight.zeros,
            weight.qweight,
            weight.group_size,
            bits=weight.bits,
            perm=None if perm is None else perm.to(weight.qweight.device),
        )
    if isinstance(weight, MultiBinaryWeight):
        planes = weight.planes
        return KernelWeight(
            n,
            k,
            4,
            planes,
            planes,
            weight.lut,
            weight.lut,
            weight.col_class,
            weight.block_size,
            nb=weight.n_bits,
            lut_c=weight.n_classes,
            lut_block=weight.block_size,
            plane_stride=planes.shape[1] * planes.shape[2],
        )
    raise TypeError(f"no Triton kernel for packed format {type(weight).__name__}")


# -- configs -------------------------------------------------------------------------------------------------
CPU_GEMV = {"BLOCK_N": 128, "BLOCK_K": 128, "K_ITERS": 2, "num_warps": 4}
CPU_GEMM = {"BLOCK_N": 128, "BLOCK_K": 128, "SPLIT_K": 1, "num_warps": 4}
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
    import triton.testing

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
    mod = kernel_module()
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


@functools.lru_cache(maxsize=8)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def gemm_split_k(m: int, n: int, k: int, device: torch.device) -> int:
    """Split K until the grid has about two programs per SM, keeping ≥ 2 K tiles of 128 per split."""
    sms = _sm_count(device.index or 0) if device.type == "cuda" else 8
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


def triton_matmul(
    x: torch.Tensor,
    kw: KernelWeight,
    *,
    path: str | None = None,
    config: dict[str, Any] | None = None,
    accumulate: str = "fp32",
) -> torch.Tensor:
    """x (M, K) @ W^T → (M, N) in x's dtype, with the GEMV (M ≤ GEMV_MAX_M) or the GEMM kernel.

    ``config`` pins a launch config (tests sweep them); ``accumulate="native"`` lets fp16 GEMV/split-K
    partials be added atomically straight into the fp16 output (one kernel instead of zero + kernel + cast),
    at the cost of fp16 rounding per partial.
    """
    if x.dim() != 2 or x.shape[1] != kw.k:
        raise ValueError(f"expected x of shape (M, {kw.k}), got {tuple(x.shape)}")
    if x.device != kw.w0.device:
        raise ValueError(f"x is on {x.device} but the packed weight is on {kw.w0.device}")
    interp = interpreting()
    if x.device.type != "cuda" and not interp:
        raise RuntimeError(
            "Triton on CPU needs TRITON_INTERPRET=1 (set before launching); or use backend='torch'"
        )
    m = x.shape[0]
    if m == 0:
        return torch.zeros((0, kw.n), dtype=x.dtype, device=x.device)
    if kw.affine is not None:
        return affine_matmul(x, kw.affine, path=path, config=config)
    mod = kernel_module()
    if kw.perm is not None:
        x = x.index_select(1, kw.perm)
    x = x.contiguous()
    if path is None:
        path = "gemv" if m <= LEGACY_GEMV_MAX_M else "gemm"
    native = accumulate == "native" and x.dtype == torch.float16 and kw.sparse is None
    const = kw.constexprs()

    if path == "gemv":
        y = torch.zeros((m, kw.n), dtype=torch.float16 if native else torch.float32, device=x.device)
        args = _common_args(kw, x, y, m)
        if config is None and not interp:
            grid = lambda meta: (  # noqa: E731
                triton.cdiv(kw.n, meta["BLOCK_N"]),
                triton.cdiv(kw.k, meta["BLOCK_K"] * meta["K_ITERS"]),
                m,
            )
            _tuned("gemv")[grid](*args, **const, enable_fp_fusion=True)
        else:
            cfg, warps = _split(config or CPU_GEMV)
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
            cfg, warps = _split(CPU_GEMM)
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
            grid = lambda meta: (  # noqa: E731
                triton.cdiv(m, meta["BLOCK_M"]),
                triton.cdiv(kw.n, meta["BLOCK_N"]),
                split_k,
            )
            _tuned("gemm")[grid](*args, **extra, enable_fp_fusion=True)
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


def affine_path(m: int) -> str:
    """'gemv' (≤ GEMV_MAX_M rows), 'gemm', or 'cublas' (≥ the crossover: dequantize once, then cuBLAS)."""
    if m <= GEMV_MAX_M:
        return "gemv"
    return "gemm" if m < tuning.CUBLAS_MIN_M else "cublas"


def affine_matmul(
    x: torch.Tensor,
    spec: plans.AffineSpec,
    *,
    path: str | None = None,
    config: dict[str, Any] | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """x (M, K) @ W^T (+ bias) for an affine weight, one launch (cuBLAS path: dequantize + matmul).

    Builds a plan each call: layers keep theirs (:class:`kernels.QuantLinear`); this entry point is for tests
    and one-off products. ``config`` pins a launch config, e.g. ``{"BLOCK_R": 8, "BLOCK_N": 128,
    "SPLIT_K": 3, "num_warps": 4}``."""
    m = x.shape[0]
    path = path or affine_path(m)
    if path == "cublas":
        w_t = plans.dequantize_transposed(spec, x.dtype)
        y = x @ w_t
        return y if bias is None else y + bias.to(y.dtype)
    if path not in ("gemv", "gemm"):
        raise ValueError(f"path must be 'gemv', 'gemm' or 'cublas', got {path!r}")
    if path == "gemv" and m > GEMV_MAX_M:
        raise ValueError(f"the affine GEMV takes at most {GEMV_MAX_M} rows, got {m}")
    x = x.contiguous()
    return plans.make_plan(spec, path, m, x.dtype, config)(x, bias)
