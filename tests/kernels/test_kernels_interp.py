"""Every kernel against its fp64 reference in Triton's CPU interpreter (fp32, small odd shapes, big blocks).

Tolerance: max |y − y_ref| / max |y_ref| ≤ FP32_TOL[kind]. The decode of every format is exact, so the only
error is fp32 accumulation order over K ≤ 384 (observed ≤ 5e-7).
"""

import pytest
import torch

from kernels import prepare, reference_matmul, triton_matmul
from kernels.launch import CPU_GEMV, GPU_GEMM, GPU_GEMV
from kernels.samples import KINDS, random_packed

FP32_TOL = dict.fromkeys(KINDS, 2e-6)

CASES = [
    ("ternary", 97, 333, None),  # per-row scales, odd N and K: one group spans K (aligned path)
    ("ternary", 130, 320, 32),  # groups smaller than BLOCK_K: per-element scales
    ("ternary", 64, 384, 128),  # several groups, each a multiple of BLOCK_K
    ("binary", 97, 333, None),
    ("binary_mean", 130, 320, 64),
    ("nm2:4", 97, 320, None),
    ("nm4:8", 130, 256, 128),
    ("billm", 97, 320, 64),
    ("stbllm", 130, 256, None),
    ("int2", 64, 384, 128),
    ("int3", 130, 333, None),
    ("int4", 97, 320, 64),
    ("int4_act", 97, 256, 64),
    ("pbllm", 97, 320, None),
]
BATCHES = (1, 3, 16, 65)


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.double() - ref.double()).abs().max() / ref.double().abs().max()).item()


def run_case(weight, m: int, seed: int = 1, **launch) -> float:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, weight.in_features, generator=gen)
    y = triton_matmul(x, prepare(weight), **launch)
    assert y.shape == (m, weight.out_features) and y.dtype == x.dtype
    return rel_err(y, reference_matmul(x.double(), weight, torch.float64))


@pytest.mark.parametrize("m", BATCHES)
@pytest.mark.parametrize(("kind", "n", "k", "g"), CASES, ids=[f"{c[0]}-{c[1]}x{c[2]}-g{c[3]}" for c in CASES])
def test_kernel_matches_reference(kind, n, k, g, m):
    weight = random_packed(kind, n, k, group_size=g, seed=n + k)
    assert run_case(weight, m) <= FP32_TOL[kind]


SWEEP_KINDS = ("ternary", "binary_mean", "nm2:4", "billm", "int3", "int4_act", "pbllm")


@pytest.mark.parametrize("kind", SWEEP_KINDS)
def test_gpu_launch_configs_in_interpreter(kind):
    """The GPU autotune configs (small K tiles, split-K GEMM) compute the same thing; only the GPU run can
    check that they compile, but the index arithmetic is checked here."""
    weight = random_packed(kind, 80, 256, group_size=64)
    for cfg in GPU_GEMV:
        assert run_case(weight, 1, path="gemv", config=cfg) <= FP32_TOL[kind], cfg
    for cfg in GPU_GEMM:
        for split in (1, 3):
            err = run_case(weight, cfg["BLOCK_M"] + 3, path="gemm", config={**cfg, "SPLIT_K": split})
            assert err <= FP32_TOL[kind], (cfg, split)


def test_gemv_handles_more_rows_than_its_threshold_and_gemm_a_single_row():
    weight = random_packed("ternary", 70, 200)
    assert run_case(weight, 9, path="gemv") <= 2e-6
    assert run_case(weight, 1, path="gemm") <= 2e-6


def test_fp16_activations_with_native_accumulation():
    """fp16 in, fp16 out; 'native' adds GEMV/split-K partials straight into the fp16 output."""
    weight = random_packed("int4", 96, 256, group_size=64)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 256, generator=gen).half()
    ref = reference_matmul(x.double(), weight, torch.float64)
    for accumulate in ("fp32", "native"):
        y = triton_matmul(x, prepare(weight), accumulate=accumulate, config={**CPU_GEMV, "BLOCK_K": 32})
        assert y.dtype == torch.float16
        assert rel_err(y, ref) <= 5e-3


def test_empty_batch_and_bad_input():
    kw = prepare(random_packed("binary", 32, 64))
    assert triton_matmul(torch.zeros(0, 64), kw).shape == (0, 32)
    with pytest.raises(ValueError, match=r"expected x of shape \(M, 64\)"):
        triton_matmul(torch.zeros(2, 63), kw)


def test_cpu_without_interpreter_refuses_triton(monkeypatch):
    kw = prepare(random_packed("binary", 32, 64))
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        triton_matmul(torch.zeros(1, 64), kw)


def test_gpu_autotuners_build():
    """The autotuner objects validate key / reset names against the kernel signature at construction."""
    from kernels.launch import _tuned

    for kind in ("gemv", "gemm"):
        tuner = _tuned(kind)
        assert "N" in tuner.keys and tuner.reset_to_zero == ["y_ptr"]
