"""The CPU backend (torch's int4 weight-only kernel) against the fp64 reference, every format, odd shapes.

With bf16 activations an affine weight runs on ``_weight_int4pack_mm_for_cpu``: the result must equal the
fp64 product of the bf16 activations and the exact weights within the kernel's roundings — the scale table
in bf16 (2^-9 relative per weight, up to 8 scales where an int4 group keeps its codes unshifted) and the bf16
output (2^-9 relative), products summed in fp32. Every other dtype, and formats without an affine form,
run on the weight dequantized once: exact in that dtype.
"""

import pytest
import torch
from trilm.kernels import QuantLinear, reference_matmul
from trilm.kernels.cpu import CpuLinearState, Int4Weight

from trilm.formats import PartialBinaryWeight, ResidualBinaryWeight, TernaryWeight
from trilm.formats.samples import KINDS, random_packed

AFFINE = {"ternary", "binary", "binary_mean", "nm2:4", "nm4:8", "int2", "int3", "int4", "int4_act"}
SHAPES = [(37, 96, None), (16, 100, None), (64, 256, 64), (130, 512, 128), (48, 160, 32)]
"""(N, K, group): N not a multiple of 16, K not a multiple of 32 (one group), several groups of each size."""


def _tolerance(weight, x: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """2^-8 of the output plus 2^-8 of Σ|x|·(|w| + 8·|s|) per output: the kernel's rounding budget."""
    args = weight.affine_layout().decode_args()
    _, scales, _, _ = args.affine_codes()
    g = min(args.group_size, args.k)
    s = scales.abs().repeat_interleave(g, 0).t()
    if args.perm is not None:  # scales are per stored column; put them back in input order
        unperm = torch.empty_like(s)
        unperm[:, args.perm] = s
        s = unperm
    w = weight.dequantize(torch.float64).abs()
    return 2**-8 * (ref.abs() + x.double().abs() @ (w + 8 * s.double()).t()) + 1e-12


def _group_fits(kind: str, k: int, group: int | None) -> bool:
    g = group or (128 if kind.startswith("int") and k % 128 == 0 else k)
    return g >= k or g % 32 == 0


def _representable(kind: str, k: int, group: int | None) -> bool:
    """Shapes a format can hold: N:M needs K divisible by M, BiLLM/STBLLM blocks must divide K."""
    if kind in ("nm2:4", "nm4:8", "stbllm") and k % 8:
        return False
    return not (kind in ("billm", "stbllm") and group is not None and k % group)


CASES = [(kind, *shape) for kind in KINDS for shape in SHAPES if _representable(kind, shape[1], shape[2])]


@pytest.mark.parametrize(("kind", "n", "k", "group"), CASES)
def test_cpu_backend_matches_fp64_reference(kind, n, k, group):
    weight = random_packed(kind, n, k, group_size=group, seed=n + k)
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(k)).to(torch.bfloat16)
    ref = reference_matmul(x.double(), weight, torch.float64)
    state = CpuLinearState(weight)
    y = state(x)
    assert y.dtype == torch.bfloat16 and y.shape == (3, n)
    if kind in AFFINE and _group_fits(kind, k, group):
        assert state.int4 is not None, f"{kind} should run on the int4 kernel"
        assert ((y.double() - ref).abs() <= _tolerance(weight, x, ref)).all()
    else:
        assert state.int4 is None
        dense = x.float() @ weight.dequantize(torch.float32).to(torch.bfloat16).float().t()
        assert torch.allclose(y.float(), dense, rtol=2**-7, atol=1e-6)
    y32 = state(x.float())  # any other dtype: dequantized once, exact in fp32
    assert (y32.double() - ref).abs().max() <= 1e-5 * (1 + ref.abs().max())


def test_ternary_layers_are_exact_up_to_bf16_scale_and_output_rounding():
    """Ternary codes are exact in the int4 grid: with scales that bf16 holds exactly, the only rounding left
    is the output's (the fp32 sum of exact products, then one bf16 rounding)."""
    codes = torch.randint(-1, 2, (64, 256), generator=torch.Generator().manual_seed(0))
    scales = torch.full((1, 64), 0.015625)  # 2^-6: exact in bf16
    weight = TernaryWeight.pack(codes, scales)
    x = torch.randn(1, 256, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    y = Int4Weight.convert(weight)(x)
    exact = (x.double() @ weight.dequantize(torch.float64).t()).float()
    assert (
        torch.equal(y, exact.to(torch.bfloat16))
        or (y.float() - exact).abs().max() <= 2**-8 * exact.abs().max()
    )


def test_compact_formats_run_through_their_kernel_layout():
    """PB-LLM and BiLLM compact layouts have no affine form: dequantized once, equal to the reference."""
    from tests.formats.test_compact_formats import partial_output, residual_output

    partial = PartialBinaryWeight.pack(**partial_output(40, 96, 0.1, dtype=torch.float32))
    residual = ResidualBinaryWeight.pack(**residual_output(40, 96, block=32, order=2, groups=2))
    for weight in (partial, residual):
        state = CpuLinearState(weight)
        assert state.int4 is None
        x = torch.randn(2, weight.in_features)
        assert torch.allclose(state(x), reference_matmul(x, weight), rtol=1e-5, atol=1e-6)


def test_quant_linear_cpu_backend_with_bias_and_batch_dims():
    weight = random_packed("int4", 48, 128, group_size=32, seed=3)
    bias = torch.randn(48)
    layer = QuantLinear(weight, bias, backend="cpu")
    x = torch.randn(2, 5, 128)
    expected = reference_matmul(x, weight) + bias
    assert torch.allclose(layer(x), expected, rtol=1e-5, atol=1e-5)  # fp32: exact path
    yb = layer(x.to(torch.bfloat16))
    assert yb.dtype == torch.bfloat16 and yb.shape == (2, 5, 48)
    assert (yb.float() - expected).abs().max() <= 2**-5 * expected.abs().max()
    assert layer.prepare_cpu() is layer.prepare_cpu()  # converted once
    layer.to(torch.device("cpu"))
    assert layer._cpu_state is None  # a move drops it; the next call converts again
