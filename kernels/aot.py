"""Ahead-of-time compilation of the GPU kernels for an NVIDIA target, without a GPU (Triton bundles ptxas).

A kernel variant — a format's weights, a GEMV/GEMM config, an activation dtype — is lowered to PTX and
assembled to a cubin for the target, so code that only the GPU path reaches (``tl.dot`` shapes, fp16/bf16
casts, atomics, pipelining) is checked on a CPU-only machine; ternary, binary and int weights go through the
affine kernels (:func:`compile_affine`, as a launch plan would launch them), the other formats through the
general ones (:func:`compile_kernel`). Arguments are specialized as Triton's JIT would for LLaMA-sized
layers (pointers and sizes divisible by 16), so vectorization matches a real launch; :func:`ptxas_usage`
reads the registers and spills ptxas reports. Needs ``TRITON_INTERPRET`` unset: the interpreter does not
compile.

Used by ``tests/kernels/test_compile_sm90.py``, the launch-plan table (:mod:`trilm.kernels.launch_plans`) and
the offline tools ``python -m benchmarks.kernels.tools.compile_check`` (every config of every format) and
``python -m benchmarks.kernels --instructions`` (SASS instructions per weight).
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from typing import Any

import torch
from trilm.kernels.general.launch import KERNELS, KernelWeight, _aligned
from trilm.kernels.triton_runtime import kernel_module

TORCH_TO_TRITON = {
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.float32: "fp32",
    torch.int32: "i32",
    torch.int16: "i16",
    torch.uint8: "u8",
}


def _require_compiler() -> None:
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise RuntimeError(
            "compiling for a GPU target needs TRITON_INTERPRET unset: the interpreter does not compile"
        )


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
    # deferred for start-up time: loads triton only when a kernel is compiled
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    _require_compiler()
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
    # deferred for start-up time: loads triton only when a kernel is compiled
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    _require_compiler()
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
    # deferred for start-up time: the affine kernels load triton
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
    from triton.backends.nvidia.compiler import get_ptxas  # deferred for start-up time: loads triton

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
