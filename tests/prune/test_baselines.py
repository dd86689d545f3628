"""The baselines: what each metric measures, and that every method keeps exactly the requested share."""

import pytest
import torch

from trilm.prune.metrics import collect_stats, unit_scores
from trilm.prune.search import PGConfig, WindowSampler, pg_search
from trilm.prune.slicing import select_units
from trilm.prune.units import unit_group

from .conftest import VOCAB, tiny_model, token_ids


@pytest.fixture(scope="module")
def scored():
    _, _, model = tiny_model(layers=4)
    windows = token_ids(n=6, seq=32, seed=3)
    return model, collect_stats(model, windows, batch_size=3), windows


@pytest.mark.parametrize(
    ("metric", "granularity"),
    [("magnitude", "head"), ("magnitude", "channel"), ("wanda", "head"), ("wanda", "channel"),
     ("block-importance", "layer")],
)  # fmt: skip
@pytest.mark.parametrize("keep", [0.9, 0.8, 0.7, 0.5])
def test_baselines_keep_the_requested_ratio(scored, metric, granularity, keep):
    model, stats, _ = scored
    group = unit_group(model.cfg, granularity)
    scores = unit_scores(model, group, metric, stats)
    assert scores.shape == (group.total,) and torch.isfinite(scores).all()
    mask = select_units(scores, group, keep)
    assert int(mask.sum()) == int(keep * group.total + 0.5)
    assert scores[mask].min() >= scores[~mask].max() if (~mask).any() else True
    if granularity != "layer":
        per_layer = select_units(scores, group, keep, per_layer=True)
        for block in group.split(per_layer):
            assert int(block.sum()) == int(keep * block.numel() + 0.5)


def test_wanda_and_magnitude_measure_what_they_say(scored):
    model, stats, windows = scored
    mlp = model.layers[2].mlp
    channel = unit_scores(model, unit_group(model.cfg, "channel"), "wanda", stats)
    acts = []
    hook = mlp.w_down.register_forward_pre_hook(lambda _m, a: acts.append(a[0].reshape(-1, a[0].shape[-1])))
    with torch.no_grad():
        model(windows)
    hook.remove()
    x = torch.cat(acts).double()
    rms = x.pow(2).mean(0).sqrt()
    expected = (mlp.w_down.weight.double().abs() * rms).mean(0)
    ffn = model.cfg.ffn
    torch.testing.assert_close(channel[2 * ffn : 3 * ffn], expected)

    attn = model.layers[1].attn
    heads = unit_scores(model, unit_group(model.cfg, "head"), "magnitude")
    hd, rep = model.cfg.head_dim, model.cfg.heads // model.cfg.num_kv_heads
    g = 1  # KV group 1 of block 1: query heads 2, 3; KV head 1
    owned = [
        attn.wq.weight[g * rep * hd : (g + 1) * rep * hd].flatten(),
        attn.wk.weight[g * hd : (g + 1) * hd].flatten(),
        attn.wv.weight[g * hd : (g + 1) * hd].flatten(),
        attn.wo.weight[:, g * rep * hd : (g + 1) * rep * hd].flatten(),
    ]
    assert float(heads[2 + g]) == pytest.approx(float(torch.cat(owned).double().norm()))


def test_block_importance_removes_the_block_that_changes_nothing():
    _, _, model = tiny_model(layers=4)
    with torch.no_grad():
        model.layers[2].attn.wo.weight.zero_()
        model.layers[2].mlp.w_down.weight.zero_()  # block 2 is now the identity
    stats = collect_stats(model, token_ids(n=4, seq=32), batch_size=2)
    group = unit_group(model.cfg, "layer")
    scores = unit_scores(model, group, "block-importance", stats)
    assert float(scores[2]) == pytest.approx(0.0, abs=1e-6)
    assert select_units(scores, group, 0.75).tolist() == [True, True, False, True]


@pytest.mark.parametrize(("granularity", "metric"), [("channel", "wanda"), ("layer", "block-importance")])
def test_pg_without_steps_keeps_what_its_metric_keeps(scored, granularity, metric):
    """The search starts from the metric: with no step taken it must select the metric's units."""
    model, stats, _ = scored
    group = unit_group(model.cfg, granularity)
    metric_scores = unit_scores(model, group, metric, stats)
    tokens = torch.randint(0, VOCAB, (2000,), generator=torch.Generator().manual_seed(0))
    sampler = WindowSampler(tokens, 16, 2, 0, "toy")
    result = pg_search(
        model, [group], 0.7, sampler, PGConfig(steps=0), metrics={granularity: metric_scores}, progress=False
    )
    s = result.scores[granularity]
    assert torch.equal(select_units(s, group, 0.7, tiebreak=s), select_units(metric_scores, group, 0.7))
