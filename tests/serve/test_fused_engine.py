"""The engine stacks Q/K/V and gate/up by default (:func:`trilm.infer.fuse_projections`): the served model
computes the logits of the unfused one and launches three fewer kernels per layer and token.

Tolerance: the stacked matrix holds the same rows, so every output is the same dot product over the same K;
only the BLAS may sum in another order for a wider matrix, a relative difference of a few fp32 ulps times
the layers (≤ 1e-5 here, with hidden 64 and 2 layers).
"""

import pytest
import torch

from tests.serve.conftest import VOCAB, nano, write_snapshot
from trilm.infer.launches import eager_launches
from trilm.serve import Engine, SamplingParams


def _pair(tmp_path, family: str, **load):
    path = write_snapshot(tmp_path / family, nano(family, kv_heads=2), seed=7)
    fused = Engine.load(path, device="cpu", dtype=torch.float32, max_batch=2, **load)
    apart = Engine.load(path, device="cpu", dtype=torch.float32, max_batch=2, fuse=False, **load)
    return fused, apart


@pytest.mark.parametrize(("family", "load"), [("floatlm", {}), ("trilm", {"packed": True})])
def test_served_model_is_fused_and_computes_the_unfused_logits(tmp_path, family, load):
    fused, apart = _pair(tmp_path, family, **load)
    layers = len(fused.model.layers)
    for block in fused.model.layers:
        assert block.attn.wq is None and block.attn.wqkv is not None
        assert block.mlp.w_gate is None and block.mlp.w_gate_up is not None
    assert all(block.attn.wqkv is None and block.attn.wq is not None for block in apart.model.layers)
    assert any(f"{2 * layers} Q/K/V and gate/up groups stacked" in n for n in fused.notes)
    if load.get("packed"):
        assert type(fused.model.layers[0].attn.wqkv).__name__ == "QuantLinear"
    ids = torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(fused.model(ids), apart.model(ids), rtol=1e-5, atol=1e-5)
    one = ids[:1, :1]
    assert len(eager_launches(apart.model, one)) - len(eager_launches(fused.model, one)) == 3 * layers
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    prompt = ids[0].tolist()
    assert fused.submit(prompt, params).result().token_ids == apart.submit(prompt, params).result().token_ids


def test_cli_opt_out_keeps_projections_apart():
    import argparse

    from trilm.serve.cli import build_parser

    parser = argparse.ArgumentParser()
    build_parser(parser, "serve")
    assert parser.parse_args(["--model", "m"]).no_fuse is False
    assert parser.parse_args(["--model", "m", "--no-fuse"]).no_fuse is True
