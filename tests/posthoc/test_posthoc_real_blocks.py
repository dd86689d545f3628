"""trilm/posthoc/divergence.py (run by ``python -m experiments.posthoc_real.blocks``): the per-block
divergence of a quantized model from its float model, which the real-model report uses to say where
OmniQuant's loss comes from."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.posthoc.conftest import tiny_model
from trilm.posthoc.divergence import FloatFirstPosition, calibration_nll, divergence


def _with_one_block_changed(layers: int, block: int, batch: int):
    """A tiny float model, a copy whose block ``block`` has its MLP output scaled by 1.5, and token ids."""
    float_model = tiny_model(layers=layers)
    changed = copy.deepcopy(float_model)
    with torch.no_grad():
        changed.layers[block].mlp.w_down.weight.mul_(1.5)
    ids = torch.randint(0, 2048, (batch, 8), generator=torch.Generator().manual_seed(0))
    return float_model, changed, ids


def test_divergence_starts_at_the_changed_block_and_splits_position_zero():
    float_model, changed, ids = _with_one_block_changed(layers=3, block=1, batch=3)
    same = divergence(float_model, copy.deepcopy(float_model), ids, batch=2)
    assert all(b["mse"] == 0.0 for b in same)
    blocks = divergence(float_model, changed, ids, batch=2)
    assert blocks[0]["mse"] == 0.0 and blocks[1]["mse"] > 0 and blocks[2]["mse"] > 0
    with torch.no_grad():
        xf = float_model.embed(ids)
        xq = xf.clone()
        cos, sin = float_model.rope(8)
        for layer_f, layer_q in zip(float_model.layers, changed.layers, strict=True):
            xf, xq = layer_f(xf, cos, sin), layer_q(xq, cos, sin)
    err = (xq - xf).double().pow(2)  # one batch of 3 here, batches of 2 there: fp32 sums may differ in order
    assert blocks[2]["mse"] == pytest.approx(float(err.mean()), rel=1e-4)
    assert blocks[2]["share_first_position"] == pytest.approx(float(err[:, 0].sum() / err.sum()), rel=1e-4)
    assert blocks[2]["float_max_abs"] == pytest.approx(float(xf.abs().max()), rel=1e-6)


def test_pinning_the_first_position_makes_it_the_float_models():
    float_model, changed, ids = _with_one_block_changed(layers=2, block=0, batch=2)
    with torch.no_grad():
        assert torch.equal(FloatFirstPosition(changed, float_model, pin=False)(ids), changed(ids))
        pinned = FloatFirstPosition(changed, float_model)(ids)
        assert torch.allclose(pinned[:, 0], float_model(ids)[:, 0], rtol=0, atol=1e-5)
        assert not torch.allclose(pinned[:, 1:], changed(ids)[:, 1:])


def test_calibration_nll_is_the_mean_next_token_loss():
    import math

    model, _, ids = _with_one_block_changed(layers=1, block=0, batch=3)
    with torch.no_grad():
        model.head.weight.zero_()
    assert calibration_nll(model, ids, batch=2) == pytest.approx(
        math.log(model.head.weight.shape[0]), rel=1e-6
    )
    with torch.no_grad():
        model.head.weight.normal_()
        logits = model(ids)[:, :-1]
        expected = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1)
        )
    assert calibration_nll(model, ids, batch=2) == pytest.approx(float(expected), rel=1e-5)
