"""PB-LLM, BiLLM and STBLLM on a whole (tiny) model: the block-wise engine, the packed layers through
QuantLinear (torch and interpreter), STBLLM's adaptive per-layer N, PB-LLM's QAT, and ``trilm quantize``."""

from __future__ import annotations

import pytest
import torch

from tests.posthoc.conftest import tiny_model
from trilm.formats import PartialBinaryWeight, ResidualBinaryWeight, layer_bits, within_budget
from trilm.posthoc.billm import BiLLMConfig, STBLLMConfig
from trilm.posthoc.binary_model import PBLLMModelMethod, STBLLMModelMethod
from trilm.posthoc.engine import EngineConfig, quantize_blockwise
from trilm.posthoc.layerwise import LayerwiseMethod
from trilm.posthoc.pbllm import PBLLMConfig
from trilm.posthoc.registry import MethodOptions

ENGINE = EngineConfig(batch_size=4, progress=False)
SMALL = dict(hidden=32, ffn=64, heads=2, kv_heads=1)
"""Smaller than the engine tests' model: the binary searches cost ~100 candidate fits per block."""


@pytest.fixture(autouse=True, scope="module")
def _single_thread():
    """One torch thread: the binary searches run many small ops, where a second thread on a loaded 2-core
    machine costs far more in synchronization than it saves (20–40× here)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def small_model():
    return tiny_model(**SMALL)


def windows(n: int = 8, seq: int = 32) -> torch.Tensor:
    return torch.randint(0, 2048, (n, seq), generator=torch.Generator().manual_seed(5))


def through_quant_linear(model, layers, monkeypatch):
    """Logits of ``model`` with every block linear replaced by QuantLinear over the packed layers."""
    from trilm.kernels import QuantLinear

    ids = windows(2, 16)
    expected = model(ids)
    for backend, interpret in (("torch", "0"), ("triton", "1")):
        monkeypatch.setenv("TRITON_INTERPRET", interpret)
        swapped = small_model()
        swapped.load_state_dict(model.state_dict())
        for name, packed in layers.items():
            swapped.set_linear(f"{name}.weight", QuantLinear(packed, backend=backend))
        got = swapped(ids)
        assert (got - expected).abs().max() <= 1e-4 * expected.abs().max(), backend


METHODS = {
    "pbllm": lambda: PBLLMModelMethod(PBLLMConfig(low_frac=0.8), MethodOptions()),
    "billm": lambda: LayerwiseMethod("billm", BiLLMConfig()),
    "stbllm": lambda: STBLLMModelMethod(STBLLMConfig(n=4, m=8), MethodOptions()),
}


@pytest.fixture(scope="module")
def quantized():
    """Each method once on the small model: method → (model, engine report, block method)."""
    out = {}
    for name, make in METHODS.items():
        model, block = small_model(), make()
        out[name] = (model, quantize_blockwise(model, windows(), block, ENGINE), block)
    return out


@pytest.mark.parametrize("method", list(METHODS))
def test_tiny_model_through_each_method_and_quant_linear(method, quantized, monkeypatch):
    model, report, block = quantized[method]
    linears = model.linear_modules()
    fmt = PartialBinaryWeight if method == "pbllm" else ResidualBinaryWeight
    for name, rec in report.layers.items():
        packed = rec.packed
        assert isinstance(packed, fmt)
        assert torch.equal(packed.dequantize(), linears[f"{name}.weight"].weight)
        bits = layer_bits(packed)
        assert within_budget(bits["stored"], bits["minimum"]), (name, bits)
        if method == "stbllm":
            n = block.layer_n[name]
            nonzero = (packed.dequantize() != 0).reshape(packed.out_features, -1, 8).sum(-1)
            assert bool((nonzero == n).all()), name
    through_quant_linear(model, {n: r.packed for n, r in report.layers.items()}, monkeypatch)


def test_stbllm_adaptive_n_keeps_the_mean_share(quantized):
    model, _, block = quantized["stbllm"]
    sizes = {n.removesuffix(".weight"): m.weight.numel() for n, m in model.linear_modules().items()}
    mean = sum(block.layer_n[n] * s for n, s in sizes.items()) / sum(sizes.values())
    assert set(block.layer_n) == set(sizes)
    assert len(set(block.layer_n.values())) > 1, "outlier ratios differ, so N should too"
    assert abs(mean - 4) <= 0.25
    fixed = STBLLMModelMethod(STBLLMConfig(n=4, m=8, adaptive_n=False), MethodOptions())
    fresh = small_model()
    x = fresh.embed(windows())
    cos, sin = fresh.rope(x.shape[1])
    fixed.prepare(fresh, x, cos, sin, ENGINE)
    assert fixed.layer_n == {} and fixed.layer_config("layers.0.attn.wq").n == 4


def test_pbllm_qat_starts_from_ptq():
    """The trainable layer computes exactly the PB-GPTQ weight before the first step."""
    from tests.posthoc.conftest import correlated_hessian
    from trilm.posthoc import quantize_layer
    from trilm.posthoc.qat import PartialBinaryLinear

    W = torch.randn(16, 64, generator=torch.Generator().manual_seed(4)) * 0.02
    r = quantize_layer("pbllm", W, correlated_hessian(64, seed=4), low_frac=0.8, qat_steps=1)
    layer = PartialBinaryLinear(r.packed, r.extra["latent"])
    assert torch.equal(layer.weight_now().detach(), r.weight)
    assert torch.equal(layer.pack(torch.float32).dequantize(), r.weight)


def test_pbllm_qat_trains_the_binary_part_only(embedded_data):
    from trilm.config import ConfigError
    from trilm.posthoc.calibration import CalibrationConfig

    calib = CalibrationConfig(source=str(embedded_data["train"]), samples=8, seq_len=32)
    ptq_model = small_model()
    ptq = quantize_blockwise(
        ptq_model, windows(), PBLLMModelMethod(PBLLMConfig(low_frac=0.9), MethodOptions()), ENGINE
    )
    model = small_model()
    cfg = PBLLMConfig(low_frac=0.9, qat_steps=3, qat_lr=1e-3, qat_batch=2)
    block = PBLLMModelMethod(cfg, MethodOptions(calibration=calib))
    report = quantize_blockwise(model, windows(), block, ENGINE)
    assert len(block.qat_losses) == 3 and all(map(torch.isfinite, torch.tensor(block.qat_losses)))
    linears = model.linear_modules()
    changed = 0
    for name, rec in report.layers.items():
        packed, before = rec.packed, ptq.layers[name].packed
        assert torch.equal(packed.dequantize(), linears[f"{name}.weight"].weight)
        mask = packed.salient_mask()
        assert torch.equal(mask, before.salient_mask())
        assert torch.equal(packed.dequantize()[mask], before.dequantize()[mask]), "salient weights are frozen"
        changed += int((packed.dequantize() != before.dequantize()).sum())
    assert changed > 0
    with pytest.raises(ConfigError, match="qat_data"):
        quantize_blockwise(small_model(), windows(), PBLLMModelMethod(cfg, MethodOptions()), ENGINE)
