"""Group sizes on real shapes (K = 576, 960, 2880): a clear refusal naming the sizes that divide, or the
nearest divisor per layer (``group_fit="nearest"``), which the packed format and its kernel then use."""

from __future__ import annotations

import pytest
import torch
from trilm.kernels import QuantLinear

from tests.posthoc.conftest import correlated_hessian
from trilm.config import ConfigError
from trilm.posthoc import quantize_layer
from trilm.posthoc.uniform import nearest_group


@pytest.mark.parametrize(
    ("k", "g", "want"), [(576, 128, 96), (960, 128, 96), (2880, 128, 96), (1536, 128, 128)]
)
def test_nearest_group_is_a_kernel_aligned_divisor(k, g, want):
    got = nearest_group(k, g) if k % g else g
    assert got == want and k % got == 0 and got % 32 == 0


def test_a_group_that_does_not_divide_is_refused_with_the_divisors():
    W = torch.randn(32, 576, generator=torch.Generator().manual_seed(0)) * 0.02
    msg = r"group_size=128 does not divide in_features K=576; divisors of 576 near 128: 96, 144; multiples"
    msg += r" of 32 dividing 576: 32, 64, 96, 192, 288, 576"
    with pytest.raises(ConfigError, match=msg):
        quantize_layer("rtn", W, None, bits=4, group_size=128)


@pytest.mark.parametrize("backend", ["torch", "cpu"])
@pytest.mark.parametrize("method", ["rtn", "gptq"])
def test_nearest_fit_packs_and_runs_with_the_chosen_group(method, backend):
    W = torch.randn(64, 576, generator=torch.Generator().manual_seed(1)) * 0.02
    H = correlated_hessian(576, seed=2)
    result = quantize_layer(method, W, H, bits=4, group_size=128, group_fit="nearest")
    packed = result.packed
    assert packed.group_size == 96 and tuple(packed.shape) == (64, 576)
    torch.testing.assert_close(packed.dequantize(), result.weight, atol=1e-6, rtol=0)
    x = torch.randn(3, 576, generator=torch.Generator().manual_seed(3))
    ref = x @ result.weight.t()
    out = QuantLinear(packed, backend=backend)(x).float()
    # the CPU int4 kernel runs bf16 activations: its error bound is bf16's, not the grid's
    tol = 1e-4 if backend == "torch" else 2e-2 * float(ref.abs().max())
    torch.testing.assert_close(out, ref, atol=tol, rtol=0)
