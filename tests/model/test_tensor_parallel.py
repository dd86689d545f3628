"""TP=2 (two gloo processes) against TP=1 from the same full weights, and checkpoints across TP degrees."""

import pytest
import torch

from trilm.model import build_model, preset
from trilm.parallel import ParallelConfig, init_parallel
from trilm.testing.cluster import run_distributed
from trilm.train.models import load_model, save_model

pytestmark = pytest.mark.distributed


def _cfg(family, **quant):
    return preset(f"{family}-nano", vocab_size=256, quant=quant)


def _tp2_logits(cfg, state, input_ids, labels, snapshot_dir):
    init_parallel(ParallelConfig(tensor_parallel=2))
    model = build_model(cfg, seed=None)
    if state is None:
        model.reset_parameters(seed=7)
    else:
        model.load_full_state_dict(state)
    with torch.no_grad():
        logits = model(input_ids)
        loss = model(input_ids, labels=labels)
    if snapshot_dir is not None:
        save_model(model, snapshot_dir)
    return logits, loss, model.cfg.quant.partitions


def _inputs():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 256, (2, 17), generator=g)
    return ids[:, :-1], ids[:, 1:]


def test_floatlm_tp2_matches_tp1():
    cfg = _cfg("floatlm")
    ids, labels = _inputs()
    ref = build_model(cfg, tp=1, seed=3)
    state = ref.full_state_dict()
    with torch.no_grad():
        want, want_loss = ref(ids), ref(ids, labels=labels)
    results = run_distributed(_tp2_logits, 2, cfg, state, ids, labels, None)
    for logits, loss, _ in results:
        assert (logits - want).abs().max() <= 1e-5
        assert (loss - want_loss).abs().max() <= 1e-5


def test_init_is_tensor_parallel_invariant(tmp_path):
    cfg = _cfg("floatlm")
    run_distributed(_tp2_logits, 2, cfg, None, *_inputs(), str(tmp_path / "snap"))
    loaded = load_model(tmp_path / "snap", tp=1)
    ref = build_model(cfg, tp=1, seed=7)
    for name, tensor in ref.full_state_dict().items():
        assert torch.equal(tensor, loaded.full_state_dict()[name]), name


@pytest.mark.parametrize("activation_bits", [None, 8])
def test_trilm_trained_at_tp2_reproduces_at_tp1(tmp_path, activation_bits):
    cfg = _cfg("trilm", activation_bits=activation_bits)
    ids, labels = _inputs()
    results = run_distributed(_tp2_logits, 2, cfg, None, ids, labels, str(tmp_path / "snap"))
    tp2_logits, _, partitions = results[0]
    assert partitions == 2
    model = load_model(tmp_path / "snap", tp=1)
    assert model.cfg.quant.partitions == 2
    with torch.no_grad():
        assert (model(ids) - tp2_logits).abs().max() <= 1e-5
    # The TP=1 run without the recorded partitions would quantize differently: the record matters.
    plain = build_model(_cfg("trilm", activation_bits=activation_bits, partitions=1), tp=1, seed=None)
    plain.load_full_state_dict(model.full_state_dict())
    with torch.no_grad():
        assert (plain(ids) - tp2_logits).abs().max() > 1e-4


def test_trilm_tp1_checkpoint_at_tp2_reduces_scales_across_ranks():
    cfg = _cfg("trilm", partitions=1)
    ids, labels = _inputs()
    ref = build_model(cfg, tp=1, seed=5)
    with torch.no_grad():
        want = ref(ids)
    results = run_distributed(_tp2_logits, 2, cfg, ref.full_state_dict(), ids, labels, None)
    for logits, _, partitions in results:
        assert partitions == 1
        assert (logits - want).abs().max() <= 1e-5
