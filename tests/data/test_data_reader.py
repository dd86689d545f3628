"""SlimPajama reader: layout of the embedded corpus, every kind of bad input, mixtures, the datasets path."""

from __future__ import annotations

import json
import re

import pytest
import zstandard

from trilm.data.errors import DataError
from trilm.data.slimpajama import (
    SLIMPAJAMA_SOURCES,
    ReadStats,
    SourceMixture,
    read_documents,
    read_documents_datasets,
    split_files,
)


def doc(text: str, source: str = "RedPajamaC4") -> dict:
    return {"text": text, "meta": {"redpajama_set_name": source}}


def test_embedded_corpus_is_laid_out_like_slimpajama(corpus):
    manifest = [json.loads(line) for line in (corpus / "MANIFEST.jsonl").read_text().splitlines()]
    for split, stem in (
        ("train", "example_train_"),
        ("validation", "example_holdout_"),
        ("test", "example_holdout_"),
    ):
        files = split_files(corpus, split)
        assert len(files) >= 2
        assert all(f.key.startswith(f"{split}/chunk") and f"/{stem}" in f.key for f in files)
        docs = [d for f in files for d in read_documents(f)]
        expected = [m for m in manifest if m["file"].startswith(split + "/")]
        assert len(docs) == len(expected)
        assert {(d.file, d.line, d.source) for d in docs} == {
            (m["file"], m["line"], m["source"]) for m in expected
        }
        assert {d.source for d in docs} <= set(SLIMPAJAMA_SOURCES)
    assert (corpus / "LICENSE").is_file() and "public domain" in (corpus / "README.md").read_text()
    total = sum(p.stat().st_size for p in corpus.rglob("*.jsonl.zst"))
    assert 1e6 < total < 6e6


def test_files_are_listed_in_chunk_then_numeric_order(tmp_path, jsonl_zst):
    for chunk, n in [(2, 0), (1, 10), (1, 2), (10, 1)]:
        jsonl_zst(tmp_path / f"train/chunk{chunk}/example_train_{n}.jsonl.zst", [doc("x")])
    keys = [f.key for f in split_files(tmp_path, "train")]
    assert keys == [
        "train/chunk1/example_train_2.jsonl.zst",
        "train/chunk1/example_train_10.jsonl.zst",
        "train/chunk2/example_train_0.jsonl.zst",
        "train/chunk10/example_train_1.jsonl.zst",
    ]
    with pytest.raises(DataError, match="no such split directory"):
        split_files(tmp_path, "validation")


GOOD = doc("a good document")
BAD_LINES = {
    "malformed JSON": b'{"text": "unterminated',
    "missing 'text'": json.dumps({"meta": {"redpajama_set_name": "RedPajamaC4"}}).encode(),
    "missing 'meta.redpajama_set_name'": json.dumps({"text": "no source"}).encode(),
    "empty document": json.dumps(doc("   \n ")).encode(),
    "non-UTF-8 bytes": b'{"text": "caf\xe9", "meta": {"redpajama_set_name": "RedPajamaC4"}}',
    "non-UTF-8 text": b'{"text": "lone \\ud800 surrogate", "meta": {"redpajama_set_name": "RedPajamaC4"}}',
}


@pytest.mark.parametrize("reason", list(BAD_LINES))
def test_bad_line_names_file_and_line_or_is_counted(tmp_path, jsonl_zst, reason):
    path = jsonl_zst(tmp_path / "f.jsonl.zst", [GOOD, GOOD, BAD_LINES[reason], GOOD])
    with pytest.raises(DataError) as err:
        list(read_documents(path))
    assert f"{path}:3: {reason}" in str(err.value)
    stats = ReadStats()
    kept = list(read_documents(path, skip_bad=True, stats=stats))
    assert [d.line for d in kept] == [1, 2, 4]
    assert stats.documents == 3 and sum(stats.skipped.values()) == 1
    assert stats.examples[next(iter(stats.skipped))] == [f"{path}:3"]


def _big_file(tmp_path, jsonl_zst, n=4000):
    return jsonl_zst(tmp_path / "big.jsonl.zst", [doc(f"document number {i} " * 40) for i in range(n)])


def test_truncated_zst_is_an_error_not_a_short_file(tmp_path, jsonl_zst):
    path = _big_file(tmp_path, jsonl_zst)
    blob = path.read_bytes()
    path.write_bytes(blob[: len(blob) // 2])
    with pytest.raises(DataError, match=rf"{re.escape(str(path))}: after line \d+: truncated zstd stream"):
        list(read_documents(path))
    stats = ReadStats()
    kept = list(read_documents(path, skip_bad=True, stats=stats))
    assert 0 < len(kept) < 4000 and stats.skipped == {"truncated zstd stream": 1}


def test_corrupt_zst_is_an_error(tmp_path, jsonl_zst):
    path = _big_file(tmp_path, jsonl_zst)
    blob = bytearray(path.read_bytes())
    blob[len(blob) // 3 : len(blob) // 3 + 64] = b"\x00" * 64
    path.write_bytes(bytes(blob))
    with pytest.raises(DataError, match=rf"{re.escape(str(path))}: after line \d+: corrupt zstd data"):
        list(read_documents(path))
    (tmp_path / "junk.jsonl.zst").write_bytes(b"this is not zstd")
    with pytest.raises(DataError, match=r"junk\.jsonl\.zst: after line 0: corrupt zstd data"):
        list(read_documents(tmp_path / "junk.jsonl.zst"))


def test_frames_lines_and_reads_may_split_anywhere(tmp_path, monkeypatch):
    """Several zstd frames, a line longer than a read, no final newline: same documents at any read size."""
    import trilm.data.slimpajama as reader

    c = zstandard.ZstdCompressor()
    texts = [f"doc {i} " + "long " * (300 if i == 3 else i) for i in range(12)]
    lines = [json.dumps(doc(t)).encode() for t in texts]
    frames = [c.compress(b"\n".join(lines[i : i + 3]) + (b"\n" if i < 9 else b"")) for i in range(0, 12, 3)]
    path = tmp_path / "f.jsonl.zst"
    path.write_bytes(b"".join(frames))
    for size in (1, 7, 64, len(frames[0]), 1 << 20):
        monkeypatch.setattr(reader, "_READ_BYTES", size)
        got = list(read_documents(path))
        assert [d.text for d in got] == texts and [d.line for d in got] == list(range(1, 13))
    path.write_bytes(b"")
    with pytest.raises(DataError, match="truncated zstd stream"):
        list(read_documents(path))


def test_mixture_weights_are_deterministic_and_exact():
    mix = SourceMixture.from_options(
        exclude=["RedPajamaGithub"], weights={"RedPajamaBook": 2.0, "RedPajamaC4": 0.5}
    )
    assert mix.copies("RedPajamaGithub", "f", 1) == 0
    assert all(mix.copies("RedPajamaBook", "f", i) == 2 for i in range(50))
    assert mix.copies("RedPajamaCommonCrawl", "f", 1) == 1
    kept = [mix.copies("RedPajamaC4", "train/chunk1/x.jsonl.zst", i) for i in range(4000)]
    assert set(kept) == {0, 1} and 0.45 < sum(kept) / 4000 < 0.55
    assert kept == [mix.copies("RedPajamaC4", "train/chunk1/x.jsonl.zst", i) for i in range(4000)]
    only = SourceMixture.from_options(include=["RedPajamaBook"])
    assert only.copies("RedPajamaBook", "f", 1) == 1 and only.copies("RedPajamaC4", "f", 1) == 0
    with pytest.raises(DataError, match="must be >= 0"):
        SourceMixture({"RedPajamaC4": -1.0})


def test_datasets_streaming_path_reads_the_same_documents_offline(corpus, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    f = split_files(corpus, "validation")[0]
    direct = [(d.text, d.source, d.line) for d in read_documents(f)]
    via_datasets = [(d.text, d.source, d.line) for d in read_documents_datasets(f)]
    assert via_datasets == direct and len(direct) > 5


def test_datasets_path_reports_bad_rows(tmp_path, jsonl_zst, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    path = jsonl_zst(tmp_path / "f.jsonl.zst", [GOOD, doc(""), GOOD])
    with pytest.raises(DataError, match=rf"{re.escape(str(path))}:2: empty document"):
        list(read_documents_datasets(str(path)))
    stats = ReadStats()
    assert len(list(read_documents_datasets(str(path), skip_bad=True, stats=stats))) == 2
    assert stats.skipped == {"empty document": 1}


def test_hub_listing_maps_repo_paths_to_split_keys(monkeypatch):
    """The hub path without the network: a stand-in for HfFileSystem returns paths as the hub spells them."""
    import huggingface_hub

    from trilm.data.slimpajama import hub_split_files

    seen = []

    class FakeFS:
        def glob(self, pattern):
            seen.append(pattern)
            if "/test/" in pattern:
                return []
            base = "datasets/cerebras/SlimPajama-627B/validation"
            names = ["chunk2/example_holdout_0", "chunk1/example_holdout_11", "chunk1/example_holdout_3"]
            return [f"{base}/{name}.jsonl.zst" for name in names]

    monkeypatch.setattr(huggingface_hub, "HfFileSystem", FakeFS)
    files = hub_split_files("validation")
    assert seen == ["datasets/cerebras/SlimPajama-627B/validation/chunk*/*.jsonl.zst"]
    assert [f.key for f in files] == [
        "validation/chunk1/example_holdout_3.jsonl.zst",
        "validation/chunk1/example_holdout_11.jsonl.zst",
        "validation/chunk2/example_holdout_0.jsonl.zst",
    ]
    assert (
        files[0].path
        == "hf://datasets/cerebras/SlimPajama-627B/validation/chunk1/example_holdout_3.jsonl.zst"
    )
    assert files[0].shard_name == "validation-chunk1-example_holdout_3"
    with pytest.raises(DataError, match="no chunk"):
        hub_split_files("test")
