"""open_model: every kind of model directory, recognised, checked and read through one function."""

from __future__ import annotations

import pytest
import torch

from tests.robustness.fixtures import flip_exponent_bit
from trilm.config import ConfigError
from trilm.model.snapshot import SnapshotMeta
from trilm.store import IntegrityError, StoreError, open_model
from trilm.store import snapshot as store
from trilm.store.integrity import verify_directory
from trilm.train.models import save_model


def test_kinds(tmp_path, make_snapshot, tokenizer):
    run_snap = make_snapshot("floatlm")
    m = open_model(run_snap)
    assert m.kind == "run-snapshot" and m.run_dir == run_snap.parent.parent and m.step == 10
    assert m.tokenizer.source == "run" and m.tokenizer.hash == tokenizer.hash and m.add_bos is False
    assert m.label == "floatlm-nano/step-10"
    state = m.weights.float_state()
    assert set(state) >= {"embed.weight", "head.weight"} and m.weights.packed_layers() == {}

    from trilm.formats import IntWeight

    packed = {
        k.removesuffix(".weight"): IntWeight.from_float(v, bits=4, group_size=32)
        for k, v in state.items()
        if k.startswith("layers.") and "norm" not in k
    }
    rest = {k: v for k, v in state.items() if k.removesuffix(".weight") not in packed}
    meta = SnapshotMeta(family="floatlm", extra={"quant": {"method": "rtn"}}, tokenizer_hash=tokenizer.hash)
    q = store.write_snapshot(tmp_path / "q", m.config, meta, rest, packed, tokenizer=tokenizer.path)
    quantlm = open_model(q)
    assert quantlm.kind == "quantlm" and quantlm.stored_packed and quantlm.tokenizer.source == "model"
    with pytest.warns(DeprecationWarning, match="stored_packed"):
        assert quantlm.is_packed  # the deprecated alias of stored_packed
    assert not m.stored_packed  # a run snapshot holds latent weights
    assert set(quantlm.weights.packed_layers()) == set(packed)
    pruned = store.write_snapshot(tmp_path / "p", m.config, SnapshotMeta(extra={"pruning": {}}), state)
    assert open_model(pruned).kind == "pruned" and open_model(pruned).tokenizer.tokenizer is None

    with pytest.raises(
        StoreError, match="a training run directory, not one model; give one of its snapshots"
    ):
        open_model(run_snap.parent.parent)
    (tmp_path / "split").mkdir()
    (tmp_path / "split" / "index.json").write_text("{}")
    with pytest.raises(
        StoreError, match="no config.json: not a model directory .it looks like a prepared data"
    ):
        open_model(tmp_path / "split")
    with pytest.raises(StoreError, match="not a directory but a file"):
        open_model(run_snap / "config.json")


def test_hf_and_suite_checkpoint(tmp_path, make_snapshot, tokenizer):
    from trilm.cli import main

    snap = make_snapshot("trilm")
    assert (
        main(["export", "suite", str(snap.parent.parent), "--out", str(tmp_path / "suite"), "--no-progress"])
        == 0
    )
    checkpoint = tmp_path / "suite" / "trilm-nano" / "step-10"
    m = open_model(checkpoint)
    assert (
        m.kind == "suite-checkpoint"
        and m.path == checkpoint / "latent"
        and m.tokenizer.hash == tokenizer.hash
    )
    hf = open_model(checkpoint / "hf")
    assert hf.kind == "hf" and hf.tokenizer.hash == tokenizer.hash and hf.meta.step == 10
    assert hf.config.family == "trilm" and set(hf.weights.float_state()) == set(m.weights.float_state())
    with pytest.raises(StoreError, match="an exported suite, not one model"):
        open_model(tmp_path / "suite")


def test_truncated_flipped_and_non_finite_weights_are_named(tmp_path, make_snapshot):
    snap = make_snapshot("floatlm")
    weights = snap / "model.safetensors"
    original = weights.read_bytes()

    flip_exponent_bit(weights, "layers.0.mlp.w_up.weight", 3)
    with pytest.raises(IntegrityError, match=r"model.safetensors: CRC-32 differs .*corrupted"):
        open_model(snap).weights.float_state()  # checked on opening (small files) or before first use
    assert any("CRC-32" in p for p in verify_directory(snap))
    assert open_model(snap, verify=False).weights.float_state()  # the explicit opt-out reads it

    weights.write_bytes(original[: len(original) // 2])
    with pytest.raises(IntegrityError, match=r"model.safetensors: .* bytes, .* when written \(truncated"):
        open_model(snap)

    (snap / "COMPLETE").unlink()
    with pytest.raises(IntegrityError, match="no COMPLETE marker: the snapshot was not finished"):
        open_model(snap)

    loose = tmp_path / "loose"  # a standalone snapshot without a manifest: readability is still checked
    loose.mkdir()
    (loose / "config.json").write_bytes((snap / "config.json").read_bytes())
    (loose / "model.safetensors").write_bytes(original[:-100])
    with pytest.raises(IntegrityError, match=r"loose/model.safetensors: cannot be read as safetensors"):
        open_model(loose).weights.float_state()

    m = open_model(make_snapshot("floatlm", run="inf"))
    state = dict(m.weights.float_state())
    state["layers.1.attn.wq.weight"] = state["layers.1.attn.wq.weight"].clone()
    state["layers.1.attn.wq.weight"][2, 5] = float("inf")
    bad = store.write_snapshot(tmp_path / "inf-model", m.config, m.meta, state)  # sealed as written
    with pytest.raises(
        IntegrityError, match=r"tensor layers.1.attn.wq.weight holds 1 non-finite value\(s\) \(inf"
    ):
        open_model(bad).weights.float_state()


def test_fingerprint_and_save_model_refuses_to_overwrite(tmp_path, make_snapshot):
    from trilm.train.models import load_model

    snap = make_snapshot("floatlm")
    a = open_model(snap).fingerprint()
    assert a == open_model(snap).fingerprint() and len(a) == 64
    model = load_model(snap, tp=1)
    with pytest.raises(StoreError, match="exists and is not empty"):
        save_model(model, snap)
    save_model(model, snap, meta=open_model(snap).meta, replace=True)
    assert torch.equal(
        load_model(snap, tp=1).full_state_dict()["head.weight"], model.full_state_dict()["head.weight"]
    )
    with pytest.raises(ConfigError):
        store.read_snapshot_config(tmp_path)
