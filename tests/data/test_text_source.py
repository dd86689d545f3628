"""Token streams for calibration and evaluation: every source kind, the EOS convention, and bad input."""

import json

import pytest
import torch

from trilm.data import Tokenizer
from trilm.data.errors import DataError
from trilm.data.shards import TokenShards
from trilm.data.text_source import sample_windows, token_stream


@pytest.fixture(scope="module")
def tok(embedded):
    return Tokenizer.load(embedded["tokenizer"])


def test_prepared_split_is_read_as_stored(embedded, tok):
    shards = TokenShards.open(embedded["validation"])
    stream = token_stream(embedded["validation"], tok)
    assert stream.numel() == shards.num_tokens
    assert torch.equal(stream[:100], torch.from_numpy(shards.tokens(0, 100)))
    assert token_stream(embedded["validation"], max_tokens=50).numel() == 50


def test_text_files_follow_the_document_convention(tmp_path, tok, jsonl_zst):
    docs = ["In the beginning God created the heaven and the earth.", "import os\nprint(os.getcwd())"]
    expected = [i for d in docs for i in [*tok.encode(d), tok.eos_id]]
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps({"text": d}) for d in docs) + "\n")
    assert token_stream(tmp_path / "a.jsonl", tok).tolist() == expected
    meta = {"redpajama_set_name": "RedPajamaBook"}
    jsonl_zst(
        tmp_path / "sp/validation/chunk1/example_val_0.jsonl.zst", [{"text": d, "meta": meta} for d in docs]
    )
    assert token_stream(tmp_path / "sp", tok).tolist() == expected
    assert token_stream(tmp_path / "sp/validation", tok).tolist() == expected
    (tmp_path / "b.txt").write_text(docs[0])
    assert token_stream(tmp_path / "b.txt", tok).tolist() == expected[: len(tok.encode(docs[0])) + 1]


def test_bad_sources_are_named(tmp_path, tok):
    with pytest.raises(DataError, match="no such file"):
        token_stream(tmp_path / "missing.txt", tok)
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"txt": 1}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:2: expected an object with a string field 'text'"):
        token_stream(tmp_path / "bad.jsonl", tok)
    (tmp_path / "x.csv").write_text("a,b")
    with pytest.raises(DataError, match="unknown text source"):
        token_stream(tmp_path / "x.csv", tok)
    (tmp_path / "latin1.txt").write_bytes(b"caf\xe9")
    with pytest.raises(DataError, match="not UTF-8"):
        token_stream(tmp_path / "latin1.txt", tok)
    with pytest.raises(DataError, match="needs the model's tokenizer"):
        token_stream(tmp_path / "latin1.txt")


def test_windows_are_seeded_disjoint_and_checked():
    tokens = torch.arange(1000)
    a = sample_windows(tokens, 5, 64, seed=3)
    assert a.shape == (5, 64) and torch.equal(a, sample_windows(tokens, 5, 64, seed=3))
    assert not torch.equal(a, sample_windows(tokens, 5, 64, seed=4))
    starts = sorted(int(w[0]) for w in a)
    assert all(s % 64 == 0 for s in starts) and len(set(starts)) == 5
    with pytest.raises(DataError, match=r"calib.txt: 1,000 tokens hold only 15 windows of 64 tokens, but 16"):
        sample_windows(tokens, 16, 64, source="calib.txt")
