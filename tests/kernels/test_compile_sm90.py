"""The GPU code paths compile for an H100/H200 (sm_90) on a CPU-only machine: Triton lowers them to PTX and
its bundled ptxas assembles a cubin (:mod:`trilm.kernels.aot`).
``python -m benchmarks.kernels.tools.compile_check`` sweeps every config and format; this test covers one
GEMV and one GEMM config per format family in fp16, and bf16 for ternary and int4."""

import pytest
import torch
from trilm.kernels import prepare
from trilm.kernels.affine.plan import candidates
from trilm.kernels.affine.tuning import GEMV_CANDIDATES
from trilm.kernels.aot import compile_affine, compile_kernel
from trilm.kernels.general.launch import GPU_GEMM, GPU_GEMV

from trilm.formats.samples import random_packed

CASES = [(k, torch.float16) for k in ("ternary", "binary_mean", "nm2:4", "billm", "int3", "pbllm")]
CASES += [("ternary", torch.bfloat16), ("int4", torch.bfloat16)]


@pytest.mark.parametrize(("kind", "dtype"), CASES, ids=[f"{k}-{str(d)[6:]}" for k, d in CASES])
def test_compiles_for_sm90(kind, dtype, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET")
    kw = prepare(random_packed(kind, 256, 512, scale_dtype=torch.float16))
    if (
        kw.affine is not None
    ):  # the kernels a QuantLinear launches: GEMV with in-kernel split-K, pipelined GEMM
        gemv, _ = compile_affine(kw.affine, "gemv", {**GEMV_CANDIDATES[1][0], "SPLIT_K": 2}, dtype, 1)
        # the batch-2 decode plan: one 16-row block on tensor cores, weights decoded to the activation dtype
        gemm, plan = compile_affine(kw.affine, "gemm", candidates(kw.affine, "gemm", 2)[0], dtype, 2)
        assert plan.const["BLOCK_M"] == 16 and plan.grid[0] == 1
        assert "cp.async" in gemm.asm["ptx"] or "cp.async.bulk" in gemm.asm["ptx"]  # num_stages ≥ 2
        assert "atom.global" in gemv.asm["ptx"]  # the split-K tile counter
        half = "f16" if dtype == torch.float16 else "bf16"
        assert f".f32.{half}.{half}.f32" in gemm.asm["ptx"]  # mma: half operands, fp32 accumulate
        return
    gemv = compile_kernel(kw, "gemv", GPU_GEMV[0], dtype, cc=90)
    gemm = compile_kernel(kw, "gemm", GPU_GEMM[0], dtype, cc=90, split_k=2)
    for kernel in (gemv, gemm):
        assert len(kernel.asm["cubin"]) > 0 and ".target sm_90a" in kernel.asm["ptx"]
    assert ("red.global" in gemv.asm["ptx"] or "atom.global" in gemv.asm["ptx"]) and "mma" in gemm.asm["ptx"]
