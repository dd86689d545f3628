"""The fused decode step: Q/K/V and gate/up stacked into one launch each, packed layers as an operator that
``torch.compile`` keeps in its graph, and the launches per token and layer that result (counted on CPU,
with the Triton plans run by the interpreter)."""

import pytest
import torch
from trilm.kernels import QuantLinear

from trilm.formats import FormatError
from trilm.formats.concat import stack_out
from trilm.formats.samples import random_packed
from trilm.infer import InferenceModel, fuse_projections
from trilm.infer.launches import compiled_launches, eager_launches, per_layer
from trilm.model import preset


def _model(layers: int, fmt: str | None, fuse: bool, seed: int = 0) -> InferenceModel:
    torch.manual_seed(seed)
    model = InferenceModel(preset("floatlm-nano", vocab_size=300, layers=layers)).eval()
    if fmt is not None:
        for i, (name, lin) in enumerate(model.linear_modules().items()):
            packed = random_packed(fmt, lin.out_features, lin.in_features, seed=seed + i)
            model.set_linear(name, QuantLinear(packed))
    if fuse:
        assert fuse_projections(model) == 2 * layers
    return model


@pytest.mark.parametrize("kind", ["ternary", "binary_mean", "int4", "int3"])
def test_stacked_weight_dequantizes_to_the_stacked_rows(kind):
    parts = [random_packed(kind, n, 128, seed=i) for i, n in enumerate((64, 32, 32))]
    stacked = stack_out(parts)
    assert torch.equal(stacked.dequantize(), torch.cat([p.dequantize() for p in parts]))
    assert stacked.bits_per_weight() == pytest.approx(parts[0].bits_per_weight(), rel=1e-6)


def test_stacking_refuses_mismatched_settings_by_name():
    with pytest.raises(FormatError, match="settings"):
        stack_out([random_packed("int4", 32, 128), random_packed("int2", 32, 128)])
    with pytest.raises(FormatError, match="not one of"):
        stack_out([random_packed("nm2:4", 32, 128), random_packed("nm2:4", 32, 128)])


@pytest.mark.parametrize("fmt", [None, "ternary", "int4"])
def test_fused_model_computes_the_same_logits(fmt):
    ids = torch.randint(0, 300, (2, 5))
    with torch.no_grad():
        reference = _model(2, fmt, fuse=False)(ids)
        fused = _model(2, fmt, fuse=True)
        assert fused.layers[0].attn.wq is None and fused.layers[0].attn.wqkv is not None
        # stacking changes no value, but the products run as one Triton program grid instead of three
        torch.testing.assert_close(fused(ids), reference, rtol=1e-5, atol=1e-5)


def test_compiled_packed_step_keeps_the_kernel_as_one_operator():
    model = _model(1, "ternary", fuse=True)
    ids = torch.randint(0, 300, (1, 1))
    with torch.no_grad():
        eager = model(ids)
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True, dynamic=False)(ids)
    torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-4)
    assert compiled_launches(model, ids).count("torch.ops.trilm.quant_linear") == 4


@pytest.mark.slow
def test_launches_per_token_and_layer_fall_from_eager_to_fused_compiled():
    """Eager and unfused: ≈ 34 launches per layer; compiled and fused: 4 matrix products, the attention, and
    the fused norm/rotary/residual/SwiGLU kernels around them."""
    ids = torch.zeros((1, 1), dtype=torch.long)

    def eager(m):
        return len(eager_launches(m, ids))

    def compiled(m):
        return len(compiled_launches(m, ids))

    for fmt in (None, "ternary"):
        before, _ = per_layer(eager, lambda n, fmt=fmt: _model(n, fmt, fuse=False))
        fused_eager, _ = per_layer(eager, lambda n, fmt=fmt: _model(n, fmt, fuse=True))
        after, _ = per_layer(compiled, lambda n, fmt=fmt: _model(n, fmt, fuse=True))
        assert before >= 30, (fmt, before)
        assert fused_eager == before - 3  # q/k/v → 1 and gate/up → 1
        assert after <= 10, (fmt, after)


def test_a_copied_layer_is_its_own_operator():
    import copy

    from trilm.kernels.linear import quant_linear_op

    layer = QuantLinear(random_packed("ternary", 32, 64, seed=1))
    twin = copy.deepcopy(layer)
    twin.load_state_dict(QuantLinear(random_packed("ternary", 32, 64, seed=2)).state_dict())
    x = torch.randn(1, 64)
    assert twin.op_name != layer.op_name
    torch.testing.assert_close(quant_linear_op(x, twin.op_name), twin(x))
    assert not torch.allclose(quant_linear_op(x, layer.op_name), twin(x))
