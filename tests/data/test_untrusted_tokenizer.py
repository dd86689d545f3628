"""Damaged tokenizer files: ``Tokenizer.load`` answers with a :class:`DataError` naming the file.

A SentencePiece model is a protobuf, which a cut at a field boundary leaves parseable (a smaller model), so
truncation there is "read or named"; a ``tokenizer.json`` cut anywhere before its last byte is not
JSON and must be named. Bit flips may leave either kind loadable; they must never escape as another type.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.untrusted import SETTINGS, flip, named
from trilm.data.errors import DataError
from trilm.data.tokenizer import Tokenizer, read_sidecar, train_tokenizer

TEXTS = ["the cat sat on the mat", "a dog ran in the fog", "lorem ipsum dolor sit amet"] * 20


@pytest.fixture(scope="module")
def spm_bytes(tmp_path_factory) -> bytes:
    path = tmp_path_factory.mktemp("spm") / "tokenizer.model"
    train_tokenizer(TEXTS, path, vocab_size=300, max_sentences=200)
    return path.read_bytes()


@pytest.fixture(scope="module")
def hf_json(tmp_path_factory) -> bytes:
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import models, pre_tokenizers

    vocab = {t: i for i, t in enumerate(["<unk>", "</s>", "a", "b", "ab", "Ġ", "Ġa"])}
    tok = RustTokenizer(models.BPE(vocab, [("a", "b"), ("Ġ", "a")], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    data = json.loads(tok.to_str())
    data["added_tokens"] = [
        {"id": 1, "content": "</s>", "single_word": False, "lstrip": False, "rstrip": False}
        | {"normalized": False, "special": True}
    ]
    return json.dumps(data).encode()


def _load_hf(path):
    config = {"eos_token": "</s>", "tokenizer_class": "PreTrainedTokenizerFast"}
    (path.parent / "tokenizer_config.json").write_text(json.dumps(config))
    tok = Tokenizer.load(path)
    return tok.encode("ab a")


@SETTINGS
@given(data=st.data())
def test_a_damaged_sentencepiece_model_is_read_or_named(spm_bytes, tmp_path, data):
    if data.draw(st.booleans()):
        damaged = spm_bytes[: data.draw(st.integers(0, len(spm_bytes) - 1))]
    else:
        damaged = flip(spm_bytes, data.draw(st.integers(0, len(spm_bytes) * 8 - 1)))
    path = tmp_path / "tokenizer.model"
    path.write_bytes(damaged)
    named(lambda: Tokenizer.load(path), DataError, path, must_fail=not damaged)


def test_the_hf_fixture_loads(hf_json, tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_bytes(hf_json)
    assert _load_hf(path)


@SETTINGS
@given(data=st.data())
def test_a_truncated_tokenizer_json_is_named(hf_json, tmp_path, data):
    path = tmp_path / "tokenizer.json"
    path.write_bytes(hf_json[: data.draw(st.integers(0, len(hf_json) - 1))])
    named(lambda: _load_hf(path), DataError, path, must_fail=True)


@SETTINGS
@given(data=st.data())
def test_bit_flips_in_a_tokenizer_json_are_read_or_named(hf_json, tmp_path, data):
    damaged = hf_json
    for bit in data.draw(st.lists(st.integers(0, len(hf_json) * 8 - 1), min_size=1, max_size=3)):
        damaged = flip(damaged, bit)
    path = tmp_path / "tokenizer.json"
    path.write_bytes(damaged)
    named(lambda: _load_hf(path), DataError, path, must_fail=False)


@pytest.mark.parametrize("raw", [b"\xff\xfe{", b"[" * 100000, b'{"hash": '])
def test_a_damaged_sidecar_is_named(tmp_path, raw):
    model = tmp_path / "tokenizer.model"
    model.write_bytes(b"")
    sidecar = tmp_path / "tokenizer.trilm.json"
    sidecar.write_bytes(raw)
    named(lambda: read_sidecar(model), DataError, tmp_path, must_fail=True)
