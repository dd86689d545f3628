"""μP (``model.mup_base_width``): the standard parametrization at the base width, width-scaled init and
learning rates away from it, and the trainer's engine honouring the per-group rates."""

from __future__ import annotations

import pytest
import torch

from trilm.config import ConfigError
from trilm.model import preset
from trilm.model.transformer import Decoder
from trilm.parallel import init_parallel
from trilm.train.config import TrainConfig
from trilm.train.engine import build_engine, param_groups, set_optimizer_hparams

SHAPE = dict(vocab_size=256, hidden=64, ffn=192, heads=2, layers=2, context=32)


def _model(family: str = "floatlm", **fields) -> Decoder:
    return Decoder(preset(f"{family}-nano", **{**SHAPE, **fields}), init_parallel(), seed=0)


def _engine(model: Decoder):
    cfg = TrainConfig.from_dict(
        {"model": model.cfg.to_dict(), "batch_tokens": 256, "tokens": 2560, "seq_len": 32, "micro_batch": 8}
        | {"zero_stage": 0, "data": {"train_dir": "unused"}}
    )
    return build_engine(model, cfg, 1, init_parallel())


def _train(engine, steps: int = 3) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        set_optimizer_hparams(engine, 3e-3, 0.1)
        ids = torch.randint(0, 256, (8, 33), generator=gen)
        engine.backward(engine(ids[:, :-1], labels=ids[:, 1:]).mean())
        engine.step()
    return engine.module.full_state_dict()


@pytest.mark.parametrize("family", ["floatlm", "trilm"])
def test_at_the_base_width_mup_is_the_standard_parametrization(family):
    sp, mup = _model(family), _model(family, mup_base_width=64)
    assert mup.cfg.width_multiplier == 1.0
    start = sp.full_state_dict()
    assert all(torch.equal(start[k], v) for k, v in mup.full_state_dict().items())
    after_sp, after_mup = _train(_engine(sp)), _train(_engine(mup))
    assert all(torch.equal(after_sp[k], v) for k, v in after_mup.items())


def test_away_from_the_base_width_init_and_rates_scale_with_width():
    base, wide = _model(mup_base_width=64), _model(hidden=256, ffn=768, heads=8, mup_base_width=64)
    sp_wide = _model(hidden=256, ffn=768, heads=8)
    m = 4.0
    w, s = wide.full_state_dict(), sp_wide.full_state_dict()
    assert w["embed.weight"].std().item() == pytest.approx(s["embed.weight"].std().item(), rel=1e-6)
    assert w["head.weight"].std().item() == pytest.approx(s["head.weight"].std().item() / m, rel=1e-6)
    for name in ("layers.0.attn.wq.weight", "layers.1.mlp.w_down.weight"):
        assert w[name].std().item() == pytest.approx(s[name].std().item() / m**0.5, rel=1e-6), name
    groups = param_groups(wide, 0.1)
    scales = {id(p): g.get("lr_scale", 1.0) for g in groups for p in g["params"]}
    assert scales[id(wide.embed.weight)] == 1.0 and scales[id(wide.head.weight)] == 1 / m
    assert scales[id(wide.layers[0].attn.wqkv.weight)] == 1 / m
    assert all(scales[id(p)] == 1.0 for p in wide.parameters() if p.dim() < 2)
    assert len(param_groups(base, 0.1)) == 3 and len(param_groups(sp_wide, 0.1)) == 2
    engine = _engine(wide)
    set_optimizer_hparams(engine, 2e-3, 0.1)
    rates = sorted({g["lr"] for g in engine.optimizer.param_groups})
    assert rates == [pytest.approx(2e-3 / m), 2e-3]


def test_bad_base_width_is_refused():
    with pytest.raises(ConfigError, match=r"mup_base_width: must be >= 0 \(0 = off\), got -1"):
        preset("floatlm-nano", mup_base_width=-1)
