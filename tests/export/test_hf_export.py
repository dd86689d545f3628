"""HF export that clients accept: tokenizer files, config forms, generation config, refusals."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from trilm.cli import main
from trilm.config import ConfigError
from trilm.export.hf import export_snapshot_hf
from trilm.train.models import load_model


def _ids():
    return torch.randint(0, 512, (2, 20), generator=torch.Generator().manual_seed(3))


def test_floatlm_export_loads_in_transformers_with_same_ids_logits_and_greedy_tokens(
    make_snapshot, tokenizer, probe_texts, tmp_path
):
    snap = make_snapshot("floatlm", seed=5, rope_theta=50000.0)
    out = export_snapshot_hf(snap, tmp_path / "hf", dtype="float32")
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.model"} <= names
    assert {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "README.md"} <= names

    hf_tok = AutoTokenizer.from_pretrained(out)
    for text in [*probe_texts, "  a literal </s> in text\n\tand 12345 ünï 🙂"]:
        assert hf_tok(text).input_ids == tokenizer.encode(text)  # no BOS: trained without it
        ids = tokenizer.encode(text)
        assert hf_tok.decode(ids) == tokenizer.decode(ids)
    assert (hf_tok.bos_token_id, hf_tok.eos_token_id, hf_tok.unk_token_id) == (1, 2, 0)
    tok_config = json.loads((out / "tokenizer_config.json").read_text())
    assert tok_config["add_bos_token"] is False and tok_config["model_max_length"] == 128

    config = AutoConfig.from_pretrained(out)
    assert config.rope_parameters["rope_theta"] == 50000.0 and config.dtype == torch.float32
    raw = json.loads((out / "config.json").read_text())
    assert raw["rope_theta"] == 50000.0 and raw["torch_dtype"] == "float32"  # what 4.x reads
    assert (raw["bos_token_id"], raw["eos_token_id"]) == (1, 2)
    generation = json.loads((out / "generation_config.json").read_text())
    assert (generation["bos_token_id"], generation["eos_token_id"]) == (1, 2)

    ours = load_model(snap, tp=1).eval()
    hf = AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
    ids = _ids()
    with torch.no_grad():
        assert (ours(ids) - hf(ids).logits).abs().max() <= 1e-5
    prompt = torch.tensor([tokenizer.encode("In the beginning")])
    with torch.no_grad():
        generated = hf.generate(prompt, max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0)
        seq = prompt
        for _ in range(12):
            nxt = ours(seq)[0, -1].argmax()
            seq = torch.cat([seq, nxt.view(1, 1)], dim=1)
    assert generated.tolist() == seq.tolist()


def test_trilm_export_default_dtype_is_float16_and_unpacked(make_snapshot, tmp_path, capsys):
    snap = make_snapshot("trilm", seed=2, quant={"partitions": 2})
    assert main(["export", "hf", str(snap), str(tmp_path / "hf")]) == 0
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["dtype"] == config["torch_dtype"] == "float16"
    assert config["pretraining_model_parallel"] == 2
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    ours = load_model(snap, tp=1).eval()
    with torch.no_grad():
        diff = (ours(_ids()) - hf(_ids()).logits).abs().max()
    assert diff < 5e-2  # fp16 storage of γ·Ŵ and the float tensors
    w = hf.model.layers[0].self_attn.o_proj.weight
    assert len(torch.unique(w.abs())) <= 3  # 0 and one γ per partition


def test_export_help_states_default_dtype(capsys):
    with pytest.raises(SystemExit):
        main(["export", "hf", "--help"])
    assert "default: float16" in capsys.readouterr().out


def test_refuses_incomplete_snapshot_foreign_output_and_wrong_tokenizer(make_snapshot, tmp_path, tokenizer):
    a = make_snapshot("floatlm", run="a")
    b = make_snapshot("floatlm", run="b", seed=1)
    out = tmp_path / "out"
    export_snapshot_hf(a, out)
    first = (out / "model.safetensors").read_bytes()
    export_snapshot_hf(a, out)  # the same export again replaces itself
    with pytest.raises(ConfigError, match="holds another export"):
        export_snapshot_hf(b, out)
    assert (out / "model.safetensors").read_bytes() == first
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="holds no trilm export"):
        export_snapshot_hf(a, other)
    (b / "COMPLETE").unlink()
    with pytest.raises(ConfigError, match="no COMPLETE marker"):
        export_snapshot_hf(b, tmp_path / "new")
    assert main(["export", "hf", str(b), str(tmp_path / "new")]) == 2
    from trilm.data.tokenizer import train_tokenizer

    from .conftest import corpus_texts

    wrong = train_tokenizer(corpus_texts("train", 5), tmp_path / "w" / "tokenizer.model", vocab_size=400)
    with pytest.raises(ConfigError, match="differs from the expected"):
        export_snapshot_hf(a, tmp_path / "new2", tokenizer=wrong.path)
    (a.parent.parent / "tokenizer.model").unlink()
    with pytest.raises(ConfigError, match="pass --tokenizer"):
        export_snapshot_hf(a, tmp_path / "new3")
    assert export_snapshot_hf(a, tmp_path / "new4", tokenizer=tokenizer.path).is_dir()
    assert not any(p.name.startswith(".tmp-") for p in tmp_path.iterdir())
