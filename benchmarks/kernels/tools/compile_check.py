"""Compile the GPU kernels ahead of time for an NVIDIA target, without a GPU (Triton bundles ptxas).

Usage: ``python -m benchmarks.kernels.tools.compile_check [--cc 90] [--kinds ternary int3 ...]
[--dtypes fp16 bf16]``
       ``python -m benchmarks.kernels.tools.instructions``   (SASS instructions per weight of each kernel)

Every (format, GEMV/GEMM config, activation dtype) a GPU run can pick is lowered to PTX and assembled to a
cubin for the target, so code that only the GPU path reaches (``tl.dot`` shapes, fp16/bf16 casts, atomics,
pipelining) is checked on a CPU-only machine; ternary, binary and int weights go through the affine kernels,
the other formats through the general ones. It prints per kernel the registers ptxas reports and any
spills. The compiler is :mod:`trilm.kernels.aot` (this is its sweep); must run without ``TRITON_INTERPRET``.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from trilm.kernels.affine.tuning import GEMM_CANDIDATES, GEMV_CANDIDATES
from trilm.kernels.aot import compile_affine, compile_kernel, ptxas_usage
from trilm.kernels.dispatch import prepare
from trilm.kernels.general.launch import GPU_GEMM, GPU_GEMV

from trilm.dtypes import ALIASES, parse_dtype
from trilm.formats.samples import KINDS, random_packed


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
