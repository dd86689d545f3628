"""Tokenize once: round trip through shards, exact accounting, resumption, bad input, mixtures."""

from __future__ import annotations

import json

import numpy as np
import pytest

from trilm.config import ConfigError
from trilm.data.errors import DataError
from trilm.data.prepare import PrepareConfig, prepare
from trilm.data.shards import ShardWriter, TokenShards, read_finished_shard, token_dtype
from trilm.data.slimpajama import read_documents, split_files
from trilm.data.tokenizer import Tokenizer


def doc(text: str, source: str = "RedPajamaC4") -> dict:
    return {"text": text, "meta": {"redpajama_set_name": source}}


def _cfg(corpus, split, tok, out, **kw) -> PrepareConfig:
    return PrepareConfig(
        input=str(corpus), split=split, tokenizer=str(tok), out=str(out), progress=False, **kw
    )


def test_round_trip_text_to_shards_to_text(embedded, corpus):
    """Every validation document comes back, in file order, from the shards' document table."""
    tok = Tokenizer.load(embedded["tokenizer"])
    shards = TokenShards.open(embedded["validation"], verify=True)
    assert shards.dtype == np.uint16 and shards.tokenizer_hash == tok.hash
    originals = [d for f in split_files(corpus, "validation") for d in read_documents(f)]
    spans = shards.documents_in(0, shards.num_tokens)
    assert len(spans) == len(originals) == shards.num_documents
    for original, span in zip(originals, spans, strict=True):
        ids = shards.tokens(span["start"], span["end"])
        assert ids[-1] == tok.eos_id and tok.eos_id not in ids[:-1]
        assert tok.decode(ids[:-1]) == original.text
        assert span["source"] == original.source


def test_token_accounting_is_exact(embedded):
    for split in ("train", "validation"):
        index = json.loads((embedded[split] / "index.json").read_text())
        on_disk = sum((embedded[split] / f"{s['name']}.bin").stat().st_size // 2 for s in index["shards"])
        assert index["num_tokens"] == on_disk == sum(index["tokens_per_source"].values())
        assert index["num_documents"] == sum(index["documents_per_source"].values())
        for s in index["shards"]:
            side = json.loads((embedded[split] / f"{s['name']}.json").read_text())
            table = np.load(embedded[split] / f"{s['name']}.docs.npy")
            assert side["num_tokens"] == int(table[-1, 0]) == sum(side["tokens_per_source"].values())
            assert len(side["source_sha256"]) == 64 and side["source_file"].startswith(f"{split}/chunk")
            per_source = np.bincount(table[:, 1], weights=np.diff(table[:, 0], prepend=0))
            assert {side["sources"][i]: int(n) for i, n in enumerate(per_source)} == side["tokens_per_source"]
    assert len(index["tokens_per_source"]) == 5


def test_workers_do_not_change_the_result_and_resume_skips_finished_shards(embedded, corpus, tmp_path):
    tok = embedded["tokenizer"]
    ref = TokenShards.open(embedded["validation"])
    out = tmp_path / "valid"
    one = prepare(_cfg(corpus, "validation", tok, out, workers=1))
    assert one["fingerprint"] == ref.fingerprint and one["resumed_shards"] == 0
    again = prepare(_cfg(corpus, "validation", tok, out, workers=2))
    assert again["fingerprint"] == ref.fingerprint and again["resumed_shards"] == len(again["shards"])
    # a shard whose data is cut short, or whose sidecar is gone, is redone; a stray temp file is ignored
    names = [s["name"] for s in again["shards"]]
    bin0 = out / f"{names[0]}.bin"
    bin0.write_bytes(bin0.read_bytes()[:-2])
    assert read_finished_shard(out, names[0]) is None
    (out / f"{names[1]}.json").unlink()
    (out / f"{names[1]}.bin.tmp-999").write_bytes(b"\x00" * 10)
    third = prepare(_cfg(corpus, "validation", tok, out, workers=1))
    assert third["fingerprint"] == ref.fingerprint and third["resumed_shards"] == len(names) - 2


def test_rerun_on_finished_data_never_takes_the_index_away(embedded, corpus, tmp_path, monkeypatch):
    """Concurrent suite launches prepare the same finished split while others train from it: a rerun
    must neither remove index.json while it checks the shards nor rewrite it; a changed shard removes it
    before the shard is redone (no reader trusts an index over changing data) and it is rewritten after."""
    import trilm.data.prepare as prepare_mod

    out = tmp_path / "valid"
    prepare(_cfg(corpus, "validation", embedded["tokenizer"], out, workers=1))
    index = out / "index.json"
    written = index.stat().st_mtime_ns, index.read_bytes()
    seen: list[tuple[bool, bool]] = []
    real = prepare_mod.prepare_file

    def checked(task):  # workers=1 runs every file in this process: a reader's view around each one
        before = index.is_file()
        result = real(task)
        seen.append((before, index.is_file()))
        return result

    monkeypatch.setattr(prepare_mod, "prepare_file", checked)
    again = prepare(_cfg(corpus, "validation", embedded["tokenizer"], out, workers=1))
    assert seen == [(True, True)] * len(again["shards"]) and again["resumed_shards"] == len(again["shards"])
    assert (index.stat().st_mtime_ns, index.read_bytes()) == written
    assert TokenShards.open(out).fingerprint == again["fingerprint"]

    name = again["shards"][-1]["name"]
    (out / f"{name}.json").unlink()  # the last shard must be redone
    seen.clear()
    redone = prepare(_cfg(corpus, "validation", embedded["tokenizer"], out, workers=1))
    assert seen == [(True, True)] * (len(seen) - 1) + [(True, False)]
    assert redone["resumed_shards"] == len(redone["shards"]) - 1
    assert json.loads(index.read_text())["resumed_shards"] == len(redone["shards"]) - 1  # rewritten
    assert redone["fingerprint"] == again["fingerprint"]


def test_rerun_with_another_tokenizer_redoes_every_shard(embedded, corpus, tmp_path):
    from trilm.data.tokenizer import train_tokenizer

    texts = [d.text for f in split_files(corpus, "validation") for d in read_documents(f)]
    other = train_tokenizer(texts, tmp_path / "other.model", vocab_size=2048, max_sentences=20_000)
    assert other.hash != Tokenizer.load(embedded["tokenizer"]).hash and other.vocab_size == 2048
    out = tmp_path / "valid"
    first = prepare(_cfg(corpus, "validation", embedded["tokenizer"], out))
    second = prepare(_cfg(corpus, "validation", other.path, out))
    assert second["resumed_shards"] == 0 and second["tokenizer_hash"] == other.hash
    assert all(json.loads((out / f"{s['name']}.json").read_text())["tokenizer_hash"] == other.hash
               for s in second["shards"])  # fmt: skip
    assert second["fingerprint"] != first["fingerprint"]


def test_failed_prepare_keeps_finished_shards_and_resumes(tmp_path, jsonl_zst, embedded):
    root = tmp_path / "corpus"
    for i in range(3):
        jsonl_zst(
            root / f"train/chunk1/example_train_{i}.jsonl.zst", [doc(f"file {i} doc {j}") for j in range(5)]
        )
    bad = jsonl_zst(root / "train/chunk1/example_train_3.jsonl.zst", [doc("ok"), b"{broken json"])
    out = tmp_path / "out"
    with pytest.raises(DataError) as err:
        prepare(_cfg(root, "train", embedded["tokenizer"], out, workers=2))
    assert f"{bad}:2: malformed JSON" in str(err.value) and "3 finished shard(s) kept" in str(err.value)
    with pytest.raises(DataError, match="prepare did not finish"):
        TokenShards.open(out)
    skipped = prepare(_cfg(root, "train", embedded["tokenizer"], out, skip_bad=True))
    assert skipped["read"]["skipped"] == {"malformed JSON": 1}
    assert skipped["read"]["examples"]["malformed JSON"] == [f"{bad}:2"]
    assert skipped["num_documents"] == 16
    # skip_bad is part of the shard settings: the good files were redone under the new settings
    assert skipped["resumed_shards"] == 0
    jsonl_zst(bad, [doc("ok"), doc("fixed")])
    fixed = prepare(_cfg(root, "train", embedded["tokenizer"], out))
    assert fixed["num_documents"] == 17 and fixed["read"]["skipped"] == {}
    assert fixed["fingerprint"] != skipped["fingerprint"]


def test_mixture_filters_and_reweights_sources(embedded, corpus, tmp_path):
    full = TokenShards.open(embedded["validation"]).index
    cfg = _cfg(
        corpus, "validation", embedded["tokenizer"], tmp_path / "mix",
        exclude_sources=["RedPajamaGithub"], source_weights={"RedPajamaBook": 2.0},
    )  # fmt: skip
    mixed = prepare(cfg)
    assert "RedPajamaGithub" not in mixed["tokens_per_source"]
    assert mixed["tokens_per_source"]["RedPajamaBook"] == 2 * full["tokens_per_source"]["RedPajamaBook"]
    assert mixed["tokens_per_source"]["RedPajamaC4"] == full["tokens_per_source"]["RedPajamaC4"]
    assert mixed["fingerprint"] != full["fingerprint"]
    with pytest.raises(ConfigError, match=r"source_weights\.RedPajamaC4"):
        _cfg(corpus, "validation", embedded["tokenizer"], tmp_path, source_weights={"RedPajamaC4": -1.0})


def test_dtype_choice_and_uint32_shards(tmp_path):
    assert token_dtype(4096) == np.uint16 and token_dtype(65536) == np.uint16
    assert token_dtype(65537) == np.uint32
    writer = ShardWriter(tmp_path, "big", token_dtype(100_000))
    docs = [np.array([70_000, 99_999, 2], np.int64), np.array([5, 2], np.int64)]
    writer.add_documents(docs, ["RedPajamaC4", "RedPajamaBook"])
    meta = writer.finish({"source_file": "x", "source_sha256": ""})
    index = {
        "format": 1, "shards": [meta], "dtype": "uint32", "fingerprint": "f", "tokenizer_hash": "t",
        "num_tokens": 5, "num_documents": 2,
    }  # fmt: skip
    (tmp_path / "index.json").write_text(json.dumps(index))
    shards = TokenShards.open(tmp_path, verify=True)
    assert shards.tokens(0, 5).tolist() == [70_000, 99_999, 2, 5, 2]
    assert [d["source"] for d in shards.documents_in(0, 5)] == ["RedPajamaC4", "RedPajamaBook"]
    assert not list(tmp_path.glob("*.tmp-*"))
