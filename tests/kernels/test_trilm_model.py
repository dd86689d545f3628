"""The real decoder runs with its block linears swapped for packed QuantLinear layers (kernels.model).

Codes and scales come from the model's own ``packing_scales`` (the input contract: int8 codes, fp32 scales
(K // g, N)); the packed model's logits must equal the fake-quantized model's, across scale groups.
"""

import pytest
import torch

from kernels import QuantLinear
from kernels.model import pack_decoder
from trilm.model import build_model, preset


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
        replaced = pack_decoder(model)
        assert len(replaced) == 4 * cfg.layers  # wqkv, wo, w_gate_up, w_down per block
        assert all(isinstance(model.get_submodule(n), QuantLinear) for n in replaced)
        packed_logits = model(ids)  # prefill rows go through the GEMM kernel
        step = model(ids[:1, :1])  # one token: the GEMV kernel
    err = (packed_logits - expected).abs().max() / expected.abs().max()
    assert err <= 1e-5
    assert torch.allclose(step, expected[:1, :1], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("fmt", ["int2", "int3", "int4"])
def test_floatlm_packed_to_int_matches_its_dequantized_weights(fmt):
    model = build_model(preset("floatlm-nano", vocab_size=300), seed=2).eval()
    reference = build_model(preset("floatlm-nano", vocab_size=300), seed=2).eval()
    ids = torch.randint(0, 300, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        float_logits = model(ids)
        replaced = pack_decoder(model, fmt, group_size=32)
        packed_logits = model(ids)
        # the same function with the dequantized weights put back into an ordinary float model
        for name in replaced:
            layer = reference.get_submodule(name)
            layer.weight.copy_(model.get_submodule(name).packed.dequantize(torch.float32))
        expected = reference(ids)
    assert (packed_logits - expected).abs().max() / expected.abs().max() <= 1e-5
    assert not torch.allclose(packed_logits, float_logits)


def test_pack_decoder_refuses_mismatched_formats():
    with pytest.raises(ValueError, match="no native low-bit format"):
        pack_decoder(build_model(preset("floatlm-nano", vocab_size=300)))
    with pytest.raises(ValueError, match="packed with fmt='native'"):
        pack_decoder(build_model(preset("trilm-nano", vocab_size=300)), "int4")
