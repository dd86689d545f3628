"""The tensor-core GEMM of the affine formats (batches of 2 rows and more) in Triton's CPU interpreter.

Every affine format (ternary, binary with and without means, int2/3/4, act-order int4) at batch 1, 2, 5
and 16 and odd shapes (N and K not multiples of the tiles, rows of the 16-row block masked), against the
fp64 reference of the same codes. The interpreter's ``tl.dot`` takes fp32, so the plan decodes into fp32
there (``DOT_DTYPE``) and into fp16/bf16 on a GPU (tests/kernels/test_gpu.py). Tolerance: the decode is
exact (small integers c − z) and the group scale multiplies an fp32 dot over ≤ 384 terms, so the error is
fp32 accumulation order (observed ≤ 1e-6; 4e-6 as for every kernel); fp16 activations add the output's
rounding (2^-11).
"""

import pytest
import torch
import triton.language as tl
from trilm.kernels import QuantLinear, prepare, reference_matmul
from trilm.kernels.affine import plan as plans
from trilm.kernels.affine.plan import (
    affine_matmul,
    affine_path,
    candidates,
    dot_dtype,
    gemm_geometry,
    gemm_in_flight,
)
from trilm.kernels.affine.tuning import CUBLAS_MIN_M, TC_MIN_M
from trilm.kernels.launch_model import H200, MIN_PROGRAMS_PER_SM

from trilm.formats.samples import random_packed, relabelled

TOL = 4e-6
CASES = [  # (kind, N, K, group): per-row scales over odd K, groups of 32/64/128
    ("ternary", 97, 333, None),
    ("ternary", 70, 320, 32),
    ("binary", 97, 333, None),
    ("binary_mean", 70, 320, 64),
    ("int2", 64, 384, 128),
    ("int3", 70, 333, None),
    ("int4", 97, 320, 64),
    ("int4_act", 97, 256, 64),
]


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.double() - ref.double()).abs().max() / ref.double().abs().max()).item()


@pytest.mark.parametrize(("kind", "n", "k", "g"), CASES, ids=[f"{c[0]}-{c[1]}x{c[2]}-g{c[3]}" for c in CASES])
def test_gemm_matches_reference_at_decode_batches(kind, n, k, g):
    weight = random_packed(kind, n, k, group_size=g, seed=n + k)
    spec = prepare(weight).affine
    assert spec is not None
    gen = torch.Generator().manual_seed(3)
    for m in (1, 2, 5, 16):
        x = torch.randn(m, k, generator=gen)
        y = affine_matmul(x, spec, path="gemm")
        assert y.shape == (m, n) and y.dtype == x.dtype
        assert rel_err(y, reference_matmul(x.double(), weight, torch.float64)) <= TOL, m


@pytest.mark.parametrize("kind", ["ternary", "binary_mean", "int3", "int4_act"])
def test_gemm_with_k_split_and_bias_at_its_gpu_default(kind):
    """The plan a GPU would launch at batch 16 (BLOCK_M 16, its default tile) with K split 3 ways and a
    bias, on 5 rows: rows 5–15 of the block are masked, split partials summed by the last program."""
    weight = random_packed(kind, 80, 256, group_size=64, seed=5)
    spec = prepare(weight).affine
    cfg = candidates(spec, "gemm", 16, sms=H200.sms)[0]
    assert cfg["BLOCK_M"] == 16
    x, bias = torch.randn(5, 256), torch.randn(80)
    y = affine_matmul(x, spec, path="gemm", config={**cfg, "SPLIT_K": 3}, bias=bias)
    ref = reference_matmul(x.double(), weight, torch.float64) + bias.double()
    assert rel_err(y, ref) <= TOL


def test_fp16_activations_decode_into_fp32_under_the_interpreter():
    weight = random_packed("int4", 96, 256, group_size=64, seed=2)
    spec = prepare(weight).affine
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(4)).half()
    plan = plans.make_plan(spec, "gemm", 5, x.dtype)
    assert plan.const["DOT_DTYPE"] == tl.float32 and plan.const["BLOCK_M"] == 16
    y = plan(x)
    assert y.dtype == torch.float16
    assert rel_err(y, reference_matmul(x.double(), weight, torch.float64)) <= 1e-3


def test_dot_dtype_on_a_gpu_is_the_activation_half_dtype(monkeypatch):
    monkeypatch.setattr(plans, "interpreting", lambda: False)
    assert dot_dtype(torch.float16) == tl.float16
    assert dot_dtype(torch.bfloat16) == tl.bfloat16
    assert dot_dtype(torch.float32) == tl.float32
    with pytest.raises(ValueError, match="fp16, bf16 or fp32 activations"):
        dot_dtype(torch.float64)


def test_batches_of_two_rows_and_more_take_the_tensor_core_path():
    assert TC_MIN_M == 2
    assert affine_path(1) == "gemv"
    assert {affine_path(m) for m in (2, 5, 8, 16, CUBLAS_MIN_M - 1)} == {"gemm"}
    assert affine_path(CUBLAS_MIN_M) == "cublas"
    layer = QuantLinear(random_packed("ternary", 64, 128, seed=1))
    for m in (1, 2, 16):
        x = torch.randn(m, 128)
        assert rel_err(layer(x), reference_matmul(x.double(), layer.packed, torch.float64)) <= TOL
    assert {m: plan.path for (m, _, _), plan in layer._plans.items()} == {1: "gemv", 2: "gemm", 16: "gemm"}


@pytest.mark.parametrize("kind", ["ternary", "binary", "int2", "int4"])
def test_default_decode_plan_keeps_enough_in_flight(kind):
    """At batch 2–16 the default GEMM tile is the first candidate whose grid gives the launch model's
    minimum programs per SM and Little's-law bytes in flight (estimated before compiling): the 128-column
    tile where it does, a 64-column one where K is too short to split (int4 at Spectra's small layers: the
    128-column tile gives under 2 programs per SM); binary takes one stage more than ternary (half the bytes
    per tile).
    The compiled figures are checked in tests/kernels/test_launch_plans.py."""
    for n, k in ((6144, 1280), (4608, 1536), (1536, 4096), (9216, 3072), (8192, 1536)):
        spec = relabelled(kind, n, k).affine
        cfg = candidates(spec, "gemm", 16, sms=H200.sms)[0]
        grid = gemm_geometry(spec, 16, cfg, H200.sms)["grid"]
        assert grid[0] == 1 and cfg["BLOCK_M"] == 16  # the whole decode batch in one 16-row block
        programs, in_flight = gemm_in_flight(spec, 16, cfg, H200.sms)
        assert programs >= MIN_PROGRAMS_PER_SM, (kind, n, k, cfg)
        if n * k * spec.wbits // 8 >= H200.little_bytes_per_sm * H200.sms:  # smaller layers: latency-bound
            assert in_flight >= H200.little_bytes_per_sm, (kind, n, k, cfg)
    wide = candidates(relabelled("ternary", 8192, 1536).affine, "gemm", 16, sms=H200.sms)[0]
    short = candidates(relabelled("int4", 6144, 1280).affine, "gemm", 16, sms=H200.sms)[0]
    assert (wide["BLOCK_N"], short["BLOCK_N"]) == (128, 64)
    ternary = candidates(relabelled("ternary", 4096, 4096).affine, "gemm", 16)
    binary = candidates(relabelled("binary", 4096, 4096).affine, "gemm", 16)
    assert sorted(c["num_stages"] for c in binary) == sorted(c["num_stages"] + 1 for c in ternary)
