import pytest
import torch

from trilm.model.quant import ScaleLayout, fake_quant_activation, fake_quant_weight, packing_scales


def _distinct_abs(w: torch.Tensor) -> int:
    return len(torch.unique(w.abs()))


@pytest.mark.parametrize("fmt", ["ternary", "binary"])
def test_ste_gradient_is_identity_on_latent_weights(fmt):
    torch.manual_seed(0)
    w = (torch.randn(12, 16) * 0.02).requires_grad_()
    x = torch.randn(5, 16)
    layout = ScaleLayout(fmt=fmt, group="shard", partitions=2, parallel="column")
    wq = fake_quant_weight(w, layout)
    upstream = torch.randn(5, 12)
    (x @ wq.t()).backward(upstream)
    # d(sum(upstream * x Wq^T))/dWq = upstream^T x; the STE passes it to the latent weights unchanged.
    torch.testing.assert_close(w.grad, upstream.t() @ x)
    assert not torch.equal(wq, w)


def test_ternary_values_and_scale_per_partition():
    torch.manual_seed(1)
    w = torch.randn(8, 6)
    layout = ScaleLayout(fmt="ternary", group="shard", partitions=2, parallel="column", eps=0.0)
    wq = fake_quant_weight(w, layout)
    for half in (w[:4], w[4:]):
        gamma = half.abs().mean()
        expected = gamma * torch.clamp(torch.round(half / gamma), -1, 1)
        idx = slice(0, 4) if half.data_ptr() == w.data_ptr() else slice(4, 8)
        torch.testing.assert_close(wq[idx], expected)
    assert _distinct_abs(wq) <= 1 + 2


def test_row_parallel_partitions_split_columns():
    torch.manual_seed(2)
    w = torch.randn(4, 12)
    layout = ScaleLayout(fmt="ternary", group="shard", partitions=3, parallel="row", eps=0.0)
    wq = fake_quant_weight(w, layout)
    for j in range(3):
        block = w[:, 4 * j : 4 * j + 4]
        gamma = block.abs().mean()
        torch.testing.assert_close(
            wq[:, 4 * j : 4 * j + 4], gamma * torch.clamp(torch.round(block / gamma), -1, 1)
        )


def test_fused_segments_get_separate_scales():
    torch.manual_seed(3)
    q, k = torch.randn(6, 8), torch.randn(4, 8) * 10
    layout = ScaleLayout(fmt="ternary", group="tensor", parallel="column", segments=(6, 4), eps=0.0)
    wq = fake_quant_weight(torch.cat([q, k]), layout)
    assert torch.allclose(wq[:6].abs().max(), q.abs().mean())
    assert torch.allclose(wq[6:].abs().max(), k.abs().mean())


def test_row_and_group_scales():
    torch.manual_seed(4)
    w = torch.randn(5, 8)
    rows = fake_quant_weight(w, ScaleLayout(fmt="binary", group="row"))
    torch.testing.assert_close(rows.abs().amax(1), w.abs().mean(1))
    grouped = fake_quant_weight(w, ScaleLayout(fmt="binary", group="group:4"))
    torch.testing.assert_close(grouped[:, :4].abs().amax(1), w[:, :4].abs().mean(1))
    torch.testing.assert_close(grouped[:, 4:].abs().amax(1), w[:, 4:].abs().mean(1))


def test_binary_sign_of_zero_is_plus_one():
    w = torch.tensor([[0.0, -1.0, 2.0, 0.0]])
    wq = fake_quant_weight(w, ScaleLayout(fmt="binary", group="tensor"))
    alpha = w.abs().mean()
    torch.testing.assert_close(wq, alpha * torch.tensor([[1.0, -1.0, 1.0, 1.0]]))


def test_ternary_eps_keeps_zero_group_finite():
    wq = fake_quant_weight(torch.zeros(4, 4), ScaleLayout(fmt="ternary", group="tensor", eps=1e-6))
    assert torch.isfinite(wq).all() and (wq == 0).all()


def test_packing_scales_layout_matches_dequantized():
    torch.manual_seed(5)
    w = torch.randn(6, 12)
    for layout in (
        ScaleLayout(fmt="ternary", group="shard", partitions=2, parallel="column", eps=0.0),
        ScaleLayout(fmt="ternary", group="shard", partitions=3, parallel="row", eps=0.0),
        ScaleLayout(fmt="ternary", group="group:4", eps=0.0),
        ScaleLayout(fmt="binary", group="row"),
    ):
        codes, scales, g = packing_scales(w, layout)
        k_idx = torch.arange(12) // g
        rebuilt = codes.float() * scales[k_idx, :].t()
        torch.testing.assert_close(rebuilt, fake_quant_weight(w, layout))


def test_activation_fake_quant_is_int8_per_token():
    torch.manual_seed(6)
    x = torch.randn(3, 10, requires_grad=True)
    xq = fake_quant_activation(x, 8)
    step = x.detach().abs().amax(-1, keepdim=True) / 127
    levels = xq.detach() / step
    torch.testing.assert_close(levels, levels.round(), atol=1e-4, rtol=0)
    assert (xq - x).abs().max() <= step.max() / 2 + 1e-6
    xq.sum().backward()
    torch.testing.assert_close(x.grad, torch.ones_like(x))


# ---- QuantizedLinear (latent weight + scales saved, W̃ rebuilt in backward) against the STE image ------
def _megatron_linear_on_fake_quant(layer, input, weight, **kw):
    """The reference: megatron's linear on the STE image (W̃ kept for backward)."""
    from megatron.core.tensor_parallel.layers import linear_with_grad_accumulation_and_async_allreduce

    kw.pop("wgrad_deferral_limit", None)
    kw.pop("grad_output_buffer", None)
    kw = {"bias": None, "gradient_accumulation_fusion": False, "allreduce_dgrad": False, **kw}
    kw.setdefault("sequence_parallel", False)
    return linear_with_grad_accumulation_and_async_allreduce(
        input, fake_quant_weight(weight, layer.layout), **kw
    )


LAYOUTS = [
    ScaleLayout(fmt="ternary", group="shard", partitions=2, parallel="column", segments=(8, 4)),
    ScaleLayout(fmt="ternary", group="shard", partitions=2, parallel="row"),
    ScaleLayout(fmt="ternary", group="group:4"),
    ScaleLayout(fmt="ternary", group="row"),
    ScaleLayout(fmt="binary", group="tensor"),
    ScaleLayout(fmt="float"),
]


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda lay: f"{lay.fmt}-{lay.group}-{lay.parallel}")
def test_quantized_linear_equals_megatron_linear_on_the_ste_image(layout):
    from megatron.core.tensor_parallel.layers import linear_with_grad_accumulation_and_async_allreduce

    from trilm.model.quant import quantized_linear
    from trilm.parallel import init_parallel

    init_parallel()
    g = torch.Generator().manual_seed(7)
    w = (torch.randn(12, 16, generator=g) * 0.02).requires_grad_()
    x = torch.randn(3, 5, 16, generator=g, requires_grad=True)
    upstream = torch.randn(3, 5, 12, generator=g)
    w_ref, x_ref = w.detach().clone().requires_grad_(), x.detach().clone().requires_grad_()

    out = quantized_linear(x, w, layout)
    out.backward(upstream)
    ref = linear_with_grad_accumulation_and_async_allreduce(
        x_ref, fake_quant_weight(w_ref, layout), None, False, False, False
    )
    ref.backward(upstream)
    assert torch.equal(out, ref)
    assert torch.equal(x.grad, x_ref.grad)
    assert torch.equal(w.grad, w_ref.grad)


@pytest.mark.parametrize("family", ["trilm", "bilm"])
def test_decoder_gradients_equal_todays_path(monkeypatch, family):
    """Loss and every parameter gradient of a whole model are bitwise those of the W̃-saving path."""
    import trilm.model.layers as layers
    from trilm.model import build_model, preset

    cfg = preset(f"{family}-nano", vocab_size=256, quant={"activation_bits": 8})
    ids = torch.randint(0, 256, (2, 33), generator=torch.Generator().manual_seed(0))

    def loss_and_grads(model):
        loss = model(ids[:, :-1], labels=ids[:, 1:]).mean()
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    new_loss, new_grads = loss_and_grads(build_model(cfg, seed=3))
    monkeypatch.setattr(layers, "_linear_impl", _megatron_linear_on_fake_quant)
    old_loss, old_grads = loss_and_grads(build_model(cfg, seed=3))
    assert torch.equal(new_loss, old_loss)
    for name, grad in new_grads.items():
        assert torch.equal(grad, old_grads[name]), name
