"""Launch plans for the affine kernels: config resolved once, then one cached launch per call.

A :class:`LaunchPlan` is built the first time a layer sees a (batch rows, dtype, device): it resolves the
config (tuning cache or default, see :mod:`trilm.kernels.affine.tuning`), the grid, the split-K depth, and
every argument that does not depend on the input. On CUDA its first launch compiles through Triton's normal
path and keeps the compiled kernel; every later call goes straight to the compiled kernel's launcher with the
argument list already laid out — no binder, no specialization key, no autotuner. The split-K workspace and
its counters are shared per (device, stream) and left zeroed by every launch (see
:mod:`trilm.kernels.affine.jit`), so the call is one kernel and can be captured in a CUDA graph.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import torch
import triton
import triton.language as tl
import triton.testing
from trilm.kernels.affine import tuning
from trilm.kernels.launch_model import H200, MIN_PROGRAMS_PER_SM
from trilm.kernels.triton_runtime import current_stream, interpreting, kernel_module, sm_count
from triton import knobs

from trilm.formats import DecodeArgs, KernelId

KERNELS = "trilm.kernels.affine.jit"


@dataclasses.dataclass
class AffineSpec:
    """A ternary, binary or int weight in the affine kernels' argument form."""

    n: int
    k: int
    fmt: int  # a KernelId: ternary, binary or int
    bits: int
    lo: torch.Tensor
    hi: torch.Tensor
    s: torch.Tensor
    z: torch.Tensor
    mu: torch.Tensor
    perm: torch.Tensor
    group_size: int
    has_mean: bool = False
    has_perm: bool = False

    @property
    def wbits(self) -> int:
        return 2 if self.bits == 3 else self.bits

    @property
    def hs(self) -> int:
        return 2 if self.bits == 3 else 1

    @property
    def unit_k(self) -> int:
        """K columns per GEMV unit (HS rows of words)."""
        return 32 // self.wbits * self.hs

    @property
    def key(self) -> str:
        name = KernelId(self.fmt).name.lower() + (str(self.bits) if self.fmt == KernelId.INT else "")
        return f"{name}{'+mean' if self.has_mean else ''}{'+perm' if self.has_perm else ''}"

    def constexprs(self) -> dict[str, Any]:
        return {
            "FMT": self.fmt,
            "BITS": self.bits,
            "WBITS": self.wbits,
            "HS": self.hs,
            "HAS_MEAN": self.has_mean,
            "HAS_PERM": self.has_perm,
        }

    @classmethod
    def from_args(cls, a: DecodeArgs) -> AffineSpec | None:
        """The affine form of a weight's decode arguments, or None when another kernel must serve it
        (not an affine decode, salient weights on top, or groups that split a GEMV unit of 16/32/8 codes)."""
        if not a.affine:
            return None
        lo = a.words
        spec = cls(
            a.n,
            a.k,
            int(a.kernel),
            a.bits,
            lo,
            a.words_hi if a.words_hi is not None else lo,
            a.scales,
            a.zeros if a.zeros is not None else a.scales,
            a.means if a.means is not None else a.scales,
            lo,
            a.group_size,
            has_mean=a.means is not None,
        )
        if a.perm is not None:
            spec.perm, spec.has_perm = a.perm.to(device=lo.device, dtype=torch.int32), True
        if a.group_size < a.k and a.group_size % spec.unit_k:
            return None
        return spec


# -- workspace ------------------------------------------------------------------------------------------
class Workspace:
    """fp32 partials and int32 tile counters for split-K, one pair per (device, stream).

    Counters start at zero and every launch leaves them at zero, so the buffers are reused across calls and
    graph replays. Growing replaces the buffers but keeps the old ones alive: a captured graph may still point
    at them."""

    _pool: ClassVar[dict[tuple[str, int], Workspace]] = {}

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.partials = torch.empty(0, dtype=torch.float32, device=device)
        self.counters = torch.zeros(0, dtype=torch.int32, device=device)
        self._retired: list[torch.Tensor] = []

    @classmethod
    def get(cls, device: torch.device, stream: int) -> Workspace:
        key = (str(device), stream)
        ws = cls._pool.get(key)
        if ws is None:
            ws = cls._pool[key] = cls(device)
        return ws

    def reserve(self, partials: int, counters: int) -> None:
        if partials > self.partials.numel():
            self._retired.append(self.partials)
            self.partials = torch.empty(
                max(partials, 2 * self.partials.numel()), dtype=torch.float32, device=self.device
            )
        if counters > self.counters.numel():
            self._retired.append(self.counters)
            self.counters = torch.zeros(
                max(counters, 2 * self.counters.numel()), dtype=torch.int32, device=self.device
            )


# -- configs → launch geometry ------------------------------------------------------------------------------
def gemv_geometry(spec: AffineSpec, m: int, cfg: dict[str, Any], sms: int) -> dict[str, Any]:
    """Grid, split-K and per-split units for a GEMV config.

    K is split until every SM runs ``PROGRAMS_PER_SM`` programs (default :data:`tuning.GEMV_PROGRAMS_PER_SM`;
    the launch-plan model, :mod:`trilm.kernels.launch_model`, checks the occupancy allows them), at most
    :data:`tuning.GEMV_MAX_SPLIT` ways; a split of one tile still overlaps its load with the other
    programs' decode on the same SM."""
    units = -(-spec.k // spec.unit_k)
    programs_n = -(-spec.n // cfg["BLOCK_N"])
    tiles = -(-units // cfg["BLOCK_R"])
    if cfg.get("SPLIT_K"):
        tiles_per = -(-tiles // max(1, min(cfg["SPLIT_K"], tiles)))
    else:
        per_sm = cfg.get("PROGRAMS_PER_SM", tuning.GEMV_PROGRAMS_PER_SM)
        wanted = max(1, -(-per_sm * sms // programs_n))
        tiles_per = max(1, tiles // wanted, -(-tiles // tuning.GEMV_MAX_SPLIT))
    per = tiles_per * cfg["BLOCK_R"]
    split = -(-units // per)
    return {"grid": (programs_n, split, 1), "SPLIT_K": split, "UNITS_PER_SPLIT": per, "counters": programs_n}


def gemm_block_k(spec: AffineSpec, block_k: int) -> int | None:
    """BLOCK_K inside one scale group and a multiple of the codes per word row (None: no such tile)."""
    step = 32 if spec.hs == 2 else 32 // spec.wbits
    bk = block_k
    while bk >= max(16, step):
        if (spec.group_size >= spec.k or spec.group_size % bk == 0) and bk % step == 0:
            return bk
        bk //= 2
    return None


def gemm_geometry(spec: AffineSpec, m: int, cfg: dict[str, Any], sms: int) -> dict[str, Any] | None:
    bk = gemm_block_k(spec, cfg["BLOCK_K"])
    if bk is None:
        return None
    tiles = -(-m // cfg["BLOCK_M"]) * -(-spec.n // cfg["BLOCK_N"])
    k_tiles = -(-spec.k // bk)
    per_sm = cfg.get("PROGRAMS_PER_SM", tuning.GEMM_PROGRAMS_PER_SM)
    split = cfg.get("SPLIT_K") or max(1, min(32, -(-per_sm * sms // tiles), k_tiles // 2))
    split = max(1, min(split, k_tiles))
    per = -(-k_tiles // split)
    split = -(-k_tiles // per)
    grid = (-(-m // cfg["BLOCK_M"]), -(-spec.n // cfg["BLOCK_N"]), split)
    return {"grid": grid, "SPLIT_K": split, "TILES_PER_SPLIT": per, "BLOCK_K": bk, "counters": tiles}


_DOT_DTYPES = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}


def dot_dtype(dtype: torch.dtype) -> tl.dtype:
    """The dtype the GEMM decodes weights into and multiplies in: the activations' fp16/bf16 (tensor cores),
    fp32 for fp32 activations (an IEEE dot, exact but slow) and always under the interpreter, whose
    ``tl.dot`` takes fp32 (the decoded integers are exact in every one of them)."""
    if dtype not in _DOT_DTYPES:
        raise ValueError(f"the affine GEMM takes fp16, bf16 or fp32 activations, got {dtype}")
    return tl.float32 if interpreting() else _DOT_DTYPES[dtype]


def pair_dtype(spec: AffineSpec, dtype: torch.dtype, cfg: dict[str, Any]) -> tl.dtype:
    """The GEMV's decode dtype: the activations' fp16 or bf16 when the config asks for pairs (``"PAIRS":
    True``) and the format keeps one row of words per unit (every affine format but int3), else fp32."""
    if cfg.get("PAIRS") and spec.hs == 1 and dtype in (torch.float16, torch.bfloat16):
        return _DOT_DTYPES[dtype]
    return tl.float32


# -- plans ------------------------------------------------------------------------------------------------
class LaunchPlan:
    """One resolved launch of an affine kernel for a fixed (M, dtype, device); ``plan(x, bias)`` → y."""

    def __init__(
        self,
        kernel,
        spec: AffineSpec,
        path: str,
        m: int,
        dtype: torch.dtype,
        cfg: dict[str, Any],
        sms: int | None = None,
    ):
        self.kernel, self.spec, self.path, self.m, self.dtype = kernel, spec, path, m, dtype
        self.config = dict(cfg)
        self.device = spec.lo.device
        sms = sms or sm_count(self.device)
        const = spec.constexprs()
        if path == "gemv":
            geo = gemv_geometry(spec, m, cfg, sms)
            const.update(
                SCALE_ONCE=spec.group_size >= spec.k,
                K_TAIL=spec.k % spec.unit_k != 0,
                SPLIT_K=geo["SPLIT_K"],
                BM=tuning.gemv_bucket(m),
                BLOCK_R=cfg["BLOCK_R"],
                BLOCK_N=cfg["BLOCK_N"],
                NUM_STAGES=cfg.get("num_stages", 1),
                PAIR_DTYPE=pair_dtype(spec, dtype, cfg),
            )
            self.runtime = {"M": m, "N": spec.n, "K": spec.k, "G": spec.group_size,
                            "UNITS_PER_SPLIT": geo["UNITS_PER_SPLIT"]}  # fmt: skip
        else:
            gemm_geo = gemm_geometry(spec, m, cfg, sms)
            if gemm_geo is None:
                raise ValueError(f"no GEMM K tile fits group size {spec.group_size}")
            geo = gemm_geo
            const.update(
                SPLIT_K=geo["SPLIT_K"],
                DOT_DTYPE=dot_dtype(dtype),
                BLOCK_M=cfg["BLOCK_M"],
                BLOCK_N=cfg["BLOCK_N"],
                BLOCK_K=geo["BLOCK_K"],
            )
            self.runtime = {"M": m, "N": spec.n, "K": spec.k, "G": spec.group_size,
                            "TILES_PER_SPLIT": geo["TILES_PER_SPLIT"]}  # fmt: skip
        self.grid = geo["grid"]
        self.split_k = geo["SPLIT_K"]
        self.n_counters = geo["counters"]
        self.const = const
        self.options = {"num_warps": cfg.get("num_warps", 4), "num_stages": cfg.get("num_stages", 1)}
        self._word_aligned_x = const.get("PAIR_DTYPE", tl.float32) != tl.float32
        self._compiled: tuple[bool, Any] | None = None  # (has bias, the compiled kernel)
        self._names = list(kernel.arg_names)

    def _args(self, x, y, bias, ws: Workspace) -> dict[str, Any]:
        s = self.spec
        return {
            "x_ptr": x, "y_ptr": y, "w_ptr": s.lo, "hi_ptr": s.hi, "s_ptr": s.s, "z_ptr": s.z, "mu_ptr": s.mu,
            "perm_ptr": s.perm, "b_ptr": bias if bias is not None else y, "ws_ptr": ws.partials,
            "cnt_ptr": ws.counters, "stride_xm": x.stride(0), "HAS_BIAS": bias is not None,
            **self.runtime,
        }  # fmt: skip

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if self._word_aligned_x and x.data_ptr() % 4:
            x = x.clone()  # the pair decode reads x as 32-bit words
        y = torch.empty((self.m, self.spec.n), dtype=x.dtype, device=x.device)
        stream = current_stream(x.device)
        ws = Workspace.get(x.device, stream)
        if self.split_k > 1:
            ws.reserve(self.split_k * self.m * self.spec.n, self.n_counters)
        args = self._args(x, y, bias, ws)
        compiled = self._compiled
        # the compiled kernel assumed 16-byte aligned activations (as the JIT specialized the first call)
        if compiled is not None and compiled[0] == (bias is not None) and x.data_ptr() % 16 == 0:
            ck = compiled[1]
            g0, g1, g2 = self.grid
            ck.run(g0, g1, g2, stream, ck.function, ck.packed_metadata, None, None, None,
                   *[args[n] if n in args else self.const[n] for n in self._names])  # fmt: skip
            return y
        ck = self.kernel[self.grid](**args, **self.const, **self.options)
        if x.device.type == "cuda" and ck is not None and hasattr(ck, "packed_metadata"):
            aligned = x.data_ptr() % 16 == 0
            if knobs.runtime.launch_enter_hook is None and aligned:  # a profiling hook wants Triton's path
                self._compiled = (bias is not None, ck)
        return y


def kernel_for(path: str):
    mod = kernel_module(KERNELS)
    return mod.affine_gemv_kernel if path == "gemv" else mod.affine_gemm_kernel


def tuning_key(spec: AffineSpec, path: str, m: int, dtype: torch.dtype) -> str:
    bucket = tuning.gemv_bucket(m) if path == "gemv" else tuning.gemm_bucket(m)
    dev = torch.cuda.get_device_name(spec.lo.device) if spec.lo.is_cuda else "cpu"
    return (
        f"{dev}|triton-{triton.__version__}|{path}|{spec.key}|N{spec.n}|K{spec.k}|G{spec.group_size}"
        f"|M{bucket}|{str(dtype).removeprefix('torch.')}"
    )


def candidates(spec: AffineSpec, path: str, m: int, sms: int = H200.sms) -> list[dict[str, Any]]:
    """The configs worth timing, the default first. GEMV candidates are written for 16 codes per unit
    (2-bit); binary units of 32 codes take half the rows and 3-bit units (two rows of low bits plus a
    high-bit row) a quarter, which keeps them free of register spills at sm_90, and one more pipeline
    stage, which keeps as many bytes in flight with the smaller tile.

    The default is the first candidate whose grid can reach the programs per SM the plans aim for on
    ``sms`` SMs (a short K leaves split-K little room, so narrower column blocks come first there); when
    none can, the one with the most programs. The GEMM's default (batches of 2 rows and more) is the first
    candidate that gives at least MIN_PROGRAMS_PER_SM programs per SM and Little's-law bytes in flight per
    SM (:func:`gemm_in_flight`), else the first with the programs, else the one with most programs; 1-bit
    (binary) tiles take one more pipeline stage. Plans for a GPU pass its own count; tables made without
    one assume an H200."""
    if path == "gemv":
        shrink = max(1, spec.unit_k // 16) * spec.hs
        pool = tuning.GEMV_CANDIDATES[tuning.gemv_bucket(m)]
        pool = [
            {**c, "BLOCK_R": max(1, c["BLOCK_R"] // shrink), "num_stages": c["num_stages"] + (shrink > 1)}
            for c in pool
        ]

        def programs(c: dict[str, Any]) -> int:
            grid = gemv_geometry(spec, m, c, sms)["grid"]
            return grid[0] * grid[1]

        target = tuning.GEMV_PROGRAMS_PER_SM * sms
        first = next((c for c in pool if programs(c) >= target), max(pool, key=programs))
        return [first, *(c for c in pool if c is not first)]
    pool = [c for c in tuning.GEMM_CANDIDATES[tuning.gemm_bucket(m)] if gemm_block_k(spec, c["BLOCK_K"])]
    if spec.wbits == 1:  # half the bytes of a 2-bit tile: one more stage keeps as many in flight
        pool = [{**c, "num_stages": c["num_stages"] + 1} for c in pool]
    figures = {id(c): gemm_in_flight(spec, m, c, sms) for c in pool}
    enough = [c for c in pool if figures[id(c)][0] >= MIN_PROGRAMS_PER_SM]
    pick = next((c for c in enough if figures[id(c)][1] >= H200.little_bytes_per_sm), None)
    pick = pick or (enough[0] if enough else max(pool, key=lambda c: figures[id(c)][0], default=None))
    return [pick, *(c for c in pool if c is not pick)] if pick is not None else []


def gemm_in_flight(spec: AffineSpec, m: int, cfg: dict[str, Any], sms: int) -> tuple[float, float]:
    """(programs per SM, bytes of words in flight per SM) of a GEMM config, as the launch-plan model counts
    them (:mod:`trilm.kernels.launch_model`) but before any compile: ``num_stages − 1`` tiles loading per
    program, at most GEMM_PROGRAMS_PER_SM programs resident (what the compiled tiles allow at sm_90)."""
    geo = gemm_geometry(spec, m, cfg, sms)
    assert geo is not None, "a GEMM candidate has a K tile (candidates() keeps only those)"
    programs = geo["grid"][0] * geo["grid"][1] * geo["grid"][2] / sms
    tile = geo["BLOCK_K"] * cfg["BLOCK_N"] * (spec.wbits + (spec.hs == 2)) // 8
    return programs, min(programs, tuning.GEMM_PROGRAMS_PER_SM) * tile * max(1, cfg["num_stages"] - 1)


def make_plan(spec: AffineSpec, path: str, m: int, dtype: torch.dtype, config: dict[str, Any] | None = None):
    """The plan for (spec, path, m, dtype): ``config`` pinned, else cached/tuned (GPU) or fixed (CPU)."""
    kernel = kernel_for(path)
    if config is not None:
        return LaunchPlan(kernel, spec, path, m, dtype, config)
    if not spec.lo.is_cuda:
        cfg = (
            dict(tuning.AFFINE_INTERP_GEMV)
            if path == "gemv"
            else {**tuning.AFFINE_INTERP_GEMM, "BLOCK_M": 16 if m <= 16 else 64}
        )
        return LaunchPlan(kernel, spec, path, m, dtype, cfg)
    cache = tuning.shared_cache()
    key = tuning_key(spec, path, m, dtype)
    cached = cache.get(key)
    if cached is not None:
        return LaunchPlan(kernel, spec, path, m, dtype, cached)
    options = candidates(spec, path, m, sm_count(spec.lo.device))
    if not options:
        raise ValueError(f"{spec.key}: no {path} config fits group size {spec.group_size}")
    if not tuning.tuning_enabled() or torch.cuda.is_current_stream_capturing():
        return LaunchPlan(kernel, spec, path, m, dtype, options[0])
    best, best_us = _time_candidates(kernel, spec, path, m, dtype, options)
    cache.put(key, best.config, best_us)
    cache.save()
    return best


def _time_candidates(kernel, spec, path, m, dtype, options):

    x = torch.randn(m, spec.k, device=spec.lo.device).to(dtype)
    best, best_us = None, float("inf")
    for cfg in options:
        plan = LaunchPlan(kernel, spec, path, m, dtype, cfg)
        try:
            us = triton.testing.do_bench(lambda plan=plan: plan(x), warmup=5, rep=20) * 1e3
        except Exception:  # a candidate that does not fit (registers, shared memory) is skipped
            continue
        if us < best_us:
            best, best_us = plan, us
    if best is None:
        raise RuntimeError(f"{spec.key}: none of the {path} configs {options} could run")
    return best, best_us


# -- large batches: dequantize once, then cuBLAS -----------------------------------------------------------
def dequantize_transposed(spec: AffineSpec, dtype: torch.dtype) -> torch.Tensor:
    """W^T (K, N) in ``dtype`` from one kernel launch (act-order rows back in input-column order)."""
    mod = kernel_module(KERNELS)
    out = torch.empty((spec.k, spec.n), dtype=dtype, device=spec.lo.device)
    block_k = 32 if spec.hs == 2 else max(32, 32 // spec.wbits)
    block_n = 128
    grid = (-(-spec.k // block_k), -(-spec.n // block_n))
    mod.affine_dequant_kernel[grid](
        out, spec.lo, spec.hi, spec.s, spec.z, spec.mu, spec.perm, spec.n, spec.k, spec.group_size,
        **spec.constexprs(), BLOCK_K=block_k, BLOCK_N=block_n,
    )  # fmt: skip
    return out


# -- entry points ---------------------------------------------------------------------------------------
def affine_path(m: int) -> str:
    """'gemv' (fewer than TC_MIN_M rows), 'gemm' (tensor cores), or 'cublas' (≥ the crossover: dequantize
    once, then cuBLAS)."""
    if m < tuning.TC_MIN_M:
        return "gemv"
    return "gemm" if m < tuning.CUBLAS_MIN_M else "cublas"


def affine_matmul(
    x: torch.Tensor,
    spec: AffineSpec,
    *,
    path: str | None = None,
    config: dict[str, Any] | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """x (M, K) @ W^T (+ bias) for an affine weight, one launch (cuBLAS path: dequantize + matmul).

    Builds a plan each call: layers keep theirs (:class:`trilm.kernels.QuantLinear`); this entry point is for
    tests and one-off products. ``config`` pins a launch config, e.g. ``{"BLOCK_R": 8, "BLOCK_N": 128,
    "SPLIT_K": 3, "num_warps": 4}``."""
    m = x.shape[0]
    path = path or affine_path(m)
    if path == "cublas":
        w_t = dequantize_transposed(spec, x.dtype)
        y = x @ w_t
        return y if bias is None else y + bias.to(y.dtype)
    if path not in ("gemv", "gemm"):
        raise ValueError(f"path must be 'gemv', 'gemm' or 'cublas', got {path!r}")
    if path == "gemv" and m > tuning.GEMV_MAX_M:
        raise ValueError(f"the affine GEMV takes at most {tuning.GEMV_MAX_M} rows, got {m}")
    x = x.contiguous()
    return make_plan(spec, path, m, x.dtype, config)(x, bias)
