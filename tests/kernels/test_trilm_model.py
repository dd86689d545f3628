"""A decoder served with packed QuantLinear block layers computes the trained model's function (Triton path).

TriLM/BiLM: the inference model packs the latent weights with the model's own quantizer (ternary/binary codes
and the scales of its scale groups, ``trilm.infer.from_state_dict(pack_native=True)``); its logits must
equal the fake-quantized training decoder's, across scale groups, for a prefill (GEMM) and one token (GEMV).
FloatLM: block linears packed to int2/3/4 compute exactly their dequantized weights.
"""

import pytest
import torch
from trilm.kernels import QuantLinear

from trilm.infer import from_state_dict
from trilm.model import build_model, preset


@pytest.mark.parametrize(
    ("family", "scale_group", "partitions"),
    [("trilm", "shard", 2), ("trilm", "row", 0), ("trilm", "group:32", 0), ("bilm", "shard", 1)],
)
def test_packed_decoder_matches_fake_quant(family, scale_group, partitions):
    cfg = preset(f"{family}-nano", vocab_size=300)
    cfg.quant.scale_group, cfg.quant.partitions = scale_group, partitions
    cfg.validate()
    train = build_model(cfg, seed=1).eval()
    ids = torch.randint(0, 300, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = train(ids)
        packed = from_state_dict(train.cfg, train.full_state_dict(), pack_native=True, backend="triton")
        layers = packed.linear_modules()
        assert len(layers) == 7 * cfg.layers
        assert all(isinstance(m, QuantLinear) for m in layers.values())
        packed_logits = packed(ids)  # prefill rows go through the GEMM kernel
        step = packed(ids[:1, :1])  # one token: the GEMV kernel
    err = (packed_logits - expected).abs().max() / expected.abs().max()
    assert err <= 1e-5
    assert torch.allclose(step, expected[:1, :1], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("bits", [2, 3, 4])
def test_floatlm_packed_to_int_matches_its_dequantized_weights(bits):
    train = build_model(preset("floatlm-nano", vocab_size=300), seed=2).eval()
    model = from_state_dict(train.cfg, train.full_state_dict())
    reference = from_state_dict(train.cfg, train.full_state_dict())
    ids = torch.randint(0, 300, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        float_logits = model(ids)
        for name, layer in model.linear_modules().items():
            packed = QuantLinear.from_float(layer.weight, "int", bits=bits, group_size=32, backend="triton")
            model.set_linear(name, packed)
            # the same function with the dequantized weights put back into an ordinary float model
            reference.linear_modules()[name].weight.copy_(packed.packed.dequantize(torch.float32))
        packed_logits = model(ids)
        expected = reference(ids)
    assert (packed_logits - expected).abs().max() / expected.abs().max() <= 1e-5
    assert not torch.allclose(packed_logits, float_logits)
