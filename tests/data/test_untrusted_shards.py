"""Damaged prepared splits: ``TokenShards.open`` and every read after it (tokens, documents) answer with a
:class:`~trilm.data.errors.DataError` naming the file, and ``trilm data stats`` exits with status 2.

A split of two small shards is written with :class:`~trilm.data.shards.ShardWriter` (as ``trilm data
prepare`` writes them); the properties damage its ``index.json`` (cut, bits flipped, any value at any key),
a shard's sidecar, its ``.bin`` and its ``.docs.npy``, then open the split and read all of it.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.untrusted import SETTINGS, dotted_keys, flip, hostile_values, named, truncated_or_flipped
from trilm.cli import main
from trilm.data.errors import DataError
from trilm.data.shards import INDEX_NAME, ShardWriter, TokenShards, atomic_write_json, fingerprint

VOCAB = 512


def write_split(out: Path) -> Path:
    """Two shards of three documents each (sources A and B), ids below VOCAB, and their ``index.json``."""
    rng = np.random.default_rng(0)
    out.mkdir(parents=True)
    shards = []
    for k in range(2):
        writer = ShardWriter(out, f"validation-chunk1-file{k}", np.dtype(np.uint16))
        docs = [rng.integers(0, VOCAB, n) for n in (20, 31, 17)]
        writer.add_documents(docs, ["A", "B", "A"])
        shards.append(writer.finish({"source_file": f"file{k}.jsonl.zst", "source_sha256": "0" * 64}))
    keep = ("name", "num_tokens", "num_documents", "bin_sha256", "sources", "source_file", "source_sha256")
    index = {
        "format": 1,
        "split": "validation",
        "dtype": "uint16",
        "tokenizer_hash": "1" * 64,
        "vocab_size": VOCAB,
        "eos_id": 1,
        "num_tokens": sum(s["num_tokens"] for s in shards),
        "num_documents": sum(s["num_documents"] for s in shards),
        "tokens_per_source": {"A": 74, "B": 62},
        "documents_per_source": {"A": 4, "B": 2},
        "read": {"documents": 6, "skipped": {}, "examples": {}},
        "fingerprint": fingerprint("1" * 64, "uint16", shards),
        "shards": [{k: s[k] for k in keep} for s in shards],
    }
    atomic_write_json(out / INDEX_NAME, index)
    return out


def read_all(path: Path, verify: bool = False) -> int:
    """Open the split and read every token and every document span: what training and ``data inspect`` do."""
    shards = TokenShards.open(path, verify=verify)
    tokens = shards.tokens(0, shards.num_tokens)
    docs = shards.documents_in(0, shards.num_tokens)
    return len(tokens) + len(docs)


@pytest.fixture(scope="module")
def split(tmp_path_factory) -> Path:
    return write_split(tmp_path_factory.mktemp("split") / "validation")


@pytest.fixture
def copy_of(split, tmp_path):
    def make() -> Path:
        out = tmp_path / "split"
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(split, out)
        return out

    return make


def test_the_split_reads(split):
    assert read_all(split, verify=True) == 136 + 6


@SETTINGS
@given(data=st.data())
def test_a_damaged_index_is_read_or_named(copy_of, data):
    path = copy_of()
    index = path / INDEX_NAME
    index.write_bytes(truncated_or_flipped(data, index.read_bytes()))
    named(lambda: read_all(path), DataError, path, must_fail=False)


@SETTINGS
@given(data=st.data(), value=hostile_values())
def test_any_value_at_any_index_key_is_read_or_named(copy_of, data, value):
    path = copy_of()
    index = json.loads((path / INDEX_NAME).read_text())
    keys = [*dotted_keys(index), *[("shards", i, k) for i in (0, 1) for k in index["shards"][0]]]
    key = data.draw(st.sampled_from(keys))
    node = index
    for part in key[:-1]:
        node = node[part]
    node[key[-1]] = copy.deepcopy(value)
    (path / INDEX_NAME).write_text(json.dumps(index))
    named(lambda: read_all(path), DataError, path, must_fail=False)


@SETTINGS
@given(data=st.data(), which=st.sampled_from([".json", ".bin", ".docs.npy"]), verify=st.booleans())
def test_a_damaged_shard_file_is_read_or_named(copy_of, data, which, verify):
    path = copy_of()
    shard = path / f"validation-chunk1-file1{which}"
    raw = shard.read_bytes()
    cut = data.draw(st.booleans())
    damaged = (
        raw[: data.draw(st.integers(0, len(raw) - 1))]
        if cut
        else flip(raw, data.draw(st.integers(0, len(raw) * 8 - 1)))
    )
    shard.write_bytes(damaged)
    cut_json = which == ".json" and cut and len(damaged) < len(raw.rstrip())  # cut: not whole JSON
    must_fail = (which == ".bin" and (cut or verify)) or cut_json
    named(lambda: read_all(path, verify=verify), DataError, path, must_fail=must_fail)


HOSTILE = {
    "a list": b"[1]",
    "nested too deeply": b"[" * 100_000,
    "not utf-8": b'{"format": 1, "\xff": 2}',
    "no shards": b'{"format": 1}',
    "a shard outside the split": None,
    "an integer of 5,000 digits": None,
}


@pytest.mark.parametrize("case", HOSTILE, ids=HOSTILE.keys())
def test_hostile_indexes_exit_2_naming_the_file(copy_of, capsys, case):
    path = copy_of()
    raw = HOSTILE[case]
    if raw is None:
        index = json.loads((path / INDEX_NAME).read_text())
        if case == "a shard outside the split":
            index["shards"][0]["name"] = "../validation/validation-chunk1-file0"
            raw = json.dumps(index).encode()
        else:
            raw = json.dumps(index).replace('"num_tokens": 136', '"num_tokens": ' + "9" * 5000).encode()
    (path / INDEX_NAME).write_bytes(raw)
    named(lambda: read_all(path), DataError, path, must_fail=True)
    assert main(["data", "stats", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trilm data: error: ") and str(path) in err, err
