"""Tokenizer: training settings (byte fallback, exact round trip), padding, content hash and its check."""

from __future__ import annotations

import json

import pytest

from trilm.data.errors import DataError
from trilm.data.pipeline import TokenizerConfig
from trilm.data.tokenizer import Tokenizer, padded_size, read_sidecar, train_tokenizer

TEXT = [
    "In the beginning God created the heaven and the earth.\nAnd the earth was without form, and void.",
    "def main(argv):\n    return 0  # four spaces of indentation\n\n\tTabbed line",
    "SQLite is a C-language library that implements a small, fast, self-contained SQL database engine.",
] * 20


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return train_tokenizer(TEXT, tmp_path_factory.mktemp("tok") / "tiny.model", vocab_size=300)


def test_round_trip_is_exact_and_bytes_fall_back(tiny):
    for text in [*TEXT[:3], "  leading spaces,  doubled  spaces\n\n\nand newlines\t", "naïve 漢字 ☃ 🙂 ∑"]:
        ids = tiny.encode(text)
        assert tiny.decode(ids) == text
        assert all(0 <= i < tiny.vocab_size for i in ids)
    assert tiny.unk_id not in tiny.encode("漢字 ☃ 🙂")  # unseen characters become byte pieces, not <unk>


def test_special_ids_sizes_and_sidecar(tiny):
    assert (tiny.unk_id, tiny.bos_id, tiny.eos_id) == (0, 1, 2)
    assert tiny.vocab_size == 300
    assert tiny.padded_vocab_size(64) == 320 and tiny.padded_vocab_size(128) == 384
    assert padded_size(4096, 128) == 4096 and padded_size(4097, 64) == 4160
    sidecar = tiny.path.with_name(tiny.path.stem + ".trilm.json")
    assert not tiny.path.with_suffix(".json").exists()  # Hugging Face's tokenizer.json name stays free
    meta = json.loads(sidecar.read_text())
    assert meta["hash"] == tiny.hash and meta["vocab_size"] == 300 and meta["byte_fallback"] is True
    assert read_sidecar(tiny.path) == meta


def test_legacy_sidecar_name_is_still_read_and_hf_file_is_not_taken_for_one(tmp_path):
    model = tmp_path / "tokenizer.model"
    model.write_bytes(b"")
    assert read_sidecar(model) is None
    (tmp_path / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"type": "BPE"}}))
    assert read_sidecar(model) is None
    (tmp_path / "tokenizer.json").write_text(json.dumps({"hash": "ab" * 32}))
    assert read_sidecar(model) == {"hash": "ab" * 32}


def test_hash_check_on_load(tiny, tmp_path):
    assert Tokenizer.load(tiny.path, expected_hash=tiny.hash).hash == tiny.hash
    with pytest.raises(DataError, match="differs from the expected"):
        Tokenizer.load(tiny.path, expected_hash="0" * 64)
    other = train_tokenizer(TEXT, tmp_path / "other.model", vocab_size=320)
    assert other.hash != tiny.hash
    with pytest.raises(DataError, match="another tokenizer"):
        Tokenizer.load(other.path, expected_hash=tiny.hash)
    (tmp_path / "garbage.model").write_bytes(b"not a model")
    with pytest.raises(DataError, match="not a SentencePiece model"):
        Tokenizer.load(tmp_path / "garbage.model")
    with pytest.raises(DataError, match="no such tokenizer"):
        Tokenizer.load(tmp_path / "missing.model")


def test_training_is_reproducible_and_validated(tmp_path, corpus):
    a = train_tokenizer(TEXT, tmp_path / "a.model", vocab_size=300)
    b = train_tokenizer(TEXT, tmp_path / "b.model", vocab_size=300)
    assert a.hash == b.hash
    with pytest.raises(DataError, match="too small"):
        train_tokenizer(TEXT, tmp_path / "c.model", vocab_size=100)
    with pytest.raises(DataError, match="no training text"):
        train_tokenizer(["", "  "], tmp_path / "d.model", vocab_size=300)
    cfg = TokenizerConfig(
        input=str(corpus),
        out=str(tmp_path / "e"),
        split="validation",
        vocab_size=512,
        exclude_sources=["RedPajamaGithub"],
    )
    tok = cfg.build()
    assert tok.path == tmp_path / "e" / "tokenizer.model" and tok.vocab_size == 512
    meta = read_sidecar(tok.path)
    assert tok.path.with_name("tokenizer.trilm.json").is_file()
    assert meta["trained_on"]["split"] == "validation" and len(meta["trained_on"]["files"]) == 2
