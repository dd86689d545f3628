"""GPU correctness of the compiled kernels in fp16/bf16 (and fp32 parity with the interpreter's numbers),
at the real launch configs, plus the autotuned QuantLinear path, native fp16 accumulation and CUDA graphs.

Run on a CUDA machine: ``python -m pytest -m gpu tests/kernels -q`` (skipped without CUDA). Every kernel
compile and autotuning costs the GPU run seconds, so cases that repeat a path at another format, dtype or
batch are also marked ``slow``: ``-m "gpu and not slow"`` (the GPU suite's fast run) keeps one case per path.
Tolerance: max |y − y_ref| / max |y_ref| against the fp64 reference of the same codes, per format and dtype:
fp32 1e-5 (fp32 accumulation only), fp16 2e-3 (output rounding 2^-11, per-element fp16 weights on the
unaligned path), bf16 1e-2 (output rounding 2^-8).
"""

import pytest
import torch
from trilm.kernels import QuantLinear, prepare, reference_matmul, triton_matmul
from trilm.kernels.affine.plan import candidates
from trilm.kernels.general.launch import GPU_GEMM, GPU_GEMV, m_bucket

from trilm.formats.samples import KINDS, random_packed

pytestmark = pytest.mark.gpu

GPU_TOL = {kind: {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2} for kind in KINDS}
N, K = 768, 2048
BF16_KINDS = ("ternary", "binary_mean", "nm2:4", "billm", "int3", "int4_act", "pbllm")
CASES = [(k, torch.float16) for k in KINDS] + [(k, torch.bfloat16) for k in BF16_KINDS]
CASES += [("ternary", torch.float32), ("int4", torch.float32)]
FAST_CASES = {("ternary", torch.float16), ("binary", torch.float16), ("int4", torch.float16)}
FAST_CASES |= {("ternary", torch.bfloat16)}


def _param(*values, fast: bool, name: str):
    return pytest.param(*values, id=name, marks=() if fast else pytest.mark.slow)


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


@pytest.mark.parametrize(
    ("kind", "dtype"), [_param(k, d, fast=(k, d) in FAST_CASES, name=f"{k}-{str(d)[6:]}") for k, d in CASES]
)
def test_kernels_match_reference_on_gpu(kind, dtype):
    weight = random_packed(kind, N, K, device="cuda", seed=3)
    spec = prepare(weight).affine
    for m in (1, 3, 8):
        if spec is not None:
            check(weight, m, dtype, GPU_TOL[kind][dtype], path="gemv", config=candidates(spec, "gemv", m)[0])
        elif m <= 4:
            check(weight, m, dtype, GPU_TOL[kind][dtype], path="gemv", config=GPU_GEMV[0])
    for m in (16, 65):
        cfg = candidates(spec, "gemm", m)[0] if spec is not None else gemm_config(m)
        check(weight, m, dtype, GPU_TOL[kind][dtype], path="gemm", config=cfg)
    if spec is not None:
        check(weight, 600, dtype, GPU_TOL[kind][dtype], path="cublas")


TC_CASES = [(k, d) for k in ("ternary", "binary", "binary_mean", "int2", "int4", "int4_act")
            for d in (torch.float16, torch.bfloat16)]  # fmt: skip


@pytest.mark.parametrize(
    ("kind", "dtype"),
    [_param(k, d, fast=(k, d) == ("ternary", torch.float16), name=f"{k}-{str(d)[6:]}") for k, d in TC_CASES],
)
def test_tensor_core_gemm_at_decode_batches(kind, dtype):
    """Batches of 2–16 rows take the tensor-core GEMM by default: weights decoded to fp16/bf16 (mma with
    fp32 accumulation), one 16-row block; odd N, rows masked."""
    from trilm.kernels.affine.plan import affine_path

    weight = random_packed(kind, N - 3, K, device="cuda", seed=21)
    layer = QuantLinear(weight)
    for m in (2, 5, 16):
        assert affine_path(m) == "gemm"
        x = torch.randn(m, K, device="cuda").to(dtype)
        y = layer(x)
        assert y.dtype == dtype
        assert rel_err(y, reference_matmul(x.double(), weight, torch.float64)) <= GPU_TOL[kind][dtype], m


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["ternary", "int3"])
def test_every_gpu_config(kind):
    """Every affine candidate (GEMV per batch bucket with K split 4 ways, GEMM per M bucket with K split 2
    ways) compiles, fits and is correct; the general GEMV configs too. Each is a compile, so two formats:
    the one-plane and the two-plane decode."""
    weight = random_packed(kind, N, K, device="cuda", seed=4)
    spec = prepare(weight).affine
    tol = GPU_TOL[kind][torch.float16]
    for m in (1, 2, 4, 8):
        for cfg in candidates(spec, "gemv", m):
            check(weight, m, torch.float16, tol, path="gemv", config={**cfg, "SPLIT_K": 4})
    for m in (16, 32, 64, 128, 256):
        for cfg in candidates(spec, "gemm", m):
            check(weight, m, torch.float16, tol, path="gemm", config={**cfg, "SPLIT_K": 2})
    general = prepare(weight, general=True)
    x = torch.randn(1, K, device="cuda", dtype=torch.float16)
    for cfg in GPU_GEMV:
        y = triton_matmul(x, general, path="gemv", config=cfg)
        assert rel_err(y, reference_matmul(x.double(), weight, torch.float64)) <= tol


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["ternary", "int3", "pbllm"])
def test_autotuned_quant_linear_is_correct_and_repeatable(kind):
    """The first call per batch bucket tunes (affine formats: candidates timed, the winner persisted to the
    tuning cache); later calls, and a fresh layer reading the cache, give the same result."""
    from trilm.kernels.affine.tuning import TuningCache, default_cache_path

    weight = random_packed(kind, N, K, device="cuda", seed=5)
    layer = QuantLinear(weight)
    for m in (1, 16, 64):
        x = torch.randn(m, K, device="cuda", dtype=torch.float16)
        first, second = layer(x), layer(x)
        ref = reference_matmul(x.double(), weight, torch.float64)
        assert rel_err(first, ref) <= GPU_TOL[kind][torch.float16]
        assert torch.equal(second, first) or kind == "pbllm"  # pbllm: atomics, order varies
        assert rel_err(QuantLinear(weight)(x), first) <= 1e-3
    if prepare(weight).affine is not None:
        entries = TuningCache(default_cache_path()).entries
        assert {key.split("|")[7] for key in entries} == {"M1", "M16", "M64"}


def test_native_fp16_accumulation():
    weight = random_packed("nm2:4", N, K, device="cuda", seed=6)
    for m, path in ((1, "gemv"), (16, "gemm")):
        check(weight, m, torch.float16, 5e-3, path=path, accumulate="native")


@pytest.mark.parametrize(
    ("kind", "m"),
    [
        _param(k, m, fast=(k, m) == ("ternary", 1), name=f"{k}-{m}")
        for k, m in [("ternary", 1), ("binary", 1), ("int4", 8), ("int4_act", 1), ("ternary", 16)]
    ],
)
def test_one_kernel_launch_per_call(kind, m):
    """Counted by the CUDA profiler: a steady-state QuantLinear call (bias fused) is one kernel."""
    layer = QuantLinear(
        random_packed(kind, 4096, 4096, device="cuda", seed=11), torch.randn(4096, device="cuda")
    )
    x = torch.randn(m, 4096, device="cuda", dtype=torch.float16)
    layer(x)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        layer(x)
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert len(kernels) == 1 and kernels[0].startswith("affine_"), kernels


@pytest.mark.slow
def test_graph_captured_model_equals_eager():
    """A stack of packed layers (split-K GEMV, GEMM) captured in one graph gives eager's outputs exactly,
    replay after replay (the split-K counters are left zeroed by every launch)."""
    layers = torch.nn.Sequential(
        QuantLinear(random_packed("ternary", 2048, 2048, device="cuda", seed=12)),
        torch.nn.SiLU(),
        QuantLinear(
            random_packed("int4", 1024, 2048, device="cuda", seed=13), torch.randn(1024, device="cuda")
        ),
        QuantLinear(random_packed("binary_mean", 4096, 1024, group_size=128, device="cuda", seed=14)),
    )
    for m in (1, 3, 16):
        static_x = torch.randn(m, 2048, device="cuda", dtype=torch.float16)
        eager = layers(static_x).clone()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_y = layers(static_x)
        for _ in range(3):
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(static_y, eager)
        static_x.copy_(torch.randn_like(static_x))
        graph.replay()
        assert torch.equal(static_y, layers(static_x))


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
