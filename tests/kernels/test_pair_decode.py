"""The GEMV plans that decode two codes per instruction (``"PAIRS": True``, fp16 or bf16 activations).

In the interpreter the kernel runs the very code it runs on a GPU except its inline PTX (Triton's
interpreter cannot run PTX): the and-or is written in Triton there and the two packed FMAs are emulated half
by half (the interpreter's bf16 arithmetic is wrong, so bf16 is done in fp32 and rounded to nearest even by
hand). The word and activation pairing, the magic-number decode, the 2^-EXP scaling and the flushes are all
checked here against fp64. Tolerance: the output is rounded to the activation dtype (2^-11 of |y| in fp16,
2^-8 in bf16) and each half-precision accumulator sums at most 8 products before it is added in fp32, a
rounding of at most one unit of that dtype per addition; both are bounded here by the tolerances the GPU
tests already use (fp16 2e-3, bf16 1e-2 of max |y|). The sm_90 compile shows the packed instructions.
"""

import pytest
import torch
import triton.language as tl
from trilm.kernels import prepare, reference_matmul, triton_matmul
from trilm.kernels.affine.plan import make_plan, pair_dtype
from trilm.kernels.affine.tuning import GEMV_CANDIDATES
from trilm.kernels.aot import compile_affine

from trilm.formats import TernaryWeight
from trilm.formats.samples import random_packed

FP16_TOL = 2e-3
TOL = {torch.float16: FP16_TOL, torch.bfloat16: 1e-2}
PAIRED = [("ternary", 97, 333, None), ("ternary", 130, 320, 32), ("ternary", 64, 384, None),
          ("binary", 97, 352, None), ("binary_mean", 130, 320, 64), ("int2", 64, 384, 128),
          ("int4", 97, 320, 64), ("int4_act", 97, 256, 64)]  # fmt: skip
PAIR_CONFIGS = [c for c in GEMV_CANDIDATES[1] if c.get("PAIRS")]


def _rel(y, ref) -> float:
    return ((y.double() - ref).abs().max() / ref.abs().max()).item()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize(
    ("kind", "n", "k", "g"), PAIRED, ids=[f"{c[0]}-{c[1]}x{c[2]}-g{c[3]}" for c in PAIRED]
)
def test_pair_plans_match_fp64(kind, n, k, g, m, dtype):
    """Every pair candidate, K split three ways (the split-K reduction and the per-group coefficients), at
    odd shapes (the K tail takes the per-element activation loads, K a multiple of 16 the 32-bit ones)."""
    weight = random_packed(kind, n, k, group_size=g, seed=n + k)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(3)).to(dtype)
    ref = reference_matmul(x.double(), weight, torch.float64)
    kw = prepare(weight)
    for cfg in PAIR_CONFIGS:
        plan = make_plan(kw.affine, "gemv", m, x.dtype, {**cfg, "BLOCK_N": 64, "SPLIT_K": 3})
        assert plan.const["PAIR_DTYPE"] == (tl.float16 if dtype == torch.float16 else tl.bfloat16)
        y = triton_matmul(x, kw, path="gemv", config={**cfg, "BLOCK_N": 64, "SPLIT_K": 3})
        assert y.dtype == dtype
        assert _rel(y, ref) <= TOL[dtype], cfg


def test_large_activations_stay_finite():
    """q is scaled by 2^-EXP so that the 8 products an fp16 accumulator takes cannot overflow it for any
    finite fp16 x: eight activations of 60000 against +1 codes in the low halves of the same words sum to
    60000 there (unscaled, 480000: inf), and the result is exact enough."""
    codes = torch.ones(64, 256, dtype=torch.int8)
    weight = TernaryWeight.pack(codes, torch.full((1, 64), 1e-3))
    x = torch.zeros(1, 256)
    x[0, :16] = 6e4
    x = x.half()
    ref = reference_matmul(x.double(), weight, torch.float64)
    y = triton_matmul(x, prepare(weight), path="gemv", config={**PAIR_CONFIGS[0], "BLOCK_N": 64})
    assert torch.isfinite(y).all()
    assert _rel(y, ref) <= FP16_TOL


def test_pairs_only_where_checked():
    """fp16 or bf16 activations and one row of words per unit: int3 keeps two planes per unit, fp32 needs no
    pairs; configs without the key keep the fp32 decode (a tuning cache may hold configs without it)."""
    cases = [("ternary", torch.float16, tl.float16), ("int4", torch.float16, tl.float16),
             ("ternary", torch.bfloat16, tl.bfloat16), ("ternary", torch.float32, tl.float32),
             ("int3", torch.float16, tl.float32)]  # fmt: skip
    for kind, dtype, want in cases:
        spec = prepare(random_packed(kind, 64, 256, seed=2)).affine
        assert pair_dtype(spec, dtype, {"PAIRS": True}) == want, (kind, dtype)
        assert pair_dtype(spec, dtype, {}) == tl.float32


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_pairs_compile_to_packed_instructions(dtype, monkeypatch):
    """At sm_90 the pair decode is packed arithmetic: fma.rn.f16x2 (bf16x2) for the decode and the product,
    none in the fp32 decode of the same plan (``python -m benchmarks.kernels --instructions`` counts SASS)."""
    monkeypatch.delenv("TRITON_INTERPRET")
    spec = prepare(random_packed("ternary", 256, 512)).affine
    packed = "fma.rn.f16x2" if dtype == torch.float16 else "fma.rn.bf16x2"
    for pairs in (False, True):
        kernel, plan = compile_affine(spec, "gemv", {**PAIR_CONFIGS[0], "PAIRS": pairs}, dtype, 1)
        assert (plan.const["PAIR_DTYPE"] != tl.float32) == pairs
        assert (packed in kernel.asm["ptx"]) == pairs


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["ternary", "binary", "int2", "int4"])
def test_pair_plans_on_gpu(kind):
    """The packed FMAs themselves (the interpreter emulates them): every pair candidate at a Llama shape in
    fp16, an activation row that starts 2 bytes past a 4-byte boundary (copied: the activation pairs are
    32-bit loads), and bf16 against its tolerance."""
    weight = random_packed(kind, 4096, 4096, group_size=None if kind in ("ternary", "binary") else 128,
                           device="cuda", seed=6)  # fmt: skip
    kw = prepare(weight)
    base = torch.randn(1, 4097, device="cuda", dtype=torch.float16)
    for x in (base[:, :4096].contiguous(), base[:, 1:]):
        ref = reference_matmul(x.double(), weight, torch.float64)
        for cfg in PAIR_CONFIGS:
            assert _rel(triton_matmul(x, kw, path="gemv", config=cfg), ref) <= FP16_TOL, cfg
    xb = base[:, :4096].to(torch.bfloat16)
    y = triton_matmul(xb, prepare(weight), path="gemv", config=PAIR_CONFIGS[0])
    assert _rel(y, reference_matmul(xb.double(), weight, torch.float64)) <= 1e-2
