"""Damaged safetensors files, HF shard indexes and packed files: a named error, never a library's own.

The readers (``trilm.store.tensors``, ``trilm.store.hf.weight_files``, ``trilm.formats.io.load_packed``)
sit under snapshots, ``trilm import hf`` and the packed engine, so each damage below must surface as an
:class:`~trilm.store.errors.IntegrityError`, a :class:`~trilm.store.errors.StoreError` or a
:class:`~trilm.formats.io.PackedFileError` naming the file.
"""

from __future__ import annotations

import json
import struct

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tests.untrusted import SETTINGS, flip, named
from trilm.config import ConfigError
from trilm.formats.io import PackedFileError, load_packed, save_packed
from trilm.formats.ternary import TernaryWeight
from trilm.store.errors import IntegrityError, StoreError
from trilm.store.hf import weight_files
from trilm.store.tensors import read_header, read_tensors, write_tensors


@pytest.fixture(scope="module")
def safetensors_bytes(tmp_path_factory) -> bytes:
    path = tmp_path_factory.mktemp("st") / "model.safetensors"
    g = torch.Generator().manual_seed(0)
    tensors = {
        "embed.weight": torch.randn(8, 4, generator=g),
        "norm.weight": torch.ones(4, dtype=torch.float16),
    }
    write_tensors(path, tensors, {"format": "pt"})
    return path.read_bytes()


@pytest.fixture(scope="module")
def packed_bytes(tmp_path_factory) -> bytes:
    path = tmp_path_factory.mktemp("packed") / "packed.safetensors"
    codes = torch.randint(-1, 2, (8, 64), generator=torch.Generator().manual_seed(1))
    save_packed(path, {"layers.0.w": TernaryWeight.pack(codes, torch.ones(1, 8))}, {"method": "test"})
    return path.read_bytes()


def _read(path):
    read_header(path)
    return read_tensors(path)


def test_an_absurd_header_length_is_named(safetensors_bytes, tmp_path):
    path = tmp_path / "model.safetensors"
    for length in (2**62, 2**64 - 1, len(safetensors_bytes)):
        path.write_bytes(struct.pack("<Q", length) + safetensors_bytes[8:])
        named(lambda: _read(path), IntegrityError, path, must_fail=True)


@SETTINGS
@given(data=st.data())
def test_a_truncated_safetensors_file_is_named(safetensors_bytes, tmp_path, data):
    cut = data.draw(st.integers(0, len(safetensors_bytes) - 1))
    path = tmp_path / "model.safetensors"
    path.write_bytes(safetensors_bytes[:cut])
    named(lambda: _read(path), IntegrityError, path, must_fail=True)


@SETTINGS
@given(data=st.data())
def test_bit_flips_in_a_safetensors_file_are_read_or_named(safetensors_bytes, tmp_path, data):
    header = 8 + struct.unpack_from("<Q", safetensors_bytes)[0]
    bit = st.one_of(st.integers(0, header * 8 - 1), st.integers(0, len(safetensors_bytes) * 8 - 1))
    damaged = safetensors_bytes
    for b in data.draw(st.lists(bit, min_size=1, max_size=3)):
        damaged = flip(damaged, b)
    path = tmp_path / "model.safetensors"
    path.write_bytes(damaged)
    named(lambda: _read(path), IntegrityError, path, must_fail=False)


@SETTINGS
@given(data=st.data())
def test_a_damaged_packed_file_is_named(packed_bytes, tmp_path, data):
    header = 8 + struct.unpack_from("<Q", packed_bytes)[0]
    if data.draw(st.booleans()):
        damaged = packed_bytes[: data.draw(st.integers(0, len(packed_bytes) - 1))]
        must_fail = True
    else:
        damaged = flip(packed_bytes, data.draw(st.integers(0, header * 8 - 1)))
        must_fail = False
    path = tmp_path / "packed.safetensors"
    path.write_bytes(damaged)
    named(lambda: load_packed(path), PackedFileError, path, must_fail=must_fail)


@pytest.mark.parametrize(
    "meta",
    [
        "[]",
        '{"layers.0.w": 5}',
        '{"layers.0.w": {}}',
        '{"layers.0.w": {"format": "ternary", "shape": [2147483648, 2147483648]}}',
        "[" * 100000,
    ],
)
def test_a_packed_header_that_is_not_layer_meta_is_named(tmp_path, meta):
    from safetensors.torch import save_file

    path = tmp_path / "packed.safetensors"
    save_file(
        {"layers.0.w.packed": torch.zeros(4, dtype=torch.uint8)}, str(path), metadata={"trilm.packed": meta}
    )
    named(lambda: load_packed(path), PackedFileError, path, must_fail=True)


@SETTINGS
@given(
    index=st.one_of(
        st.binary(max_size=64),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.text(max_size=8),
            lambda inner: (
                st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
            ),
            max_leaves=8,
        ).map(lambda v: json.dumps({"weight_map": v}).encode()),
    )
)
def test_a_damaged_shard_index_is_named(tmp_path, index):
    directory = tmp_path / "hf"
    directory.mkdir(exist_ok=True)
    (directory / "model.safetensors.index.json").write_bytes(index)
    named(lambda: weight_files(directory), ConfigError, directory, must_fail=False)


def test_a_shard_index_that_is_not_utf8_or_nests_deeply_is_named(tmp_path):
    directory = tmp_path / "hf"
    directory.mkdir()
    for raw in (b'{"weight_map": {"\xff": "a"}}', b"[" * 100000, b'{"weight_map": []}'):
        (directory / "model.safetensors.index.json").write_bytes(raw)
        named(lambda: weight_files(directory), StoreError, directory, must_fail=True)
