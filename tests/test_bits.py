"""trilm.bits: the one definition of value bits, stored bits and bits per parameter."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch

from trilm.bits import TERNARY_BITS, BitsError, bits_per_param, gptq_bits, model_bits, stored_linear_bits
from trilm.families import FAMILIES, family_linear_bits, get_family, snapshot_linear_bits


def test_value_bits_by_family_and_quantlm_meta():
    assert family_linear_bits("TriLM") == TERNARY_BITS == math.log2(3)
    assert family_linear_bits("bilm") == 1 and family_linear_bits("floatlm") == 16
    assert family_linear_bits("quantlm-gptq-4") == gptq_bits(4, 128) == pytest.approx(4 + 20 / 128)
    assert family_linear_bits("something") is None
    assert snapshot_linear_bits({"family": "trilm"}) == (TERNARY_BITS, None)
    quant = {"extra": {"quant": {"bits": {"paper": 4.156, "stored": 4.19}}}, "family": "floatlm"}
    assert snapshot_linear_bits(quant) == (4.156, 4.19)
    quant["extra"]["quant"]["bits"]["paper"] = None  # a method without a paper count: stored bits
    assert snapshot_linear_bits(quant) == (4.19, 4.19)
    assert model_bits(100, 50, 1.58) == pytest.approx(158 + 800)
    assert bits_per_param(150, 100, 1.58) == pytest.approx((158 + 800) / 150)
    with pytest.raises(BitsError, match="params must be > 0"):
        bits_per_param(0, 0, 2.0)


def test_one_family_registry_feeds_config_cli_and_cards():
    from trilm.model.cli import describe
    from trilm.model.config import preset

    assert get_family("trilm").linear_bits == TERNARY_BITS
    with pytest.raises(KeyError, match="quadlm.*trilm, floatlm, bilm"):
        get_family("quadlm")
    for family in FAMILIES.values():
        cfg = preset(f"{family.name}-nano")
        assert cfg.weight_format == family.weight_format
        assert f"{family.linear_bits:.3f} bits/linear weight" in describe(cfg)


def test_stored_bits_sum_the_codec_storage_over_layers():
    from trilm.formats import TernaryWeight

    a = TernaryWeight.pack(torch.randint(-1, 2, (64, 256)), torch.rand(1, 64))
    b = TernaryWeight.pack(torch.randint(-1, 2, (32, 512)), torch.rand(2, 32))
    expected = (a.storage_bits() + b.storage_bits()) / (64 * 256 + 32 * 512)
    assert stored_linear_bits({"x": a, "y": b}) == pytest.approx(expected)
    assert stored_linear_bits([a]) == pytest.approx(a.bits_per_weight())
    with pytest.raises(BitsError, match="no packed layers"):
        stored_linear_bits({})


def test_bits_and_scaling_import_without_torch():
    code = (
        "import sys, trilm.bits, trilm.families, trilm.scaling, trilm.scaling.cli; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
