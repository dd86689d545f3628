"""Packed export: codes and partition scales through the codec, loadable by trilm, smaller than fp16."""

from __future__ import annotations

import pytest
import torch

from trilm.cli import main
from trilm.config import ConfigError
from trilm.export.hf import export_snapshot_hf
from trilm.export.packed import export_snapshot_packed
from trilm.formats import BinaryWeight, IntWeight, TernaryWeight
from trilm.infer import load_inference_model
from trilm.store.open import open_model
from trilm.store.snapshot import read_snapshot_config, write_snapshot
from trilm.train.models import load_model


def _ids():
    return torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize(("family", "cls"), [("trilm", TernaryWeight), ("bilm", BinaryWeight)])
def test_packed_export_loads_with_the_same_logits(make_snapshot, tmp_path, family, cls):
    snap = make_snapshot(family, seed=3, quant={"partitions": 2})
    report = export_snapshot_packed(snap, tmp_path / "packed", dtype="float32")
    layers = open_model(tmp_path / "packed").weights.packed_layers()
    assert len(layers) == 2 * 7 and all(isinstance(w, cls) for w in layers.values())
    wo = layers["layers.0.attn.wo"]  # row-parallel: one scale per input-column partition
    assert wo.scales.shape == (2, 64) and len(torch.unique(wo.scales)) == 2
    with torch.no_grad():
        want = load_inference_model(snap)(_ids())
        got = load_inference_model(tmp_path / "packed")(_ids())
    assert (want - got).abs().max() <= 1e-5 and report.max_logit_error <= 1e-5
    assert (tmp_path / "packed" / "tokenizer.model").is_file() and (
        tmp_path / "packed" / "COMPLETE"
    ).is_file()
    cfg, meta = read_snapshot_config(tmp_path / "packed")
    assert cfg.family == family and meta.step == 10 and meta.tokenizer_hash
    # the HF export of the packed export is the HF export of the snapshot
    a = export_snapshot_hf(snap, tmp_path / "hf-a", dtype="float32")
    b = export_snapshot_hf(tmp_path / "packed", tmp_path / "hf-b", dtype="float32")
    from safetensors.torch import load_file

    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_default_fp16_report_and_refusals(make_snapshot, tmp_path, capsys):
    snap = make_snapshot("trilm", seed=1, hidden=256, ffn=512, layers=2)
    assert main(["export", "packed", str(snap), str(tmp_path / "p")]) == 0
    out = capsys.readouterr().out
    assert "MiB on disk vs" in out and "stored bits/weight" in out
    report = export_snapshot_packed(snap, tmp_path / "p")  # rerun of the same export
    assert report.bytes < 0.5 * report.fp16_bytes and 2.0 < report.linear_bits < 2.2
    floatlm = make_snapshot("floatlm", run="f")
    with pytest.raises(ConfigError, match="a FloatLM has no ternary/binary codes"):
        export_snapshot_packed(floatlm, tmp_path / "f")
    with pytest.raises(ConfigError, match="holds another export"):
        export_snapshot_packed(make_snapshot("trilm", run="other"), tmp_path / "p")


def test_quantlm_layers_pass_through(make_snapshot, tmp_path):

    snap = make_snapshot("floatlm", seed=2)
    cfg, meta = read_snapshot_config(snap)
    state = load_model(snap, tp=1).full_state_dict()
    packed = {k.removesuffix(".weight"): IntWeight.from_float(v, 4, 64) for k, v in state.items()
              if k.startswith("layers.") and "norm" not in k}  # fmt: skip
    floats = {k: v for k, v in state.items() if k.removesuffix(".weight") not in packed}
    quant = tmp_path / "quantlm"
    write_snapshot(quant, cfg, meta, floats, packed, tokenizer=snap.parent.parent / "tokenizer.model")
    export_snapshot_packed(quant, tmp_path / "again", dtype="float32")
    again = open_model(tmp_path / "again").weights.packed_layers()
    assert again.keys() == packed.keys()
    assert all(torch.equal(again[k].qweight, packed[k].qweight) for k in packed)
