"""Compile the GPU kernels ahead of time for an NVIDIA target, without a GPU (Triton bundles ptxas).

Usage: ``python -m benchmarks.kernels.tools.compile_check [--cc 90] [--kinds ternary int3 ...]
[--dtypes fp16 bf16]``
       ``python -m benchmarks.kernels --instructions``   (SASS instructions per weight, before vs after)

Every (format, GEMV/GEMM config, activation dtype) a GPU run can pick is lowered to PTX and assembled to a
cubin for the target, so code that only the GPU path reaches (``tl.dot`` shapes, fp16/bf16 casts, atomics,
pipelining) is checked on a CPU-only machine; ternary, binary and int weights go through the affine kernels,
the other formats through the general ones. It prints per kernel the registers ptxas reports and any
spills. Arguments are specialized as Triton's JIT would for LLaMA-sized layers (pointers and sizes divisible
by 16), so vectorization matches a real launch. Must run without ``TRITON_INTERPRET``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Any

import torch
from trilm.kernels.affine.tuning import GEMM_CANDIDATES, GEMV_CANDIDATES
from trilm.kernels.dispatch import prepare
from trilm.kernels.general.launch import GPU_GEMM, GPU_GEMV, KERNELS, KernelWeight, _aligned
from trilm.kernels.triton_runtime import kernel_module

from trilm.dtypes import ALIASES, parse_dtype
from trilm.formats.samples import KINDS, random_packed

TORCH_TO_TRITON = {
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.float32: "fp32",
    torch.int32: "i32",
    torch.int16: "i16",
    torch.uint8: "u8",
}


def _ptr(t: torch.Tensor) -> str:
    return "*" + TORCH_TO_TRITON[t.dtype]


def _signature(kw: KernelWeight, x_dtype: torch.dtype, y_dtype: torch.dtype, gemm: bool) -> dict[str, str]:
    sig = {
        "x_ptr": "*" + TORCH_TO_TRITON[x_dtype],
        "y_ptr": "*" + TORCH_TO_TRITON[y_dtype],
        "w0": _ptr(kw.w0),
        "w1": _ptr(kw.w1),
        "s_ptr": _ptr(kw.s),
        "z_ptr": _ptr(kw.z),
        "c_ptr": _ptr(kw.c),
    }
    sig.update(dict.fromkeys(("M", "N", "K", "stride_xm", "G", "PLANE_STRIDE", "LUT_BLOCK"), "i32"))
    if gemm:
        sig["MB"] = "i32"
        sig["SPLIT_K"] = "i32"
    return sig


def compile_kernel(
    kw: KernelWeight, path: str, config: dict[str, Any], x_dtype: torch.dtype, cc: int = 90, split_k: int = 2
):
    """Lower one kernel variant to a cubin for compute capability ``cc``; returns Triton's compiled kernel."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise RuntimeError("compile_check needs TRITON_INTERPRET unset: the interpreter does not compile")
    mod = kernel_module(KERNELS)
    cfg = {k: v for k, v in config.items() if k != "num_warps"}
    const: dict[str, Any] = {**kw.constexprs(), **cfg}
    const["ALIGNED"] = _aligned({"G": kw.group_size, "K": kw.k, **cfg})
    if path == "gemv":
        fn = mod.gemv_kernel
        sig = _signature(kw, x_dtype, torch.float32, gemm=False)
    else:
        fn = mod.gemm_kernel
        const.update({"USE_ATOMIC": split_k > 1, "DOT_IEEE": x_dtype == torch.float32})
        y_dtype = x_dtype if split_k == 1 else torch.float32
        sig = _signature(kw, x_dtype, y_dtype, gemm=True)
    sig.update(dict.fromkeys(const, "constexpr"))
    src = ASTSource(fn, sig, const)
    return triton.compile(
        src,
        target=GPUTarget("cuda", cc, 32),
        options={"num_warps": config["num_warps"], "enable_fp_fusion": True},
    )


def compile_jit(fn, args: dict[str, Any], const: dict[str, Any], options: dict[str, Any], cc: int = 90):
    """Compile ``fn`` for ``cc`` as the JIT would specialize these arguments: ``args`` maps each runtime
    argument to a pointer type string ("*fp16", ...) or an int value (multiples of 16 get the divisibility
    hint unless the kernel opts out)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise RuntimeError("compile_check needs TRITON_INTERPRET unset: the interpreter does not compile")
    sig, attrs = {}, {}
    skip = set(getattr(fn, "do_not_specialize", ()) or ())
    for i, name in enumerate(fn.arg_names):
        if name in const:
            sig[name] = "constexpr"
            continue
        value = args[name]
        if isinstance(value, str):
            sig[name], attrs[(i,)] = value, [["tt.divisibility", 16]]
        else:
            sig[name] = "i32"
            if value % 16 == 0 and name not in skip and i not in skip:
                attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(fn, sig, const, attrs)
    return triton.compile(
        src, target=GPUTarget("cuda", cc, 32), options={"enable_fp_fusion": True, **options}
    )


def compile_affine(spec, path: str, config: dict[str, Any], x_dtype: torch.dtype, m: int, cc: int = 90):
    """One affine kernel variant as a plan would launch it for ``m`` rows on a 132-SM GPU."""
    from trilm.kernels.affine.plan import KERNELS as AFFINE_KERNELS
    from trilm.kernels.affine.plan import LaunchPlan, kernel_for

    mod = kernel_module(AFFINE_KERNELS)
    fn = mod.affine_gemv_kernel if path == "gemv" else mod.affine_gemm_kernel
    plan = LaunchPlan(kernel_for(path), spec, path, m, x_dtype, config, sms=132)
    x_t = TORCH_TO_TRITON[x_dtype]
    args = {
        "x_ptr": "*" + x_t, "y_ptr": "*" + x_t, "w_ptr": "*i32", "hi_ptr": "*i32", "s_ptr": _ptr(spec.s),
        "z_ptr": _ptr(spec.z), "mu_ptr": _ptr(spec.mu), "perm_ptr": "*i32", "b_ptr": "*" + x_t,
        "ws_ptr": "*fp32", "cnt_ptr": "*i32", "stride_xm": spec.k, **plan.runtime,
    }  # fmt: skip
    const = {**plan.const, "HAS_BIAS": False}
    return compile_jit(fn, args, const, plan.options, cc), plan


def ptxas_usage(kernel, cc: int) -> tuple[int, int]:
    """(registers, spill stores) that ptxas reports for the kernel's PTX."""
    from triton.backends.nvidia.compiler import get_ptxas

    ptxas = get_ptxas(cc).path
    with tempfile.TemporaryDirectory() as tmp:
        ptx = os.path.join(tmp, "k.ptx")
        with open(ptx, "w") as fh:
            fh.write(kernel.asm["ptx"])
        arch = f"sm_{cc}a" if cc >= 90 else f"sm_{cc}"
        out = subprocess.run(
            [ptxas, "-v", f"--gpu-name={arch}", ptx, "-o", os.path.join(tmp, "k.cubin")],
            capture_output=True,
            text=True,
            check=True,
        ).stderr
    regs = re.search(r"Used (\d+) registers", out)
    spills = re.search(r"(\d+) bytes spill stores", out)
    return int(regs.group(1)) if regs else -1, int(spills.group(1)) if spills else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cc", type=int, default=90, help="compute capability (90 = H100/H200)")
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    parser.add_argument("--dtypes", nargs="+", default=["fp16", "bf16"], choices=sorted(ALIASES))
    parser.add_argument("--paths", nargs="+", default=["gemv", "gemm"], choices=["gemv", "gemm"])
    args = parser.parse_args(argv)
    failures = 0
    for kind in args.kinds:
        kw = prepare(random_packed(kind, 256, 512, scale_dtype=torch.float16))
        for dtype in args.dtypes:
            for path in args.paths:
                if kw.affine is not None:
                    pool = GEMV_CANDIDATES if path == "gemv" else GEMM_CANDIDATES
                    variants = [(bucket, c) for bucket, cs in pool.items() for c in cs]
                else:
                    variants = [(1, c) for c in (GPU_GEMV if path == "gemv" else GPU_GEMM)]
                for bucket, cfg in variants:
                    t0 = time.time()
                    label = f"{kind:12s} {dtype} {path} M{bucket} {cfg}"
                    try:
                        if kw.affine is not None:
                            kernel, _ = compile_affine(
                                kw.affine, path, cfg, parse_dtype(dtype), bucket, args.cc
                            )
                        else:
                            kernel = compile_kernel(kw, path, cfg, parse_dtype(dtype), args.cc)
                        regs, spills = ptxas_usage(kernel, args.cc)
                        print(
                            f"ok   {label} regs={regs} spills={spills}B {time.time() - t0:.1f}s", flush=True
                        )
                    except Exception as exc:  # report every failing variant, then fail
                        failures += 1
                        print(f"FAIL {label}: {type(exc).__name__}: {str(exc)[:400]}", flush=True)
    print(f"{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
