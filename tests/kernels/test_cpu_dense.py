"""Float linears prepacked for oneDNN (bf16, CPU) against the fp64 reference, odd shapes, eager and compiled.

The product is oneDNN's bf16 GEMM: bf16 inputs (exact in fp64), products summed in fp32, one bf16 rounding
of the output. So the result must equal the fp64 product of the same bf16 tensors within 2^-8 of the output
(the rounding, with margin) plus 2^-16 of Σ|x|·|w| (the fp32 sum over at most a few thousand terms).
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from trilm.kernels.cpu_dense import PrepackedLinear, prepack_float_linears, supported

pytestmark = pytest.mark.skipif(not supported(), reason="oneDNN's bf16 linear is unavailable on this CPU")

SHAPES = [(37, 96), (16, 100), (130, 512), (4099, 64), (5, 3)]
"""(N, K): neither a multiple of oneDNN's blocks, a vocabulary-like N, a degenerate K."""


def _weight_and_input(n, k, rows, seed=0):
    gen = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=gen) / k**0.5).to(torch.bfloat16)
    x = torch.randn(*rows, k, generator=gen).to(torch.bfloat16)
    return w, x


def _within_rounding(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> bool:
    ref = x.double() @ w.double().t()
    budget = 2**-8 * ref.abs() + 2**-16 * (x.double().abs() @ w.double().abs().t()) + 1e-30
    return bool(((y.double() - ref).abs() <= budget).all())


@pytest.mark.parametrize(("n", "k"), SHAPES)
@pytest.mark.parametrize("rows", [(1,), (3,), (2, 7)])
def test_prepacked_linear_matches_fp64_reference(n, k, rows):
    w, x = _weight_and_input(n, k, rows, seed=n + k)
    layer = PrepackedLinear(w)
    y = layer(x)
    assert y.dtype == torch.bfloat16 and y.shape == (*rows, n)
    assert _within_rounding(y, x, w)
    dense = F.linear(x, w)  # the layer it replaces: the same GEMM up to the order of the fp32 sums
    assert (y.float() - dense.float()).abs().max() <= 2**-7 * dense.float().abs().max()


def test_prepacked_linear_takes_a_strided_input():
    w, x = _weight_and_input(40, 64, (3, 5))
    last = x[:, -1:]  # what a prefill hands the head: the last position of each sequence, a strided view
    assert not last.is_contiguous()
    assert _within_rounding(PrepackedLinear(w)(last), last.contiguous(), w)


def test_prepacked_linear_compiles_to_the_same_result():
    w, x = _weight_and_input(96, 64, (2, 3), seed=3)
    layer = PrepackedLinear(w)

    def block(t):  # the scaling by 2 is exact: the compiled graph feeds the op the eager input
        return layer(t * 2)

    compiled = torch.compile(block, fullgraph=True)
    with torch.no_grad():
        assert torch.equal(compiled(x), block(x))


def test_prepacked_linear_refuses_other_dtypes_by_name():
    with pytest.raises(ValueError, match="2-D bf16 CPU weight, got torch.float32"):
        PrepackedLinear(torch.zeros(4, 8))
    layer = PrepackedLinear(torch.zeros(4, 8, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="bf16 activations, got torch.float32"):
        layer(torch.zeros(1, 8))


def test_prepack_float_linears_converts_only_bias_free_bf16_linears():
    model = nn.Module()
    model.a = nn.Linear(8, 4, bias=False).to(torch.bfloat16)
    model.b = nn.Linear(8, 4, bias=True).to(torch.bfloat16)
    model.c = nn.Linear(8, 4, bias=False)  # fp32: stays
    model.sub = nn.Module()
    model.sub.d = nn.Linear(8, 4, bias=False).to(torch.bfloat16)
    w = model.sub.d.weight.detach().clone()
    assert prepack_float_linears(model, ["a", "b", "c", "sub.d"]) == 2
    assert [type(m).__name__ for m in (model.a, model.b, model.c, model.sub.d)] == [
        "PrepackedLinear",
        "Linear",
        "Linear",
        "PrepackedLinear",
    ]
    x = torch.randn(2, 8).to(torch.bfloat16)
    assert _within_rounding(model.sub.d(x), x, w)
