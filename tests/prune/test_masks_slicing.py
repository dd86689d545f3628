"""Masks inside the forward pass equal slicing the weights; the search never touches the weights."""

import pytest
import torch

from trilm.infer import from_state_dict
from trilm.prune.masks import UnitMasks
from trilm.prune.search import PGConfig, WindowSampler, pg_search
from trilm.prune.slicing import slice_model
from trilm.prune.units import unit_group

from .conftest import VOCAB, tiny_model, token_ids


def _random_keep(group, seed, drop_all_in=None):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(group.total, generator=g) < 0.6
    for layer, (start, count) in enumerate(zip(group.offsets, group.counts)):
        if layer == drop_all_in:
            mask[start : start + count] = False
        elif count and not mask[start : start + count].any():
            mask[start] = True
    return mask


@pytest.mark.parametrize(
    "granularities",
    [("head",), ("channel",), ("layer",), ("head", "channel")],
)
def test_sliced_model_equals_masked_full_model(granularities):
    _, state, full = tiny_model()
    groups = [unit_group(full.cfg, g) for g in granularities]
    kept = {}
    for i, group in enumerate(groups):
        # heads: block 1 loses all its KV groups (its attention sub-block disappears)
        drop = 1 if group.granularity in ("head", "channel") else None
        kept[group.granularity] = (group, _random_keep(group, seed=i, drop_all_in=drop))
    if "layer" in kept:
        kept["layer"] = (groups[0], torch.tensor([True, False, True]))
    new_cfg, new_state = slice_model(full.cfg, state, kept)
    small = from_state_dict(new_cfg, new_state).eval()
    ids = token_ids()
    with torch.no_grad(), UnitMasks(full, groups) as masks:
        masks.set({name: mask.float() for name, (_, mask) in kept.items()})
        masked = full(ids)
        masks.set(None)
        dense = full(ids)
    with torch.no_grad():
        sliced = small(ids)
    assert (sliced - masked).abs().max() <= 1e-5
    assert (sliced - dense).abs().max() > 1e-3  # the masks did something
    assert sum(p.numel() for p in small.parameters()) < sum(p.numel() for p in full.parameters())
    if "head" in kept:
        assert new_cfg.layer_kv_heads[1] == 0 and small.layers[1].attn is None
    if "layer" in kept:
        assert new_cfg.layers == 2


def test_masks_off_is_the_dense_model_bit_for_bit():
    _, _, full = tiny_model()
    groups = [unit_group(full.cfg, "head"), unit_group(full.cfg, "layer")]
    ids = token_ids()
    with torch.no_grad():
        ref = full(ids)
        with UnitMasks(full, groups) as masks:
            masks.set({"head": torch.ones(groups[0].total), "layer": torch.ones(3)})
            assert torch.equal(full(ids), ref)
            masks.set(None)
            assert torch.equal(full(ids), ref)
        assert torch.equal(full(ids), ref)  # hooks removed


@pytest.mark.parametrize("granularity", ["head", "channel", "layer"])
def test_search_gives_the_weights_no_gradient(granularity):
    _, _, model = tiny_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    tokens = torch.randint(0, VOCAB, (4000,), generator=torch.Generator().manual_seed(0))
    cfg = PGConfig(steps=4, batch_size=2, seq_len=16, lr=0.5)
    sampler = WindowSampler(tokens, cfg.seq_len, cfg.batch_size, 0, "toy")
    group = unit_group(model.cfg, granularity)
    result = pg_search(model, [group], 0.67, sampler, cfg, progress=False, measure_memory=False)
    assert all(p.grad is None and not p.requires_grad for p in model.parameters())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    s = result.scores[granularity]
    assert not torch.equal(s, result.initial[granularity])  # the scores did move
    assert float(s.sum()) <= round(0.67 * group.total) + 1e-9  # one-sided projection: at most the budget
    assert len(result.losses) == 4


def test_search_refuses_a_model_with_trainable_weights():
    _, _, model = tiny_model()
    model.head.weight.requires_grad_(True)
    tokens = torch.randint(0, VOCAB, (2000,), generator=torch.Generator().manual_seed(0))
    sampler = WindowSampler(tokens, 16, 2, 0, "toy")
    with pytest.raises(AssertionError, match="require gradients"):
        pg_search(model, [unit_group(model.cfg, "channel")], 0.5, sampler, PGConfig(steps=1), progress=False)


def test_search_is_seeded():
    tokens = torch.randint(0, VOCAB, (4000,), generator=torch.Generator().manual_seed(0))
    runs = []
    for _ in range(2):
        _, _, model = tiny_model()
        cfg = PGConfig(steps=3, batch_size=2, seq_len=16, lr=0.5, seed=5)
        sampler = WindowSampler(tokens, cfg.seq_len, cfg.batch_size, cfg.seed, "toy")
        group = unit_group(model.cfg, "channel")
        runs.append(pg_search(model, [group], 0.5, sampler, cfg, progress=False, measure_memory=False))
    assert torch.equal(runs[0].scores["channel"], runs[1].scores["channel"])
