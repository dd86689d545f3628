"""GPTQ/RTN invariants that need no fixtures, the packed output, and the layer API's errors."""

from __future__ import annotations

import warnings

import pytest
import torch

from tests.posthoc.conftest import correlated_hessian
from trilm.config import ConfigError
from trilm.formats import IntWeight, fit_uniform_grid, quantize_uniform
from trilm.posthoc import METHODS, QuantResult, get_method, quantize_layer


def weight(n: int = 48, k: int = 128, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.02


@pytest.mark.parametrize(
    "cfg",
    [
        dict(bits=4),
        dict(bits=3, sym=True),
        dict(bits=2, group_size=32),
        dict(bits=4, group_size=32, static_groups=True),
        dict(bits=8),
    ],
)
def test_gptq_equals_rtn_when_h_is_identity(cfg):
    W = weight()
    H = torch.eye(W.shape[1])
    gptq = quantize_layer("gptq", W, H, **cfg)
    rtn = quantize_layer("rtn", W, H, **{k: v for k, v in cfg.items() if k != "static_groups"})
    assert torch.equal(gptq.weight, rtn.weight)


def test_rtn_is_the_formats_quantizer():
    W = weight()
    codes, scales, _ = quantize_uniform(W, 3, 32)
    result = quantize_layer("rtn", W, torch.eye(W.shape[1]), bits=3, group_size=32)
    assert torch.equal(result.packed.codes(), codes)
    assert torch.equal(result.packed.scales.float(), scales)


@pytest.mark.parametrize("bits,group", [(2, 32), (3, -1), (3, 32), (4, -1), (4, 64)])
def test_gptq_proxy_loss_below_rtn(bits, group):
    W, H = weight(k=128), correlated_hessian(128)
    gptq = quantize_layer("gptq", W, H, bits=bits, group_size=group)
    rtn = quantize_layer("rtn", W, H, bits=bits, group_size=group)
    assert gptq.proxy_loss < rtn.proxy_loss
    diff = (gptq.weight - W).double()
    assert gptq.proxy_loss == pytest.approx(float(torch.trace(diff @ H.double() @ diff.t())))


@pytest.mark.parametrize("static", [False, True])
def test_act_order_is_undone_and_g_idx_matches_the_packed_layer(static):
    from trilm.kernels import QuantLinear

    W, H = weight(k=128), correlated_hessian(128, seed=3)
    result = quantize_layer("gptq", W, H, bits=4, group_size=32, act_order=True, static_groups=static)
    packed = result.packed
    assert torch.equal(packed.dequantize(), result.weight)
    perm = result.extra["perm"]
    assert not torch.equal(perm, torch.arange(128))
    if static:
        assert packed.g_idx is None  # groups stay in original column order
    else:
        expected = (torch.argsort(perm) // 32).to(torch.int32)
        assert torch.equal(packed.g_idx, expected)
    if static:  # un-permuted: every original 32-column group holds at most 16 levels per row
        for j in range(4):
            assert max(len(torch.unique(r)) for r in result.weight[:, j * 32 : (j + 1) * 32]) <= 16
    else:  # act-order = quantize the permuted problem, then put the columns back
        plain = quantize_layer("gptq", W[:, perm], H[perm][:, perm], bits=4, group_size=32)
        assert torch.equal(result.weight[:, perm], plain.weight)
    x = torch.randn(5, 128)
    layer = QuantLinear(packed, backend="torch")
    assert torch.allclose(layer(x), x @ result.weight.t(), atol=1e-6)


def test_static_groups_are_fitted_on_the_original_weight_dynamic_on_the_updated_one():
    """Static: every group's grid from the original W. Dynamic (the reference): fitted when the loop reaches
    the group, on W as it stands at the start of the current block — so a group inside the first block is
    fitted on the original W too, and only groups of later blocks see the error feedback."""
    W, H = weight(k=128), correlated_hessian(128, seed=4)
    g = 32
    static = quantize_layer("gptq", W, H, bits=4, group_size=g, static_groups=True, blocksize=64).packed
    dynamic = quantize_layer("gptq", W, H, bits=4, group_size=g, blocksize=64).packed
    for j in range(128 // g):
        scale, zero = fit_uniform_grid(W[:, j * g : (j + 1) * g], 4)
        assert torch.equal(static.scales[j].float(), scale)
        assert torch.equal(static.zeros[j].float(), zero)
        if j < 2:  # groups of the first 64-column block: fitted before any feedback reached them
            assert torch.equal(dynamic.scales[j].float(), scale)
        else:  # fitted after the first block's error feedback changed W
            assert not torch.equal(dynamic.scales[j].float(), scale)


def test_dead_columns_are_zero():
    W, H = weight(k=64), correlated_hessian(64)
    H[:, 5] = 0
    H[5, :] = 0
    result = quantize_layer("gptq", W, H, bits=4)
    assert torch.all(result.weight[:, 5] == 0)
    assert result.extra["dead_columns"] == 1


def test_cholesky_failure_retries_with_more_damping_and_says_so():
    W = weight(k=64)
    x = torch.randn(8, 64)
    H = x.t() @ x  # rank 8: not positive definite without damping
    with pytest.warns(RuntimeWarning, match="not positive definite"):
        result = quantize_layer("gptq", W, H, bits=4, percdamp=0.0)
    assert result.damp_retries >= 1 and result.damp > 0
    assert bool(torch.isfinite(result.weight).all())


def test_nan_hessian_is_refused():
    W, H = weight(k=64), correlated_hessian(64)
    H[3, 3] = float("nan")
    with pytest.raises(ConfigError, match="inf or NaN"):
        quantize_layer("gptq", W, H, bits=4)


def test_normal_run_does_not_warn():
    W, H = weight(k=64), correlated_hessian(64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        quantize_layer("gptq", W, H, bits=4)


def test_every_grid_width_is_packed_exactly():
    W, H = weight(k=64), correlated_hessian(64)
    result = quantize_layer("gptq", W, H, bits=8)
    assert isinstance(result, QuantResult)
    assert max(len(torch.unique(row)) for row in result.weight) <= 256
    for bits in (2, 3, 4, 8):
        result = quantize_layer("gptq", W, H, bits=bits, group_size=32)
        assert isinstance(result.packed, IntWeight) and result.packed.bits == bits
        assert torch.equal(result.packed.dequantize(), result.weight)


@pytest.mark.parametrize(
    "cfg,match",
    [
        (dict(bits=5), "bits"),
        (dict(bits=4, group_size=48), "does not divide in_features K=64"),
        (dict(bits=4, group_size=0), "group_size"),
        (dict(bits=4, static_groups=True), "static_groups"),
        (dict(bits=4, percdamp=-1.0), "percdamp"),
        (dict(bits=4, groupsize=32), "unknown key 'groupsize'"),
    ],
)
def test_bad_settings_are_refused(cfg, match):
    W, H = weight(k=64), correlated_hessian(64)
    with pytest.raises(ConfigError, match=match):
        quantize_layer("gptq", W, H, **cfg)


def test_registry_names_the_methods_and_their_exact_keys():
    get_method("gptq")
    assert {"rtn", "gptq"} <= set(METHODS)
    keys = {
        "bits",
        "group_size",
        "sym",
        "act_order",
        "static_groups",
        "blocksize",
        "percdamp",
        "group_fit",
        "target",
    }
    assert set(get_method("gptq").config().to_dict()) == keys
    with pytest.raises(ConfigError, match="unknown post-hoc method 'gptx'"):
        quantize_layer("gptx", weight(), torch.eye(128))
