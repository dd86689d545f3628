"""The Llamas people ship, built here in miniature with transformers and tokenizers: tied embeddings, GQA, an
explicit head_dim, RoPE scaling and a byte-level BPE tokenizer, through import, evaluation, GGUF and back."""

from __future__ import annotations

import json
import math

import pytest
import torch
from tokenizers import Tokenizer as RustTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from tests.export.conftest import corpus_texts
from trilm.cli import main
from trilm.config import ConfigError
from trilm.data.tokenizer import Tokenizer, train_tokenizer
from trilm.infer import load_inference_model
from trilm.store import open_model

CHAT = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
VOCAB = 384
PROBES = [
    "The quick brown fox jumps over the lazy dog.",
    "  spaces,   tabs\tand\nnew lines\r\n",
    "digits 1234567890, naïve café 漢字 🙂",
    "a literal <|im_end|> inside text",
    "def f(x):\n    return x ** 2\n",
]


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory):
    """A byte-level BPE tokenizer trained here with `tokenizers`, saved as transformers saves one."""
    rust = RustTokenizer(models.BPE())
    rust.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    rust.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    rust.train_from_iterator(corpus_texts("train", 40), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=rust, bos_token="<|im_start|>", eos_token="<|im_end|>", unk_token="<|endoftext|>"
    )
    fast.chat_template = CHAT
    out = tmp_path_factory.mktemp("bpe")
    fast.save_pretrained(out)
    assert len(fast) == VOCAB
    return out


def llama_dir(tmp_path, bpe_dir, name="hf", **overrides):
    """A tiny LlamaForCausalLM with the BPE tokenizer: tied, GQA, head_dim 24 ≠ 64/4 by default."""
    import shutil

    settings = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=24,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    settings.update(overrides)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**settings)).eval()
    path = tmp_path / name
    model.save_pretrained(path)
    for f in bpe_dir.iterdir():
        shutil.copy(f, path / f.name)
    return path, model


def test_bpe_tokenizer_is_autotokenizer(bpe_dir):
    ours = Tokenizer.load(bpe_dir)
    theirs = AutoTokenizer.from_pretrained(bpe_dir)
    assert ours.kind == "hf" and ours.vocab_size == VOCAB and ours.eos_id == 2 and ours.bos_id == 1
    for text in PROBES + [t[:3000] for t in corpus_texts("validation", 4)]:
        ids = ours.encode(text)
        assert ids == theirs(text, add_special_tokens=False)["input_ids"]
        assert ours.decode(ids) == theirs.decode(ids)
    messages = [{"role": "user", "content": "Hi there"}]
    assert ours.render_chat(messages) == theirs.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    assert ours.encode_batch(PROBES[:2]) == [ours.encode(t) for t in PROBES[:2]]


ROPE = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 2.0},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32,
    },
}


@pytest.mark.parametrize("rope", list(ROPE))
def test_import_hf_keeps_logits_tied_gqa_head_dim_and_rope(tmp_path, bpe_dir, rope, capsys):
    params = {"rope_type": "default", "rope_theta": 10000.0}
    if ROPE[rope]:
        params = {**ROPE[rope], "rope_theta": 10000.0}
    path, model = llama_dir(tmp_path, bpe_dir, rope_parameters=params)
    out = tmp_path / "snap"
    assert main(["import", "hf", str(path), str(out)]) == 0
    assert "tied embeddings" in capsys.readouterr().out
    opened = open_model(out)
    assert opened.meta.extra["tied_embeddings"] is True
    assert opened.config.head_dim == 24 and opened.config.num_kv_heads == 2
    assert (opened.config.rope_scaling is None) == (ROPE[rope] is None)
    assert opened.tokenizer.tokenizer.kind == "hf" and (out / "chat_template.jinja").is_file()
    ids = torch.randint(0, VOCAB, (2, 200), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(ids).logits
        got = load_inference_model(out)(ids)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


def test_refusals_name_the_key(tmp_path, bpe_dir):
    path, _ = llama_dir(tmp_path, bpe_dir)
    config = json.loads((path / "config.json").read_text())
    config["rope_parameters"] = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=r"rope_parameters\.rope_type 'yarn' is not supported"):
        open_model(path)


def _jsonl(path, texts):
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return path


def test_eval_ppl_on_raw_text_equals_transformers(tmp_path, bpe_dir):
    path, model = llama_dir(tmp_path, bpe_dir)
    texts = [t[:1500] for t in corpus_texts("validation", 3)]
    data = _jsonl(tmp_path / "eval.jsonl", texts)
    result = tmp_path / "ppl.json"
    assert (
        main(["eval", "ppl", str(path), "--data", str(data), "--seq-len", "128", "--json", str(result)]) == 0
    )
    ppl = json.loads(result.read_text())["ppl"]
    tok = AutoTokenizer.from_pretrained(path)
    stream = [tok.eos_token_id]  # EOS before every document, as the data path writes them
    for t in texts:
        stream += tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    stream = torch.tensor(stream)
    nll, n = 0.0, 0
    with torch.no_grad():
        for start in range(0, stream.numel() - 1, 128):
            window = stream[start : start + 129]
            logp = torch.log_softmax(model(window[None, :-1]).logits[0].double(), -1)
            nll -= float(logp.gather(-1, window[1:, None]).sum())
            n += window.numel() - 1
    # two fp32 forwards of one function (logits agree within ~2e-5): the mean loss within ~1e-5 nats
    assert ppl == pytest.approx(math.exp(nll / n), rel=1e-4)


def foreign_sp(tmp_path):
    """A SentencePiece tokenizer of another model, of the same size class (380 tokens) as the BPE one."""
    out = tmp_path / "sp" / "tokenizer.model"
    return train_tokenizer(corpus_texts("train", 20), out, vocab_size=380, character_coverage=0.995)


def test_foreign_tokenizer_is_refused_unless_forced(tmp_path, bpe_dir, capsys):
    path, _ = llama_dir(tmp_path, bpe_dir)
    data = _jsonl(tmp_path / "eval.jsonl", [t[:800] for t in corpus_texts("validation", 2)])
    foreign = foreign_sp(tmp_path)
    argv = ["eval", "ppl", str(path), "--data", str(data), "--seq-len", "64", "--no-progress"]
    assert main([*argv, "--tokenizer", str(foreign.path)]) == 2
    err = capsys.readouterr().err
    assert "its vocabulary is not that of the model's own tokenizer" in err and "--force-tokenizer" in err
    assert main([*argv, "--tokenizer", str(foreign.path), "--force-tokenizer"]) == 0
    assert "warning: --force-tokenizer" in capsys.readouterr().err
    # the model's own tokenizer, given by path, is accepted
    assert main([*argv, "--tokenizer", str(bpe_dir / "tokenizer.json")]) == 0
    # a model directory without a tokenizer of its own: the vocabulary size says the tokenizer is not its
    big, _ = llama_dir(tmp_path, bpe_dir, name="big", vocab_size=1024)
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"):
        (big / f).unlink(missing_ok=True)
    capsys.readouterr()
    assert main(["eval", "ppl", str(big), "--data", str(data), "--tokenizer", str(bpe_dir)]) == 2
    assert "the tokenizer has 384 tokens, the model's vocabulary 1,024" in capsys.readouterr().err


def test_quantize_calibration_with_a_foreign_tokenizer_is_refused_unless_forced(tmp_path, bpe_dir, capsys):
    path, _ = llama_dir(tmp_path, bpe_dir)
    data = _jsonl(tmp_path / "calib.jsonl", [t[:800] for t in corpus_texts("train", 2)])
    foreign = foreign_sp(tmp_path)
    argv = ["quantize", str(path), "--method", "gptq", "--bits", "4", "--group-size", "16"]
    argv += ["--calib", str(data), "--samples", "2", "--seq-len", "32", "--no-progress"]
    argv += ["--tokenizer", str(foreign.path)]
    assert main([*argv, "--out", str(tmp_path / "q1")]) == 2
    err = capsys.readouterr().err
    assert "its vocabulary is not that of the model's own tokenizer" in err and "--force-tokenizer" in err
    assert not (tmp_path / "q1").exists()
    assert main([*argv, "--out", str(tmp_path / "q2"), "--force-tokenizer"]) == 0
    assert "warning: --force-tokenizer" in capsys.readouterr().err
    assert (tmp_path / "q2" / "model.safetensors").is_file()


def test_gguf_round_trip_of_a_tied_bpe_llama(tmp_path, bpe_dir, capsys):
    path, model = llama_dir(tmp_path, bpe_dir, head_dim=16)
    snap, gguf_file, back = tmp_path / "snap", tmp_path / "m.gguf", tmp_path / "back"
    assert main(["import", "hf", str(path), str(snap)]) == 0
    assert main(["export", "gguf", str(snap), str(gguf_file), "--type", "f16"]) == 2
    assert "tokenizer.ggml.pre" in capsys.readouterr().err
    assert (
        main(["export", "gguf", str(snap), str(gguf_file), "--type", "f16", "--tokenizer-pre", "gpt2"]) == 0
    )
    from gguf import GGUFReader

    names = {t.name for t in GGUFReader(gguf_file).tensors}
    assert "output.weight" not in names  # tied again
    assert main(["import", "gguf", str(gguf_file), str(back)]) == 0
    assert "embeddings tied" in capsys.readouterr().out
    a, b = open_model(snap), open_model(back)
    assert b.tokenizer.tokenizer.vocabulary() == a.tokenizer.tokenizer.vocabulary()
    for text in PROBES:
        assert b.tokenizer.tokenizer.encode(text) == a.tokenizer.tokenizer.encode(text)
    assert b.tokenizer.tokenizer.chat_template == CHAT and b.meta.extra["gguf"]["tokenizer_pre"] == "gpt2"
    ids = torch.randint(0, VOCAB, (1, 64), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = model(ids).logits
        got = load_inference_model(back)(ids)
    torch.testing.assert_close(got, want, atol=5e-3, rtol=5e-3)  # F16 weights
    # a second export reads the pre-tokenizer recorded at import
    assert main(["export", "gguf", str(back), str(tmp_path / "again.gguf"), "--type", "q8_0"]) == 0


def test_gguf_import_of_block_quantized_types(tmp_path, bpe_dir):
    """Q8_0 / Q4_0 / Q4_1 tensors, written with the gguf package, import as their dequantized values."""
    import gguf
    import numpy as np
    from gguf import GGMLQuantizationType as T

    path, _ = llama_dir(tmp_path, bpe_dir, head_dim=16, intermediate_size=128)
    snap, f16 = tmp_path / "snap", tmp_path / "f16.gguf"
    assert main(["import", "hf", str(path), str(snap)]) == 0
    assert main(["export", "gguf", str(snap), str(f16), "--type", "f16", "--tokenizer-pre", "gpt2"]) == 0
    reader = gguf.GGUFReader(f16)
    for qtype in (T.Q8_0, T.Q4_0, T.Q4_1):
        out = tmp_path / f"{qtype.name}.gguf"
        writer = gguf.GGUFWriter(out, "llama")
        for key, field in reader.fields.items():
            if key.startswith("GGUF.") or key == "general.architecture":
                continue
            value = field.contents()
            vtype = field.types[0] if field.types else None
            if vtype == gguf.GGUFValueType.ARRAY:
                writer.add_key_value(key, value, vtype, sub_type=field.types[-1])
            else:
                writer.add_key_value(key, value, vtype)
        expected = {}
        for t in reader.tensors:
            array = gguf.quants.dequantize(t.data, t.tensor_type).reshape([int(n) for n in reversed(t.shape)])
            array = array.astype(np.float32)
            kind = qtype if array.ndim == 2 and t.name.startswith("blk.") else T.F32
            stored = gguf.quants.quantize(array, kind) if kind != T.F32 else array
            writer.add_tensor(t.name, stored, raw_dtype=None if kind == T.F32 else kind)
            expected[t.name] = gguf.quants.dequantize(stored, kind) if kind != T.F32 else array
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        back = tmp_path / f"back-{qtype.name}"
        assert main(["import", "gguf", str(out), str(back)]) == 0
        opened = open_model(back)
        assert opened.meta.extra["gguf"]["tensor_types"][qtype.name] == 2 * 7
        w = opened.weights.float_state()["layers.1.mlp.w_down.weight"]
        torch.testing.assert_close(w, torch.from_numpy(expected["blk.1.ffn_down.weight"].reshape(w.shape)))


def test_gguf_import_refuses_by_name(tmp_path):
    import gguf

    out = tmp_path / "gpt2.gguf"
    writer = gguf.GGUFWriter(out, "gpt2")
    writer.add_block_count(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(Exception, match=r"general.architecture 'gpt2': trilm imports llama-architecture"):
        from trilm.export.gguf_import import import_gguf

        import_gguf(out, tmp_path / "x")


def test_hf_export_of_an_imported_tied_llama_loads_in_transformers(tmp_path, bpe_dir):
    path, model = llama_dir(tmp_path, bpe_dir)
    snap, out = tmp_path / "snap", tmp_path / "out"
    assert main(["import", "hf", str(path), str(snap)]) == 0
    assert main(["export", "hf", str(snap), str(out), "--dtype", "float32"]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["tie_word_embeddings"] is True and config["head_dim"] == 24
    back = LlamaForCausalLM.from_pretrained(out).eval()
    ids = torch.randint(0, VOCAB, (1, 50), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(back(ids).logits, model(ids).logits, atol=2e-5, rtol=1e-4)
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.chat_template == CHAT and tok(PROBES[0])["input_ids"] == Tokenizer.load(bpe_dir).encode(
        PROBES[0]
    )


def test_data_prepare_with_the_models_bpe_tokenizer(tmp_path, bpe_dir, capsys):
    path, _ = llama_dir(tmp_path, bpe_dir)
    split = tmp_path / "val"
    argv = ["data", "prepare", "--split", "validation", "--tokenizer", str(bpe_dir / "tokenizer.json")]
    assert main([*argv, "--out", str(split), "--no-progress"]) == 0
    ppl = tmp_path / "ppl.json"
    args = ["eval", "ppl", str(path), "--data", str(split), "--seq-len", "64", "--max-tokens", "640"]
    assert main([*args, "--json", str(ppl), "--no-progress"]) == 0
    foreign = foreign_sp(tmp_path)
    other = tmp_path / "val-sp"
    sp_argv = [
        "data",
        "prepare",
        "--split",
        "validation",
        "--tokenizer",
        str(foreign.path),
        "--out",
        str(other),
    ]
    assert main([*sp_argv, "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["eval", "ppl", str(path), "--data", str(other), "--seq-len", "64", "--no-progress"]) == 2
    assert "prepared with tokenizer" in capsys.readouterr().err


def test_chat_is_served_with_the_models_template(tmp_path, bpe_dir):
    import openai

    from trilm.serve import Engine
    from trilm.serve.server import BackgroundServer

    torch.set_num_threads(1)
    path, _ = llama_dir(tmp_path, bpe_dir)
    engine = Engine.load(path, device="cpu", max_batch=2)
    server = BackgroundServer(engine, "tiny").start()
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        messages = [{"role": "user", "content": "Hello there"}]
        out = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0)
        prompt = Tokenizer.load(bpe_dir).render_chat(messages)
        assert prompt.endswith("<|im_start|>assistant\n")
        assert out.usage.prompt_tokens == len(engine.tokenizer.encode(prompt))
        assert out.choices[0].finish_reason in ("stop", "length")
    finally:
        server.stop()
