"""Every kernel against its fp64 reference in Triton's CPU interpreter (fp32, small odd shapes, big blocks).

Tolerance: max |y − y_ref| / max |y_ref| ≤ FP32_TOL[kind]. The decode of every format is exact, so the only
error is fp32 arithmetic over K ≤ 384: accumulation order (observed ≤ 5e-7), and for the affine GEMV the
difference ``2^bits·ΣA − (2^bits + z)·ΣX`` of two sums of the size of the result (observed ≤ 1.3e-6).
"""

import pytest
import torch
from trilm.kernels import prepare, reference_matmul, triton_matmul
from trilm.kernels.affine.plan import affine_matmul
from trilm.kernels.affine.tuning import GEMM_CANDIDATES, GEMV_CANDIDATES
from trilm.kernels.general.launch import GENERAL_INTERP_GEMV, GPU_GEMM, GPU_GEMV

from trilm.formats.samples import KINDS, random_packed

FP32_TOL = dict.fromkeys(KINDS, 4e-6)
AFFINE_KINDS = ("ternary", "binary", "binary_mean", "int2", "int3", "int4", "int4_act")

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
BATCHES = (1, 3, 8, 16, 65)


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.double() - ref.double()).abs().max() / ref.double().abs().max()).item()


def run_case(weight, m: int, seed: int = 1, general: bool = False, **launch) -> float:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, weight.in_features, generator=gen)
    y = triton_matmul(x, prepare(weight, general=general), **launch)
    assert y.shape == (m, weight.out_features) and y.dtype == x.dtype
    return rel_err(y, reference_matmul(x.double(), weight, torch.float64))


@pytest.mark.parametrize("m", BATCHES)
@pytest.mark.parametrize(("kind", "n", "k", "g"), CASES, ids=[f"{c[0]}-{c[1]}x{c[2]}-g{c[3]}" for c in CASES])
def test_kernel_matches_reference(kind, n, k, g, m):
    """The default path per format: affine kernels (ternary, binary, int), general kernels for the rest."""
    weight = random_packed(kind, n, k, group_size=g, seed=n + k)
    assert (prepare(weight).affine is not None) == (kind in AFFINE_KINDS)
    assert run_case(weight, m) <= FP32_TOL[kind]


@pytest.mark.parametrize("kind", ["ternary", "binary_mean", "int3", "int4_act"])
def test_affine_gpu_configs_in_interpreter(kind):
    """The GPU candidate configs of the affine kernels with K split 3 ways (the last program of a tile
    reduces the partials and zeroes its counter) compute the same thing: every config for ternary and int3
    (the two-plane unit), the first per bucket for the others. The GPU run checks that they compile and run
    fast; the index arithmetic is checked here."""
    weight = random_packed(kind, 80, 256, group_size=64 if kind != "binary" else None, seed=5)
    full = kind in ("ternary", "int3")
    for bm, configs in GEMV_CANDIDATES.items():
        for cfg in configs if full else configs[:1]:
            err = run_case(weight, bm, path="gemv", config={**cfg, "SPLIT_K": 3})
            assert err <= FP32_TOL[kind], (bm, cfg)
    for bucket, configs in GEMM_CANDIDATES.items():
        for cfg in configs if full else configs[:1]:
            err = run_case(weight, min(bucket, 20) + 1, path="gemm", config={**cfg, "SPLIT_K": 3})
            assert err <= FP32_TOL[kind], cfg


def test_split_k_counters_are_left_zeroed_for_the_next_call():
    from trilm.kernels.affine.plan import Workspace

    weight = random_packed("ternary", 96, 320, seed=2)
    spec = prepare(weight).affine
    x = torch.randn(3, 320)
    first = affine_matmul(x, spec, path="gemv", config={**GEMV_CANDIDATES[4][0], "SPLIT_K": 4})
    ws = Workspace.get(x.device, 0)
    assert ws.counters.numel() and int(ws.counters.abs().sum()) == 0
    again = affine_matmul(x, spec, path="gemv", config={**GEMV_CANDIDATES[4][0], "SPLIT_K": 4})
    assert torch.equal(first, again)  # partials summed in split order: deterministic


@pytest.mark.parametrize("kind", ["ternary", "binary_mean", "int3", "int4_act"])
def test_cublas_path_dequantizes_in_input_order(kind):
    """Large batches: one dequantize kernel writes W^T (act-order rows back in place), then a matmul."""
    weight = random_packed(kind, 70, 256, group_size=64, seed=9)
    assert run_case(weight, 33, path="cublas") <= FP32_TOL[kind]
    bias = torch.randn(70)
    x = torch.randn(5, 256)
    y = affine_matmul(x, prepare(weight).affine, path="cublas", bias=bias)
    ref = reference_matmul(x.double(), weight, torch.float64) + bias.double()
    assert rel_err(y, ref) <= FP32_TOL[kind]


GENERAL_SWEEP = ("ternary", "nm2:4", "billm", "int3", "pbllm")


@pytest.mark.parametrize("kind", GENERAL_SWEEP)
def test_general_kernel_configs_in_interpreter(kind):
    """The general kernels (every format; the only ones for N:M, multi-plane and PB-LLM) at their GPU
    autotune configs (small K tiles, split-K GEMM)."""
    weight = random_packed(kind, 80, 256, group_size=64)
    for cfg in GPU_GEMV:
        assert run_case(weight, 1, general=True, path="gemv", config=cfg) <= FP32_TOL[kind], cfg
    for i, cfg in enumerate(GPU_GEMM[::2]):
        err = run_case(
            weight, cfg["BLOCK_M"] + 3, general=True, path="gemm", config={**cfg, "SPLIT_K": 1 + 2 * (i % 2)}
        )
        assert err <= FP32_TOL[kind], cfg


def test_gemv_handles_more_rows_than_its_threshold_and_gemm_a_single_row():
    weight = random_packed("nm2:4", 70, 200)
    assert run_case(weight, 9, path="gemv") <= 2e-6
    assert run_case(weight, 1, path="gemm") <= 2e-6
    ternary = random_packed("ternary", 70, 200)
    assert run_case(ternary, 1, path="gemm") <= 2e-6
    with pytest.raises(ValueError, match="at most 8 rows"):
        run_case(ternary, 9, path="gemv")


def test_fp16_activations_with_native_accumulation():
    """fp16 in, fp16 out; 'native' adds GEMV/split-K partials straight into the fp16 output."""
    weight = random_packed("int4", 96, 256, group_size=64)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 256, generator=gen).half()
    ref = reference_matmul(x.double(), weight, torch.float64)
    assert rel_err(triton_matmul(x, prepare(weight)), ref) <= 5e-3  # affine: fp16 in and out, one launch
    for accumulate in ("fp32", "native"):
        general = prepare(weight, general=True)
        y = triton_matmul(x, general, accumulate=accumulate, config={**GENERAL_INTERP_GEMV, "BLOCK_K": 32})
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
    from trilm.kernels.general.launch import _tuned

    for kind in ("gemv", "gemm"):
        tuner = _tuned(kind)
        assert "N" in tuner.keys and tuner.reset_to_zero == ["y_ptr"]
