"""The one uniform-grid quantizer (GPTQ's min/max grid): properties, and the original code's RTN fixture."""

import numpy as np
import pytest
import torch

from tests.reference import check_quantizer_fixtures
from trilm.formats import IntWeight, fit_uniform_grid, quantize_to_grid, quantize_uniform


def test_grid_contains_zero_and_handles_all_zero_rows():
    w = torch.tensor([[0.5, 1.0, 2.0], [-3.0, -1.0, -0.5], [0.0, 0.0, 0.0]])
    scale, zero = fit_uniform_grid(w, 2)
    assert scale.tolist() == pytest.approx([2 / 3, 1.0, 2 / 3])  # [0, 2], [-3, 0], [-1, 1]
    assert zero.tolist() == [0.0, 3.0, 2.0]
    codes = quantize_to_grid(w, scale, zero, 2)
    deq = scale.unsqueeze(1) * (codes.float() - zero.unsqueeze(1))
    assert (deq - w).abs().max() <= scale.max() / 2 + 1e-6


def test_symmetric_zero_point_is_mid_grid():
    w = torch.randn(5, 64, generator=torch.Generator().manual_seed(1))
    _, zero = fit_uniform_grid(w, 3, sym=True)
    assert torch.all(zero == 4.0)  # levels −4…+3


@pytest.mark.parametrize(("bits", "g"), [(2, 32), (3, None), (4, 64)])
def test_quantize_uniform_groups_and_packing(bits, g):
    w = torch.randn(16, 128, generator=torch.Generator().manual_seed(bits))
    codes, scales, zeros = quantize_uniform(w, bits, g)
    gs = g or 128
    assert codes.shape == w.shape and scales.shape == (128 // gs, 16) and codes.max() < (1 << bits)
    deq = IntWeight.pack(codes, scales, zeros, bits, scale_dtype=torch.float32).dequantize()
    for j in range(128 // gs):
        block = deq[:, j * gs : (j + 1) * gs]
        assert max(len(torch.unique(row)) for row in block) <= 1 << bits
        err = (block - w[:, j * gs : (j + 1) * gs]).abs().max(dim=1).values
        assert torch.all(err <= scales[j] * 0.5 + 1e-6)


def test_rtn_matches_the_original_gptq_code_bit_for_bit():
    """Bit for bit on any CPU: the grid is a per-row min/max (exact) and each entry is one correctly
    rounded division, a round and a multiplication — no sums whose order an instruction set could change."""
    data = np.load(check_quantizer_fixtures())
    w0 = torch.from_numpy(data["W0"])
    codes, scales, zeros = quantize_uniform(w0, 4, None)
    fake = (scales.t() * (codes.float() - zeros.t())).numpy()
    assert np.array_equal(fake, data["rtn_w4_pc"])
