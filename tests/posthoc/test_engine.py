"""The block-wise driver: quantized stream, true-sequential order, packed layers equal the model's weights."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.posthoc.conftest import tiny_model
from trilm.config import ConfigError
from trilm.infer.model import block_linears
from trilm.posthoc import UniformConfig
from trilm.posthoc.engine import EngineConfig, collect_inputs, quantize_blockwise, run_block
from trilm.posthoc.hessian import HessianAccumulator
from trilm.posthoc.layerwise import LayerwiseMethod


def windows(n: int = 8, seq: int = 32, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 2048, (n, seq), generator=torch.Generator().manual_seed(seed))


def quantize(model, method="gptq", **kw):
    seq = kw.pop("true_sequential", False)
    cfg = UniformConfig(**{"bits": 3, "group_size": 64, **kw})
    engine = EngineConfig(batch_size=3, progress=False)
    return quantize_blockwise(model, windows(), LayerwiseMethod(method, cfg, true_sequential=seq), engine)


def test_packed_layers_are_the_quantized_model():
    model = tiny_model()
    report = quantize(model)
    linears = model.linear_modules()
    assert set(report.layers) == {k.removesuffix(".weight") for k in linears}
    for name, record in report.layers.items():
        assert torch.equal(record.packed.dequantize(), linears[f"{name}.weight"].weight)
        assert record.packed.scales.dtype == torch.float16
        assert record.proxy_loss > 0
    assert report.memory["working_set_bytes"] < report.memory["model_bytes"] + 4 * 8 * 32 * 128 * 4
    assert len(report.block_seconds) == 2


def test_each_block_is_calibrated_on_the_quantized_model_inputs():
    """Block 1's Hessian comes from block 0's outputs *with quantized weights*."""
    model = tiny_model()
    reference = copy.deepcopy(model)
    report = quantize(model)
    ids = windows()
    x = reference.embed(ids)
    cos, sin = reference.rope(ids.shape[1])
    run_block(model.layers[0], x, cos, sin, batch_size=3, out=x)  # quantized block 0
    acc = HessianAccumulator(128)
    block1 = reference.layers[1]
    wq = block_linears(block1)["attn.wq"]
    collect_inputs(block1, x, cos, sin, 3, {"attn_in": wq}, lambda _k, t: acc.add_batch(t))
    from trilm.posthoc import LayerOptions, run_layer_method

    cfg = UniformConfig(bits=3, group_size=64)
    opts = LayerOptions(scale_dtype=torch.float16)  # what the driver stores
    expected = run_layer_method("gptq", wq.weight, acc.H, cfg, opts)
    got = report.layers["layers.1.attn.wq"]
    assert got.proxy_loss == pytest.approx(expected.proxy_loss, rel=1e-4)


def test_true_sequential_recalibrates_later_linears():
    plain = quantize(tiny_model())
    seq = quantize(tiny_model(), true_sequential=True)

    # k, v, q see the same inputs either way; o and down see inputs of already-quantized linears
    def loss(report, name):
        return report.layers[f"layers.0.{name}"].proxy_loss

    assert loss(seq, "attn.wq") == pytest.approx(loss(plain, "attn.wq"))
    assert loss(seq, "attn.wo") != loss(plain, "attn.wo")
    assert loss(seq, "mlp.w_down") != loss(plain, "mlp.w_down")


def test_gptq_beats_rtn_on_the_model_output():
    """On the calibration sequences (what GPTQ minimizes the error on; 256 tokens do not generalize)."""
    model = tiny_model()
    ids = windows()
    with torch.no_grad():
        ref = model(ids)
    errors = {}
    for method in ("rtn", "gptq"):
        m = copy.deepcopy(model)
        quantize(m, method)
        with torch.no_grad():
            errors[method] = float((m(ids) - ref).pow(2).mean())
    assert errors["gptq"] < errors["rtn"]


def test_calibration_longer_than_context_is_refused():
    from trilm.config import ConfigError

    model = tiny_model()
    method = LayerwiseMethod("gptq", UniformConfig(bits=4))
    with pytest.raises(ConfigError, match="exceeds the model context"):
        quantize_blockwise(model, torch.zeros(2, 200, dtype=torch.long), method, EngineConfig(progress=False))


def test_data_free_methods_run_without_a_calibration_stream():
    """RTN reads no inputs: the engine compresses each block from its weights alone, to the same layers."""
    with_data = tiny_model()
    with_report = quantize(with_data, method="rtn")
    alone = tiny_model()
    method = LayerwiseMethod("rtn", UniformConfig(bits=3, group_size=64))
    assert method.data_free
    report = quantize_blockwise(alone, None, method, EngineConfig(batch_size=3, progress=False))
    assert report.memory["activation_bytes"] == 0
    assert set(report.layers) == set(with_report.layers)
    for name, record in report.layers.items():
        assert torch.equal(record.packed.dequantize(), with_report.layers[name].packed.dequantize())
    gptq = LayerwiseMethod("gptq", UniformConfig(bits=3, group_size=64))
    assert not gptq.data_free
    with pytest.raises(ConfigError, match="gptq: needs calibration windows"):
        quantize_blockwise(tiny_model(), None, gptq, EngineConfig(progress=False))
