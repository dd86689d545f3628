"""SASS instructions per weight of the batch-1 GEMV (and batch-16 GEMM) of each kernel, on CPU.

    python -m benchmarks.kernels.tools.instructions [--out benchmarks/results]

Prints the table and the issue floor it implies, and writes ``instructions-sm90-triton<version>.json``.

The table's "before" is the general kernel of :mod:`trilm.kernels.general.jit` (the kernel of N:M,
multi-plane and PB-LLM weights, and of every format at commit 52262e2) at the config the autotuner chose on
the H200 (``benchmarks/results/kernels-nvidia-h200-2026-12-01.json``; the first GPU config where that run
had none). Its "after" is the kernel a QuantLinear launches for the format, at its default config; "pairs"
is that plan with ``"PAIRS": True`` (two codes per fp16x2 instruction, a tuning candidate). Both are
compiled for sm_90 as Triton's JIT specializes an 8192 × 8192 layer, disassembled, and counted with
:mod:`benchmarks.kernels.tools._sass`. These are issue slots per weight per thread, an upper bound
(predicated-off instructions count); the H200 profile of the general kernel's ternary GEMV found it bound by
instruction issue, which is what this number measures.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch
import triton
from trilm.kernels.affine.plan import candidates
from trilm.kernels.aot import TORCH_TO_TRITON, compile_affine, compile_jit
from trilm.kernels.general.launch import GPU_GEMV, KERNELS
from trilm.kernels.launch_model import H200
from trilm.kernels.triton_runtime import kernel_module

from benchmarks.common import CHECKOUT, write_result
from benchmarks.kernels.tools._sass import per_weight, sass_listing
from trilm.formats.samples import relabelled

N = K = 8192
H200_GEMV = {  # format → (BLOCK_N, BLOCK_K, K_ITERS, num_warps) the H200 autotuner picked at 8192², M = 1
    "ternary": (128, 16, 2, 1),
    "binary": (128, 32, 2, 2),
    "nm2:4": (128, 16, 2, 1),
    "int2": (256, 16, 2, 2),
    "int4": (512, 16, 2, 4),
    "billm": (128, 16, 2, 1),
    "pbllm": (128, 16, 2, 1),
}
H200_GEMM = {"binary": (16, 128, 64, 4), "billm": (16, 128, 64, 4)}  # (BLOCK_M, BLOCK_N, BLOCK_K, warps)
KINDS = ("ternary", "binary", "binary_mean", "int2", "int3", "int4", "int4_act", "nm2:4", "billm", "pbllm")


def _weight(kind: str):
    """A sample of ``kind`` as an 8192 × 8192 layer."""
    return relabelled(kind, N, K)


def _general(kw, path: str, cfg: dict[str, Any], dtype: torch.dtype):
    mod = kernel_module(KERNELS)
    x_t = "*" + TORCH_TO_TRITON[dtype]
    ptr = {t: "*" + TORCH_TO_TRITON[getattr(kw, t).dtype] for t in ("w0", "w1", "s", "z", "c")}
    args = {
        "x_ptr": x_t, "y_ptr": "*fp32", "w0": ptr["w0"], "w1": ptr["w1"], "s_ptr": ptr["s"],
        "z_ptr": ptr["z"], "c_ptr": ptr["c"], "M": 1 if path == "gemv" else 16, "N": kw.n, "K": kw.k,
        "stride_xm": kw.k, "G": kw.group_size, "PLANE_STRIDE": kw.plane_stride, "LUT_BLOCK": kw.lut_block,
    }  # fmt: skip
    const = {**kw.constexprs(), **{k: v for k, v in cfg.items() if k != "num_warps"}}
    const["ALIGNED"] = kw.group_size % cfg["BLOCK_K"] == 0 or kw.group_size >= kw.k
    if path == "gemm":
        args.update(MB=16, SPLIT_K=1)
        const.update(USE_ATOMIC=False, DOT_IEEE=False)
        args["y_ptr"] = x_t
        fn = mod.gemm_kernel
    else:
        fn = mod.gemv_kernel
    return compile_jit(fn, args, const, {"num_warps": cfg["num_warps"], "num_stages": 1})


def count(kind: str, path: str = "gemv", dtype: torch.dtype = torch.float16) -> dict[str, Any]:
    """Before/after instruction figures of one format."""
    kw = _weight(kind)
    if path == "gemv":
        bn, bk, it, warps = H200_GEMV.get(kind, tuple(GPU_GEMV[0].values()))
        before_cfg = {"BLOCK_N": bn, "BLOCK_K": bk, "K_ITERS": it, "num_warps": warps}
        before = _general(kw, "gemv", before_cfg, dtype)
        before_n = per_weight(sass_listing(before.asm["cubin"]), bn * bk * it / (32 * warps))
    else:
        bm, bn, bk, warps = H200_GEMM.get(kind, (16, 64, 128, 4))
        before_cfg = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "num_warps": warps}
        before = _general(kw, "gemm", before_cfg, dtype)
        before_n = per_weight(sass_listing(before.asm["cubin"]), bn * bk / (32 * warps), K // bk)
    row = {"kind": kind, "path": path, "before": before_n.row(), "before_config": before_cfg}
    if kw.affine is None:
        row.update(after=before_n.row(), after_config="unchanged (general kernel)")
        return row
    spec = kw.affine
    if path == "gemv":
        cfg = candidates(spec, "gemv", 1)[0]
        kernel, plan = compile_affine(spec, "gemv", cfg, dtype, 1)
        units = plan.runtime["UNITS_PER_SPLIT"]
        per_thread = cfg["BLOCK_R"] * spec.unit_k * cfg["BLOCK_N"] / (32 * cfg["num_warps"])
        iterations = units // cfg["BLOCK_R"]
        after = per_weight(sass_listing(kernel.asm["cubin"]), per_thread, iterations, plan.split_k)
        if spec.hs == 1:  # the same plan decoding two codes per instruction (a tuning candidate)
            pair_kernel, _ = compile_affine(spec, "gemv", {**cfg, "PAIRS": True}, dtype, 1)
            pairs = per_weight(sass_listing(pair_kernel.asm["cubin"]), per_thread, iterations, plan.split_k)
            row["pairs"] = pairs.row()
    else:
        cfg = candidates(spec, "gemm", 16)[0]
        kernel, plan = compile_affine(spec, "gemm", cfg, dtype, 16)
        bk = plan.const["BLOCK_K"]
        per_thread = bk * cfg["BLOCK_N"] / (32 * cfg["num_warps"])
        tiles = plan.runtime["TILES_PER_SPLIT"]
        after = per_weight(sass_listing(kernel.asm["cubin"]), per_thread, tiles, plan.split_k)
    row.update(after=after.row(), after_config={**cfg, "SPLIT_K": plan.split_k})
    return row


def table(kinds=KINDS, paths=("gemv",), cc: int = 90) -> list[dict[str, Any]]:
    if cc != 90:
        raise ValueError("instruction counts are defined for sm_90 (the H200) only")
    return [count(kind, path) for path in paths for kind in kinds]


def print_table(kinds=KINDS, paths=("gemv", "gemm"), cc: int = 90) -> list[dict[str, Any]]:
    rows = table(kinds, paths, cc)
    print("SASS instructions per weight per thread, sm_90, 8192 x 8192, fp16 activations")
    print("| path | format | before | after | ratio | after: int / fp / mem / other | fp16 pairs |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        b, a = r["before"]["per_weight"], r["after"]["per_weight"]
        kinds_ = " / ".join(f"{r['after']['by_kind'][k]:.2f}" for k in ("int", "fp", "mem", "other"))
        pairs = f"{r['pairs']['per_weight']:.2f}" if "pairs" in r else "—"
        print(f"| {r['path']} M={1 if r['path'] == 'gemv' else 16} | {r['kind']} | {b:.2f} | {a:.2f} "
              f"| {b / a:.2f}x | {kinds_} | {pairs} |")  # fmt: skip
    print(f"\nissue floor of the batch-1 GEMV at {N}x{K} on an {H200.name} ({H200.sms} SMs × "
          f"{H200.schedulers} schedulers at {H200.clock_ghz} GHz), µs: after / fp16 pairs")  # fmt: skip
    for r in rows:
        if r["path"] == "gemv" and "pairs" in r:
            after, pairs = (H200.issue_floor_us(N * K, r[key]["per_weight"]) for key in ("after", "pairs"))
            r["issue_floor_us"] = {"after": round(after, 2), "pairs": round(pairs, 2)}
            print(f"  {r['kind']:12s} {after:6.2f} / {pairs:6.2f}")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=CHECKOUT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    rows = print_table()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"instructions-sm90-triton{triton.__version__}.json"
    result = {"triton": triton.__version__, "shape": f"{N}x{K}", "rows": rows}
    write_result(path, result, module=__spec__.name, argv=argv)
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
