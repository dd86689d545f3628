"""The compact post-hoc layouts (PB-LLM ``partial_binary``, BiLLM/STBLLM ``residual_binary``) through
``QuantLinear``: the Triton path (interpreter here) reads their kernel layouts and must equal the
dequantized weight; the torch path dequantizes them directly."""

import pytest
import torch
from trilm.kernels import QuantLinear, reference_matmul

from tests.formats.test_compact_formats import partial_output, residual_output
from trilm.formats import PartialBinaryWeight, ResidualBinaryWeight

TOL = 2e-6


def rel_err(y, ref):
    return ((y.double() - ref.double()).abs().max() / ref.double().abs().max()).item()


def compact(kind):
    if kind == "pbllm":
        return PartialBinaryWeight.pack(**partial_output(40, 96, 0.1, dtype=torch.float32))
    nm = {"billm": None, "stbllm4:8": (4, 8), "stbllm6:8": (6, 8)}[kind]
    groups = 2 if kind == "billm" else 3
    return ResidualBinaryWeight.pack(
        **residual_output(40, 96, block=32, order=2, groups=groups, nm=nm, dtype=torch.float16)
    )


@pytest.mark.parametrize("kind", ["pbllm", "billm", "stbllm4:8", "stbllm6:8"])
@pytest.mark.parametrize("rows", [1, 5])
def test_compact_layouts_through_quant_linear(kind, rows):
    weight = compact(kind)
    x = torch.randn(rows, 96)
    ref = reference_matmul(x.double(), weight, torch.float64)
    y_triton = QuantLinear(weight)(x)
    y_torch = QuantLinear(weight, backend="torch")(x)
    assert rel_err(y_triton, ref) <= TOL
    assert rel_err(y_torch, ref) <= TOL
