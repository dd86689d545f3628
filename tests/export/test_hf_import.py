"""Faithful import: refuse what trilm cannot represent, read sharded checkpoints, name tensors, round trip."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, LlamaForCausalLM

from trilm.cli import main
from trilm.config import ConfigError
from trilm.export.hf import export_snapshot_hf, import_snapshot_hf
from trilm.store.open import open_model
from trilm.store.snapshot import read_snapshot_config
from trilm.train.models import load_model


def import_hf(path, family=None):
    """(config, canonical state) of an HF directory, read through the store."""
    opened = open_model(path, family=family)
    return opened.config, opened.weights.float_state()


def _hf_dir(tmp_path, theta=10000.0, vocab=256, **overrides):
    config = LlamaConfig(
        rope_parameters={"rope_type": "default", "rope_theta": theta},
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        bos_token_id=5,
        eos_token_id=7,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    path = tmp_path / "hf"
    model.save_pretrained(path, safe_serialization=True)
    data = json.loads((path / "config.json").read_text())
    data.update(overrides)
    (path / "config.json").write_text(json.dumps(data))
    return path, model


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "rope_scaling.rope_type 'dynamic'"),
        ({"rope_scaling": {"rope_type": "linear", "factor": 2.0, "beta": 1}}, r"rope_scaling\.beta"),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}}, "rope_parameters"),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
        ({"attention_bias": True}, "attention_bias=true"),
        ({"mlp_bias": True}, "mlp_bias=true"),
        ({"head_dim": 0}, "head_dim 0: expected a positive integer"),
    ],
)
def test_refuses_configs_it_cannot_represent(tmp_path, change, message):
    path, _ = _hf_dir(tmp_path, **change)
    with pytest.raises(ConfigError, match=message):
        import_hf(path)


def test_refuses_bias_tensors_missing_misshapen_and_ambiguous_weights(tmp_path):
    path, _ = _hf_dir(tmp_path)
    weights = path / "model.safetensors"
    state = load_file(str(weights))
    save_file({**state, "model.layers.0.self_attn.q_proj.bias": torch.zeros(64)}, str(weights))
    with pytest.raises(ConfigError, match=r"bias tensors .*model\.layers\.0\.self_attn\.q_proj\.bias"):
        import_hf(path)
    save_file({k: v for k, v in state.items() if k != "lm_head.weight"}, str(weights))
    with pytest.raises(ConfigError, match=r"missing tensor\(s\) lm_head\.weight \(config.json does not tie"):
        import_hf(path)
    save_file({k: v for k, v in state.items() if "layers.1.mlp.up_proj" not in k}, str(weights))
    with pytest.raises(ConfigError, match=r"missing tensor\(s\) model\.layers\.1\.mlp\.up_proj\.weight"):
        import_hf(path)
    bad = dict(state)
    bad["model.layers.1.self_attn.k_proj.weight"] = torch.zeros(64, 64)
    save_file(bad, str(weights))
    with pytest.raises(
        ConfigError, match=r"k_proj\.weight has shape \(64, 64\), config\.json implies \(32, 64\)"
    ):
        import_hf(path)
    save_file(state, str(weights))
    save_file(state, str(path / "consolidated.safetensors"))
    with pytest.raises(ConfigError, match="ambiguous weights: 2 safetensors files"):
        import_hf(path)


def test_sharded_checkpoint_is_read_through_its_index(tmp_path):
    path, _ = _hf_dir(tmp_path)
    state = load_file(str(path / "model.safetensors"))
    (path / "model.safetensors").unlink()
    names = sorted(state)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    weight_map = {}
    for file, keys in shards.items():
        save_file({k: state[k] for k in keys}, str(path / file))
        weight_map.update(dict.fromkeys(keys, file))
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    save_file(state, str(path / "leftover.safetensors"))
    with pytest.raises(ConfigError, match="leftover.safetensors not named by model.safetensors.index.json"):
        import_hf(path)
    (path / "leftover.safetensors").unlink()
    cfg, ours = import_hf(path)
    assert cfg.num_kv_heads == 2
    assert torch.equal(ours["layers.1.mlp.w_down.weight"], state["model.layers.1.mlp.down_proj.weight"])


def test_round_trip_keeps_special_ids_theta_tokenizer_and_logits(tmp_path, make_snapshot, tokenizer):
    path, hf = _hf_dir(tmp_path, theta=123456.0, vocab=512)  # the fixture tokenizer's 512 pieces fit
    snap = tmp_path / "snap"
    assert main(["import", "hf", str(path), str(snap)]) == 0
    assert (snap / "COMPLETE").is_file()
    cfg, meta = read_snapshot_config(snap)
    assert cfg.rope_theta == 123456.0
    meta = meta.to_dict()
    assert meta["extra"]["hf"] == {"bos_token_id": 5, "eos_token_id": 7}
    from trilm.export.hf import special_ids

    assert special_ids(open_model(snap)) == (5, 7)  # what a tokenizer-less re-export writes
    ids = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (load_model(snap, tp=1)(ids) - hf(ids).logits).abs().max() < 1e-5
    # no tokenizer in that directory: export needs one, then ids 5/7 survive from the import
    again = tmp_path / "again"
    export_snapshot_hf(snap, again, dtype="float32", tokenizer=tokenizer.path)
    config = json.loads((again / "config.json").read_text())
    assert config["rope_theta"] == 123456.0 and config["rope_parameters"]["rope_theta"] == 123456.0
    assert (config["bos_token_id"], config["eos_token_id"]) == (1, 2)  # the tokenizer given wins

    trilm_snap = make_snapshot("trilm", quant={"partitions": 2}, rope_theta=20000.0)
    first = tmp_path / "first"
    export_snapshot_hf(trilm_snap, first, dtype="float32")
    back = tmp_path / "back"
    import_snapshot_hf(first, back)
    cfg2, meta2 = read_snapshot_config(back)
    assert cfg2.family == "trilm" and cfg2.quant.partitions == 2 and cfg2.rope_theta == 20000.0
    assert (back / "tokenizer.model").read_bytes() == tokenizer.path.read_bytes()
    meta2 = meta2.to_dict()
    assert meta2["tokenizer_hash"] == tokenizer.hash
    second = tmp_path / "second"
    export_snapshot_hf(back, second, dtype="float32")
    a, b = load_file(str(first / "model.safetensors")), load_file(str(second / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6, rtol=0) for k in a)
    for name in ("config.json", "tokenizer_config.json", "generation_config.json", "tokenizer.json"):
        x, y = json.loads((first / name).read_text()), json.loads((second / name).read_text())
        assert {k: v for k, v in x.items() if k != "trilm"} == {k: v for k, v in y.items() if k != "trilm"}


def test_import_refuses_a_non_empty_output(tmp_path):
    path, _ = _hf_dir(tmp_path)
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("")
    with pytest.raises(ConfigError, match="exists and is not empty"):
        import_snapshot_hf(path, tmp_path / "taken")
