"""Activation recompute and sequence parallelism change memory, not results: loss and gradients equal the
plain path (recompute on one process; sequence parallelism on two gloo ranks at TP=2)."""

import pytest
import torch

from trilm.model import build_model, preset
from trilm.parallel import ParallelConfig, init_parallel
from trilm.testing.cluster import run_distributed


@pytest.fixture
def one_thread():
    """Small models on a busy 2-core machine: two threads mostly wait on each other."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _ids(batch=2, seq=32, vocab=256):
    return torch.randint(0, vocab, (batch, seq + 1), generator=torch.Generator().manual_seed(0))


def _loss_and_grads(model, ids):
    loss = model(ids[:, :-1], labels=ids[:, 1:]).mean()
    loss.backward()
    return loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("family", ["trilm", "floatlm"])
@pytest.mark.parametrize("blocks", ["all", 1])
def test_recompute_gives_the_plain_loss_and_gradients(family, blocks, one_thread):
    cfg = preset(f"{family}-nano", vocab_size=256)
    ids = _ids()
    plain_loss, plain = _loss_and_grads(build_model(cfg, seed=1), ids)
    model = build_model(cfg, seed=1)
    model.set_recompute(blocks)
    assert len(model.recompute) == (cfg.layers if blocks == "all" else 1)
    loss, grads = _loss_and_grads(model, ids)
    assert torch.equal(loss, plain_loss)
    for name, grad in grads.items():
        assert torch.equal(grad, plain[name]), name


def test_recompute_refuses_more_blocks_than_the_model_has():
    model = build_model(preset("trilm-nano", vocab_size=256), seed=1)
    with pytest.raises(ValueError, match="recompute: 3 blocks, the model has 2"):
        model.set_recompute(3)


def _tp2_runs(ids):
    """Per rank and family: (loss, local grads) plain TP=2, with sequence parallelism, SP + recompute."""
    out = {}
    for family in ("trilm", "floatlm"):
        cfg = preset(f"{family}-nano", vocab_size=256, quant={"activation_bits": 8})
        for name, sp, recompute in (("plain", False, 0), ("sp", True, 0), ("sp+recompute", True, "all")):
            init_parallel(ParallelConfig(tensor_parallel=2, sequence_parallel=sp))
            model = build_model(cfg, seed=5)
            model.set_recompute(recompute)
            shapes: list[tuple[int, ...]] = []
            model.layers[0].register_forward_hook(lambda m, args, y, seen=shapes: seen.append(tuple(y.shape)))
            out[family, name] = (*_loss_and_grads(model, ids), shapes[0])
    return out


@pytest.mark.distributed
def test_sequence_parallel_gives_the_plain_loss_and_gradients():
    ids = _ids()
    for rank_result in run_distributed(_tp2_runs, 2, ids):
        for family in ("trilm", "floatlm"):
            plain_loss, plain, plain_shape = rank_result[family, "plain"]
            assert plain_shape == (2, 32, 64)
            for variant in ("sp", "sp+recompute"):
                loss, grads, shape = rank_result[family, variant]
                assert shape == (2, 16, 64)  # the residual stream holds half the sequence per rank
                torch.testing.assert_close(loss, plain_loss, rtol=0, atol=1e-6)
                assert grads.keys() == plain.keys()
                for name, grad in grads.items():  # collectives sum in another order: fp32 rounding only
                    torch.testing.assert_close(grad, plain[name], rtol=1e-5, atol=1e-7, msg=name)


def _step_peak(cfg, ids, recompute=0, linear_impl=None, monkeypatch=None):
    """Weights + allocator-level peak of one forward/backward (gradients created inside are counted)."""
    from trilm.memory import measure_peak, tensor_bytes

    if linear_impl is not None:
        import trilm.model.layers as layers

        monkeypatch.setattr(layers, "_linear_impl", linear_impl)
    model = build_model(cfg, seed=0)
    model.set_recompute(recompute)
    with measure_peak("cpu") as peak:
        model(ids[:, :-1], labels=ids[:, 1:]).mean().backward()
    if monkeypatch is not None:
        monkeypatch.undo()
    return tensor_bytes(model.parameters()) + peak.peak_bytes


def test_trilm_step_memory_within_5_percent_of_floatlm(monkeypatch, one_thread):
    from tests.model.test_quant import _megatron_linear_on_fake_quant

    ids = _ids(batch=2, seq=64, vocab=512)
    float_cfg = preset("floatlm-micro", vocab_size=512)
    tri_cfg = preset("trilm-micro", vocab_size=512)
    floatlm = _step_peak(float_cfg, ids)
    trilm = _step_peak(tri_cfg, ids)
    assert trilm <= 1.05 * floatlm, trilm / floatlm
    # the accounting sees the difference: keeping W̃ for backward (the previous path) costs a weight copy
    before = _step_peak(tri_cfg, ids, linear_impl=_megatron_linear_on_fake_quant, monkeypatch=monkeypatch)
    assert before > 1.25 * floatlm, before / floatlm
    # and recompute of every block lowers the peak of the same step
    assert _step_peak(tri_cfg, _ids(batch=4, seq=64, vocab=512), recompute="all") < _step_peak(
        tri_cfg, _ids(batch=4, seq=64, vocab=512)
    )


def test_dry_run_activation_estimate_matches_the_allocator(one_thread):
    """The plan's activation memory (no recompute) against the bytes a real forward keeps for backward."""
    from trilm.memory import measure_peak
    from trilm.train.config import TrainConfig
    from trilm.train.plan import RunPlan

    b, s = 4, 128
    cfg = TrainConfig.from_dict(
        {"model": {"preset": "trilm-micro", "vocab_size": 512}, "seq_len": s, "batch_tokens": b * s}
        | {"tokens": b * s, "micro_batch": b, "precision": "fp32", "data": {"train_dir": "unused"}}
    )
    plan = RunPlan(cfg, dp_size=1, tp_size=1)
    model = build_model(cfg.model, seed=0)
    ids = _ids(batch=b, seq=s, vocab=512)
    with measure_peak("cpu") as kept:
        loss = model(ids[:, :-1], labels=ids[:, 1:]).mean()
    assert kept.end_bytes == pytest.approx(plan.memory_gb(0)["activations"] * 1e9, rel=0.15)
    assert plan.memory_gb("all")["activations"] < plan.memory_gb(0)["activations"] / 2
    loss.backward()


@pytest.mark.slow
def test_compiled_blocks_and_fused_quantizer_match_eager(one_thread):
    """The speed levers change no result: compiled blocks (with recompute) and the compiled quantizer."""
    from trilm.model.quant import ScaleLayout, quantized_linear, set_fused_quantizer
    from trilm.train.config import TrainConfig
    from trilm.train.engine import prepare_model

    cfg = preset("trilm-nano", vocab_size=256)
    ids = _ids()
    eager_loss, eager = _loss_and_grads(build_model(cfg, seed=2), ids)
    model = build_model(cfg, seed=2)
    train_cfg = TrainConfig.from_dict(
        {"model": cfg.to_dict(), "compile": True, "recompute": "all", "data": {"train_dir": "unused"}}
    )
    prepare_model(model, train_cfg)
    loss, grads = _loss_and_grads(model, ids)
    torch.testing.assert_close(loss, eager_loss, rtol=1e-5, atol=0)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, eager[name], rtol=1e-4, atol=1e-6, msg=name)

    layout = ScaleLayout(fmt="ternary", group="shard", partitions=2, parallel="column", segments=(8, 4))
    w = (torch.randn(12, 16) * 0.02).requires_grad_()
    x = torch.randn(3, 16, requires_grad=True)
    outs = []
    for fused in (False, True):
        set_fused_quantizer(fused)
        try:
            y = quantized_linear(x, w, layout)
            y.backward(torch.ones_like(y))
            outs.append((y.detach(), x.grad.clone(), w.grad.clone()))
            x.grad = w.grad = None
        finally:
            set_fused_quantizer(False)
    for a, b in zip(*outs):  # the generated mean|W| may sum in another order: last-bit differences
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
