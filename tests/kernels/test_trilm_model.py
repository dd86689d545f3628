"""The real TriLM/BiLM decoder runs with its block linears swapped for packed QuantLinear layers.

Codes and scales come from the model's own ``packing_scales`` (the input contract: int8 codes, fp32 scales
(K // g, N)); the packed model's logits must equal the fake-quantized model's, across scale groups.
"""

import pytest
import torch

from kernels import QuantLinear, replace_linears
from trilm.formats import BinaryWeight, TernaryWeight
from trilm.model import build_model, preset
from trilm.model.quant import packing_scales


def pack_model(model):
    """Replace every quantized block linear by a QuantLinear holding its packed codes and scales."""
    targets = {id(m) for m in model.quantized_linears()}

    def make(name, layer):
        codes, scales, _g = packing_scales(layer.weight.detach(), layer.layout)
        if layer.layout.fmt == "binary":
            return QuantLinear(BinaryWeight.pack(codes, scales))
        return QuantLinear(TernaryWeight.pack(codes, scales))

    return replace_linears(model, lambda name, child: id(child) in targets, make)


@pytest.mark.parametrize(
    ("family", "scale_group", "partitions"),
    [("trilm", "shard", 2), ("trilm", "row", 0), ("trilm", "group:32", 0), ("bilm", "shard", 1)],
)
def test_packed_decoder_matches_fake_quant(family, scale_group, partitions):
    cfg = preset(f"{family}-nano", vocab_size=300)
    cfg.quant.scale_group, cfg.quant.partitions = scale_group, partitions
    cfg.validate()
    model = build_model(cfg, seed=1).eval()
    ids = torch.randint(0, 300, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(ids)
        replaced = pack_model(model)
        assert len(replaced) == 4 * cfg.layers  # wqkv, wo, w_gate_up, w_down per block
        assert all(isinstance(model.get_submodule(n), QuantLinear) for n in replaced)
        packed_logits = model(ids)  # prefill rows go through the GEMM kernel
        step = model(ids[:1, :1])  # one token: the GEMV kernel
    err = (packed_logits - expected).abs().max() / expected.abs().max()
    assert err <= 1e-5
    assert torch.allclose(step, expected[:1, :1], rtol=1e-4, atol=1e-5)
