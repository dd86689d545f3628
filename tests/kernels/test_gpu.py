"""GPU correctness of the compiled kernels in fp16/bf16 (and fp32 parity with the interpreter's numbers),
at the real launch configs, plus the autotuned QuantLinear path, native fp16 accumulation and CUDA graphs.

Run on a CUDA machine: ``python -m pytest -m gpu tests/kernels -q`` (skipped without CUDA).
Tolerance: max |y − y_ref| / max |y_ref| against the fp64 reference of the same codes, per format and dtype:
fp32 1e-5 (fp32 accumulation only), fp16 2e-3 (output rounding 2^-11, per-element fp16 weights on the
unaligned path), bf16 1e-2 (output rounding 2^-8).
"""

import pytest
import torch

from kernels import QuantLinear, prepare, reference_matmul, triton_matmul
from kernels.launch import GPU_GEMM, GPU_GEMV, m_bucket
from kernels.samples import KINDS, random_packed

pytestmark = pytest.mark.gpu

GPU_TOL = {kind: {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2} for kind in KINDS}
N, K = 768, 2048
BF16_KINDS = ("ternary", "binary_mean", "nm2:4", "billm", "int3", "int4_act", "pbllm")
CASES = [(k, torch.float16) for k in KINDS] + [(k, torch.bfloat16) for k in BF16_KINDS]
CASES += [("ternary", torch.float32), ("int4", torch.float32)]


def rel_err(y, ref):
    return ((y.double() - ref.double()).abs().max() / ref.double().abs().max()).item()


def check(weight, m, dtype, tol, seed=0, **launch):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, weight.in_features, device="cuda", generator=gen).to(dtype)
    y = triton_matmul(x, prepare(weight), **launch)
    assert y.dtype == dtype and y.shape == (m, weight.out_features)
    err = rel_err(y, reference_matmul(x.double(), weight, torch.float64))
    assert err <= tol, (m, launch, err)


def gemm_config(m):
    bucket = m_bucket(m)
    return next(c for c in GPU_GEMM if c["BLOCK_M"] == bucket)


@pytest.mark.parametrize(("kind", "dtype"), CASES, ids=[f"{k}-{str(d)[6:]}" for k, d in CASES])
def test_kernels_match_reference_on_gpu(kind, dtype):
    weight = random_packed(kind, N, K, device="cuda", seed=3)
    for m in (1, 3):
        check(weight, m, dtype, GPU_TOL[kind][dtype], path="gemv", config=GPU_GEMV[0])
    for m in (16, 65):
        check(weight, m, dtype, GPU_TOL[kind][dtype], path="gemm", config=gemm_config(m))


@pytest.mark.parametrize("kind", ["ternary", "int4"])
def test_every_gpu_config(kind):
    weight = random_packed(kind, N, K, device="cuda", seed=4)
    tol = GPU_TOL[kind][torch.float16]
    for cfg in GPU_GEMV:
        check(weight, 1, torch.float16, tol, path="gemv", config=cfg)
    for cfg in GPU_GEMM:
        for split in (1, 4):
            check(weight, cfg["BLOCK_M"], torch.float16, tol, path="gemm", config={**cfg, "SPLIT_K": split})


@pytest.mark.parametrize("kind", ["ternary", "int3", "pbllm"])
def test_autotuned_quant_linear_is_correct_and_repeatable(kind):
    weight = random_packed(kind, N, K, device="cuda", seed=5)
    layer = QuantLinear(weight)
    for m in (1, 16, 64):
        x = torch.randn(m, K, device="cuda", dtype=torch.float16)
        first, second = layer(x), layer(x)  # the first call autotunes (kernel runs repeatedly, output reset)
        ref = reference_matmul(x.double(), weight, torch.float64)
        assert rel_err(first, ref) <= GPU_TOL[kind][torch.float16]
        assert rel_err(second, first) <= 1e-3


def test_native_fp16_accumulation():
    weight = random_packed("ternary", N, K, device="cuda", seed=6)
    for m, path in ((1, "gemv"), (16, "gemm")):
        check(weight, m, torch.float16, 5e-3, path=path, accumulate="native")


def test_llama_shape_ternary_gemv():
    weight = random_packed("ternary", 8192, 8192, device="cuda", seed=7)
    layer = QuantLinear(weight)
    x = torch.randn(1, 8192, device="cuda", dtype=torch.float16)
    assert rel_err(layer(x), reference_matmul(x.double(), weight, torch.float64)) <= 2e-3


def test_cuda_graph_capture_and_replay():
    layers = torch.nn.Sequential(
        QuantLinear(random_packed("ternary", 512, 256, device="cuda", seed=8)),
        torch.nn.SiLU(),
        QuantLinear(random_packed("int4", 256, 512, device="cuda", seed=9)),
    )
    static_x = torch.randn(1, 256, device="cuda", dtype=torch.float16)
    eager = layers(static_x)  # also autotunes outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = layers(static_x)
    graph.replay()
    torch.cuda.synchronize()
    assert rel_err(static_y, eager) <= 1e-3
    static_x.copy_(torch.randn_like(static_x))
    graph.replay()
    assert rel_err(static_y, layers(static_x)) <= 1e-3
