"""The lean inference model against the training decoder, for every family, shape and weight source."""

import pytest
import torch

from trilm.config import ConfigError
from trilm.formats import IntWeight
from trilm.infer import from_state_dict, load_inference_model, load_with_meta
from trilm.model import build_model, parameter_counts, preset
from trilm.model.snapshot import SnapshotMeta
from trilm.model.spec import canonical_shapes
from trilm.store.hf import write_hf_files
from trilm.store.snapshot import read_snapshot_config, write_snapshot
from trilm.train.models import load_model, save_model

TOL = 1e-5


def _ids(vocab=300, seq=24):
    return torch.randint(0, vocab, (2, seq), generator=torch.Generator().manual_seed(1))


def _max_rel(a, b):
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("family", ["floatlm", "trilm", "bilm"])
@pytest.mark.parametrize("kv_heads", [None, 2])
def test_logits_equal_training_decoder(family, kv_heads):
    cfg = preset(f"{family}-nano", vocab_size=300, kv_heads=kv_heads)
    train = build_model(cfg, tp=1, seed=5)
    infer = from_state_dict(train.cfg, train.full_state_dict())
    ids = _ids()
    with torch.no_grad():
        assert (infer(ids) - train(ids)).abs().max() <= TOL


def test_trilm_with_training_partitions_matches():
    """A TriLM trained at TP=2 records two scale partitions per matrix; the lean model keeps them."""
    cfg = preset("trilm-nano", vocab_size=300, quant={"partitions": 2})
    train = build_model(cfg, tp=1, seed=2)
    infer = from_state_dict(train.cfg, train.full_state_dict())
    with torch.no_grad():
        assert (infer(_ids()) - train(_ids())).abs().max() <= TOL


@pytest.mark.parametrize("family", ["trilm", "bilm"])
def test_packed_native_layers_match_dequantized(family):
    train = build_model(preset(f"{family}-nano", vocab_size=300), tp=1, seed=4)
    state = train.full_state_dict()
    dense = from_state_dict(train.cfg, state)
    packed = from_state_dict(train.cfg, state, pack_native=True, backend="torch")
    kinds = {type(m).__name__ for m in packed.linear_modules().values()}
    assert kinds == {"QuantLinear"}
    with torch.no_grad():
        assert _max_rel(packed(_ids()), dense(_ids())) <= TOL


def _pruned_cfg(family="floatlm"):
    return preset(
        f"{family}-nano",
        vocab_size=300,
        kv_heads=2,
        layer_kv_heads=[1, 0],
        layer_ffn=[96, 0] if family == "floatlm" else [128, 0],
    )


@pytest.mark.parametrize("family", ["floatlm", "trilm"])
def test_per_layer_shapes_build_count_and_match(family):
    cfg = _pruned_cfg(family)
    train = build_model(cfg, tp=1, seed=3)
    assert sum(p.numel() for p in train.parameters()) == parameter_counts(cfg).total
    assert list(train.canonical_shapes().items()) == list(canonical_shapes(train.cfg).items())
    assert train.layers[1].attn is None and train.layers[1].mlp is None
    infer = from_state_dict(train.cfg, train.full_state_dict())
    with torch.no_grad():
        assert (infer(_ids()) - train(_ids())).abs().max() <= TOL


def test_per_layer_config_errors_name_the_key():
    with pytest.raises(ConfigError, match=r"layer_ffn: has 3 entries but the model has layers=2"):
        preset("floatlm-nano", layer_ffn=[1, 2, 3])
    with pytest.raises(ConfigError, match=r"layer_kv_heads\[1\]: 5 exceeds kv_heads=4"):
        preset("floatlm-nano", layer_kv_heads=[4, 5])
    with pytest.raises(ConfigError, match=r"layer_ffn\[0\]: must be >= 0"):
        preset("floatlm-nano", layer_ffn=[-1, 4])


def test_pruned_model_is_refused_by_hf_export(tmp_path):
    train = build_model(_pruned_cfg(), tp=1, seed=3)
    with pytest.raises(ConfigError, match="per-layer head counts"):
        write_hf_files(train.cfg, train.full_state_dict(), tmp_path)


def test_snapshot_and_hf_directory_load(tmp_path):
    train = build_model(preset("trilm-nano", vocab_size=256), tp=1, seed=6)
    save_model(train, tmp_path / "snap", meta={"step": 3, "family": "trilm", "size": "trilm-nano"})
    write_hf_files(train.cfg, train.full_state_dict(), tmp_path / "hf")
    ids = _ids(256)
    with torch.no_grad():
        ref = train(ids)
        model, meta = load_with_meta(tmp_path / "snap")
        assert meta.step == 3 and meta.size == "nano"  # older family-prefixed sizes are normalised
        assert (model(ids) - ref).abs().max() <= TOL
        from_hf = load_inference_model(tmp_path / "hf")
        assert (from_hf(ids) - ref).abs().max() <= TOL
    assert not any(p.requires_grad for p in from_hf.parameters())


def test_packed_snapshot_round_trip(tmp_path):
    train = build_model(preset("floatlm-nano", vocab_size=256), tp=1, seed=7)
    state = train.full_state_dict()
    packed = {
        name.removesuffix(".weight"): IntWeight.from_float(state[name], bits=4, group_size=64)
        for name in state
        if name.startswith("layers.") and "norm" not in name
    }
    rest = {k: v for k, v in state.items() if f"{k.removesuffix('.weight')}" not in packed}
    meta = SnapshotMeta(family="floatlm", size="nano", extra={"quant": {"method": "rtn", "bits": 4}})
    write_snapshot(tmp_path / "q", train.cfg, meta, rest, packed)
    cfg, meta_back = read_snapshot_config(tmp_path / "q")
    assert meta_back.extra["quant"]["method"] == "rtn"
    model = load_inference_model(tmp_path / "q", backend="torch")
    dequant = {**rest, **{f"{k}.weight": w.dequantize() for k, w in packed.items()}}
    reference = from_state_dict(cfg, dequant)
    ids = _ids(256)
    with torch.no_grad():
        assert _max_rel(model(ids), reference(ids)) <= TOL
    with pytest.raises(ConfigError, match="packed snapshot"):
        load_model(tmp_path / "q")


def test_packed_snapshot_writer_refuses_incomplete_or_misshapen(tmp_path):
    train = build_model(preset("floatlm-nano", vocab_size=256), tp=1, seed=7)
    state = train.full_state_dict()
    del state["layers.0.attn.wq.weight"]
    with pytest.raises(ConfigError, match=r"missing \['layers.0.attn.wq.weight'\]"):
        write_snapshot(tmp_path / "a", train.cfg, None, state, {})
    state["layers.0.attn.wq.weight"] = torch.zeros(3, 3)
    with pytest.raises(ConfigError, match="tensor shapes do not match"):
        write_snapshot(tmp_path / "b", train.cfg, None, state, {})
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_loader_errors_name_the_problem(tmp_path):
    with pytest.raises(ConfigError, match="nope: not a directory"):
        load_inference_model(tmp_path / "nope")
    with pytest.raises(ConfigError, match="no config.json"):
        load_inference_model(tmp_path)
    train = build_model(preset("floatlm-nano", vocab_size=256), tp=1, seed=7)
    state = train.full_state_dict()
    state.pop("norm.weight")
    with pytest.raises(ConfigError, match=r"missing \['norm.weight'\]"):
        from_state_dict(train.cfg, state)


def test_rope_positions_match_contiguous():
    model = from_state_dict(*_nano_float())
    cos, sin = model.rope(10)
    pos = torch.tensor([[3, 4], [7, 8]])
    cos2, sin2 = model.rope(pos)
    assert cos2.shape == (2, 1, 2, model.cfg.head_dim)
    assert torch.equal(cos2[1, 0, 1], cos[8]) and torch.equal(sin2[0, 0, 0], sin[3])
    with pytest.raises(ValueError, match="exceeds the model context 128"):
        model.rope(129)


def _nano_float():
    train = build_model(preset("floatlm-nano", vocab_size=256), tp=1, seed=1)
    return train.cfg, train.full_state_dict()
