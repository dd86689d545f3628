"""llama.cpp block types as int grids: the bytes trilm writes dequantize, in ``gguf``, to IntWeight's
values."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trilm.formats import (
    FormatError,
    IntWeight,
    fit_ggml_grid,
    from_tensors,
    ggml_blocks,
    ggml_codes,
    ggml_type_of,
)

gguf = pytest.importorskip("gguf", reason="the gguf package reads the blocks back")


def on_grid(w: torch.Tensor, qtype: str) -> IntWeight:
    n, k = w.shape
    blocks = w.reshape(n, k // 32, 32).transpose(0, 1).reshape(-1, 32)
    scale, zero, mins = fit_ggml_grid(blocks, qtype)
    bits = 8 if qtype == "q8_0" else 4
    codes = ggml_codes(blocks, scale, zero, mins, bits).reshape(k // 32, n, 32).transpose(0, 1).reshape(n, k)
    table = [None if t is None else t.reshape(k // 32, n) for t in (scale, zero, mins)]
    return IntWeight.pack(codes, table[0], table[1], bits, mins=table[2])


@pytest.mark.parametrize("qtype", ["q4_0", "q4_1", "q8_0"])
def test_blocks_read_back_bit_for_bit(qtype):
    torch.manual_seed(0)
    w = torch.randn(24, 96) * torch.logspace(-6, 2, 24).unsqueeze(1)
    w[3, :32] = 0.0  # an all-zero block: scale 0
    w[5, 32:64] = 1.5  # a constant block
    packed = on_grid(w, qtype)
    assert ggml_type_of(packed) == (qtype, "")
    kind = gguf.GGMLQuantizationType[qtype.upper()]
    got = gguf.quants.dequantize(ggml_blocks(packed, qtype), kind)
    want = packed.dequantize().numpy()
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    # llama.cpp's own quantizer, which rounds its scale after choosing codes, is no better than the fit
    ours = float(np.abs(want - w.numpy()).mean())
    theirs = float(
        np.abs(gguf.quants.dequantize(gguf.quants.quantize(w.numpy(), kind), kind) - w.numpy()).mean()
    )
    assert ours <= theirs * 1.01
    again = from_tensors(packed.to_tensors(), packed.meta())
    assert torch.equal(again.dequantize(), packed.dequantize())


def test_weights_off_the_grids_are_named():
    torch.manual_seed(1)
    w = torch.randn(8, 64)
    assert ggml_type_of(IntWeight.from_float(w, 4, group_size=64))[1].startswith("group size 64")
    asym = IntWeight.from_float(w, 4, group_size=32)
    found, why = ggml_type_of(asym)
    assert found is None and "zero points" in why
    fp32 = IntWeight.from_float(w, 4, group_size=32, sym=True, scale_dtype=torch.float32)
    assert "float32 scales" in ggml_type_of(fp32)[1]
    with pytest.raises(FormatError, match="q4_0: this weight is not on its grid"):
        ggml_blocks(asym, "q4_0")
    with pytest.raises(FormatError, match="beyond fp16"):
        fit_ggml_grid(torch.full((1, 32), 1e6), "q4_0")


@pytest.mark.parametrize("qtype", ["q4_0", "q4_1", "q8_0"])
def test_the_kernels_serve_the_grids(qtype):
    from trilm.kernels import QuantLinear, prepare

    torch.manual_seed(2)
    packed = on_grid(torch.randn(32, 64), qtype)
    x = torch.randn(3, 64)
    assert torch.equal(QuantLinear(packed)(x), x @ packed.dequantize().t())
    if qtype == "q4_1":  # one offset table in the general kernels: zeros or mins, not both
        with pytest.raises(ValueError, match="affine kernels only"):
            prepare(packed, general=True)
