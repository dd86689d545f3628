"""QuantLinear: format-independent dispatch, fallback, state-dict round trips, and a toy model forward."""

import io

import pytest
import torch
from torch import nn
from trilm.kernels import QuantLinear, reference_matmul, replace_linears

from trilm.formats import IntWeight, TernaryWeight, load_packed, save_packed
from trilm.formats.samples import KINDS, random_packed

TOL = 2e-6


def rel_err(y, ref):
    return ((y.double() - ref.double()).abs().max() / ref.double().abs().max()).item()


@pytest.mark.parametrize("kind", KINDS)
def test_forward_any_format_matches_reference(kind):
    weight = random_packed(kind, 48, 128, seed=7)
    bias = torch.randn(48)
    layer = QuantLinear(weight, bias)
    for shape in ((1, 128), (2, 5, 128)):
        x = torch.randn(*shape)
        ref = reference_matmul(x.double(), weight, torch.float64) + bias.double()
        y = layer(x)
        assert y.shape == (*shape[:-1], 48)
        assert rel_err(y, ref) <= TOL


def test_cpu_backend_without_interpreter(monkeypatch):
    """Off CUDA and without the interpreter, 'auto' is the CPU backend: fp32 runs on the weight
    dequantized once (kept), equal to the torch reference path."""
    weight = random_packed("int3", 40, 96)
    layer = QuantLinear(weight, cache_dequantized=True)
    x = torch.randn(3, 96)
    y_triton = layer(x)
    monkeypatch.delenv("TRITON_INTERPRET")
    y_torch = layer(x)
    assert list(layer.prepare_cpu().dense) == [torch.float32]
    ref = reference_matmul(x.double(), weight, torch.float64)
    assert rel_err(y_torch, ref) <= TOL and rel_err(y_triton, ref) <= TOL
    forced = QuantLinear(weight, backend="torch")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert torch.equal(forced(x), y_torch)


def test_state_dict_round_trip_rebuilds_format_and_shape():
    src = QuantLinear(random_packed("billm", 48, 128, seed=1), torch.randn(48))
    dst = QuantLinear(random_packed("int4", 16, 256, seed=2))
    buf = io.BytesIO()
    torch.save(src.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    dst.load_state_dict(state)
    assert dst.format == "multibinary" and (dst.in_features, dst.out_features) == (128, 48)
    x = torch.randn(2, 128)
    assert torch.equal(dst(x), src(x))
    assert set(dst.state_dict()) == set(src.state_dict())


def test_load_state_dict_reports_bad_tensors():
    src = QuantLinear(random_packed("ternary", 16, 64))
    state = src.state_dict()
    state["scales"] = torch.ones(3, 16)
    with pytest.raises(RuntimeError, match="groups do not divide in_features=64"):
        QuantLinear(random_packed("ternary", 16, 64)).load_state_dict(state)


def test_module_to_and_packed_file_round_trip(tmp_path):
    layer = QuantLinear(random_packed("pbllm", 32, 64))
    moved = layer.to(torch.float64)  # casts float buffers: scales become fp64, codes stay int
    assert layer.packed.scales.dtype == torch.float64 and layer.packed.qweight.dtype == torch.int32
    save_packed(tmp_path / "m.safetensors", {"mlp.up": moved.packed}, {"method": "test"})
    layers, meta = load_packed(tmp_path / "m.safetensors")
    assert meta == {"method": "test"}
    again = QuantLinear(layers["mlp.up"])
    x = torch.randn(2, 64)
    assert torch.allclose(again(x), moved(x))


def test_from_float_int_and_refusal_for_other_formats():
    w = torch.randn(32, 256)
    layer = QuantLinear.from_float(w, "int", bits=4, group_size=64)
    assert torch.equal(layer.packed.dequantize(), IntWeight.from_float(w, 4, 64).dequantize())
    x = torch.randn(1, 256)
    assert rel_err(layer(x), x.double() @ layer.packed.dequantize().double().t()) <= TOL
    with pytest.raises(ValueError, match="from_float builds the int formats"):
        QuantLinear.from_float(w, "ternary")


class ToyBlock(nn.Module):
    """A LLaMA-shaped block with fused projections: wqkv/w_gate_up column-parallel, wo/w_down row-parallel."""

    def __init__(self, d: int = 64, f: int = 128, vocab: int = 50):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.wqkv = nn.Linear(d, 3 * d, bias=False)
        self.wo = nn.Linear(d, d, bias=False)
        self.w_gate_up = nn.Linear(d, 2 * f, bias=False)
        self.w_down = nn.Linear(f, d, bias=False)
        self.head = nn.Linear(d, vocab, bias=False)
        self.d = d

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        q, k, v = self.wqkv(h).split(self.d, dim=-1)
        att = torch.softmax(q @ k.transpose(-1, -2) / self.d**0.5, dim=-1)
        h = h + self.wo(att @ v)
        gate, up = self.w_gate_up(h).chunk(2, dim=-1)
        h = h + self.w_down(nn.functional.silu(gate) * up)
        return self.head(h)


PROJECTIONS = ("wqkv", "wo", "w_gate_up", "w_down")


def packed_toy(kinds):
    """(model with QuantLinear projections, the same model with their dequantized weights as nn.Linear)."""
    torch.manual_seed(0)
    model = ToyBlock()
    reference = ToyBlock()
    reference.load_state_dict(model.state_dict())
    made = {}

    def make(name, child):
        made[name] = random_packed(kinds[name], child.out_features, child.in_features, seed=len(made))
        return QuantLinear(made[name])

    replaced = replace_linears(model, lambda name, child: name in PROJECTIONS, make)
    assert replaced == list(PROJECTIONS)
    for name, packed in made.items():
        getattr(reference, name).weight.data = packed.dequantize()
    return model, reference


@pytest.mark.parametrize("kind", KINDS)
def test_toy_model_forward_with_packed_layers(kind):
    model, reference = packed_toy(dict.fromkeys(PROJECTIONS, kind))
    tokens = torch.randint(0, 50, (2, 6))
    with torch.no_grad():
        assert rel_err(model(tokens), reference.double()(tokens)) <= 1e-5  # prefill: GEMM path
        assert rel_err(model(tokens[:1, :1]), reference.double()(tokens[:1, :1])) <= 1e-5  # decode: GEMV


def test_toy_model_mixing_formats_layer_by_layer():
    kinds = dict(zip(PROJECTIONS, ("ternary", "nm2:4", "int3", "pbllm")))
    model, reference = packed_toy(kinds)
    assert [model.get_submodule(p).format for p in PROJECTIONS] == ["ternary", "nm_binary", "int", "pbllm"]
    tokens = torch.randint(0, 50, (1, 5))
    with torch.no_grad():
        assert rel_err(model(tokens), reference.double()(tokens)) <= 1e-5


def test_ternary_from_model_codes_with_partition_scales():
    """The model's contract: int8 codes and fp32 scales (K // g, N); two row blocks with their own scale."""
    from trilm.formats import partition_scales

    codes = torch.randint(-1, 2, (64, 96), dtype=torch.int8)
    scales = partition_scales(torch.tensor([0.5, 2.0]), 64, 96, axis="out")
    layer = QuantLinear(TernaryWeight.pack(codes, scales))
    x = torch.randn(3, 96)
    w = codes.double() * torch.tensor([0.5] * 32 + [2.0] * 32, dtype=torch.float64).unsqueeze(1)
    assert rel_err(layer(x), x.double() @ w.t()) <= TOL
