"""HF interop: FloatLM and TriLM against transformers' LlamaForCausalLM, both directions, offline."""

import json

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from trilm.model import build_model, preset
from trilm.store.hf import write_hf_files
from trilm.store.open import open_model


def import_hf(path, family=None):
    """(config, canonical state) of an HF directory, read through the store."""
    opened = open_model(path, family=family)
    return opened.config, opened.weights.float_state()


TOL = 1e-5


def _ids():
    return torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(1))


def _hf_logits(path, ids):
    hf = LlamaForCausalLM.from_pretrained(path, torch_dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        return hf(ids).logits


@pytest.mark.parametrize("kv_heads", [None, 2])
def test_floatlm_export_matches_transformers(tmp_path, kv_heads):
    model = build_model(preset("floatlm-nano", vocab_size=256, kv_heads=kv_heads), tp=1, seed=11)
    write_hf_files(model.cfg, model.full_state_dict(), tmp_path)
    ids = _ids()
    with torch.no_grad():
        ours = model(ids)
    assert (ours - _hf_logits(tmp_path, ids)).abs().max() <= TOL


def test_transformers_model_imports_as_floatlm(tmp_path):
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
    )
    hf = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for p in hf.parameters():  # norms start at 1: perturb them so a mis-mapped gain is caught
            p.add_(torch.randn_like(p) * 0.02)
    hf.save_pretrained(tmp_path, safe_serialization=True)
    cfg, state = import_hf(tmp_path)
    assert cfg.family == "floatlm" and cfg.padded_vocab == 256
    model = build_model(cfg, tp=1, seed=None)
    model.load_full_state_dict(state)
    ids = _ids()
    with torch.no_grad():
        assert (model(ids) - hf(ids).logits).abs().max() <= TOL


@pytest.mark.parametrize(
    ("family", "partitions", "group"), [("trilm", 2, "shard"), ("trilm", 1, "tensor"), ("bilm", 2, "shard")]
)
def test_quantized_export_is_unpacked_and_reproduces_logits(tmp_path, family, partitions, group):
    cfg = preset(f"{family}-nano", vocab_size=256, quant={"partitions": partitions, "scale_group": group})
    model = build_model(cfg, tp=1, seed=4)
    write_hf_files(model.cfg, model.full_state_dict(), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["pretraining_model_parallel"] == partitions
    ids = _ids()
    with torch.no_grad():
        ours = model(ids)
    assert (ours - _hf_logits(tmp_path, ids)).abs().max() <= TOL

    from safetensors.torch import load_file

    weights = load_file(str(tmp_path / "model.safetensors"))
    for name, w in weights.items():
        if name.endswith("proj.weight"):
            distinct = torch.unique(w.abs())
            assert len(distinct) <= 1 + partitions, (name, distinct)
            if family == "trilm":
                assert (w == 0).any()

    cfg2, state = import_hf(tmp_path, family=family)
    assert cfg2.quant.partitions == partitions
    back = build_model(cfg2, tp=1, seed=None)
    back.load_full_state_dict(state)
    with torch.no_grad():
        assert (back(ids) - ours).abs().max() <= TOL


def test_import_rejects_non_llama(tmp_path):
    from trilm.config import ConfigError

    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]})
    )
    with pytest.raises(ConfigError, match="config.json: model_type/architectures"):
        import_hf(tmp_path)
