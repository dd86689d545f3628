"""Damaged snapshot metadata: a snapshot's ``config.json`` (model config and ``meta``), its ``COMPLETE``
manifest, and its run's tokenizer and ``resolved_config.yaml``. ``open_model`` and the first read of the
weights answer with a :class:`~trilm.config.ConfigError` (a :class:`~trilm.store.errors.StoreError` or
:class:`~trilm.store.errors.IntegrityError`) naming the snapshot's file, and ``trilm export hf`` exits with
status 2 writing nothing.

A tiny FloatLM run snapshot (``RUN/snapshots/step-10``) is written with ``write_snapshot``; the properties
cut it or flip bits in its JSON files, and put any JSON value at any key of them.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.untrusted import (
    SETTINGS,
    YAML_BOMB,
    YAML_DEEP,
    dotted_keys,
    hostile_values,
    named,
    truncated_or_flipped,
)
from trilm.cli import main
from trilm.config import ConfigError
from trilm.data.tokenizer import TOKENIZER_MODEL, train_tokenizer
from trilm.model.config import preset
from trilm.model.snapshot import model_meta
from trilm.model.spec import canonical_shapes
from trilm.store.layout import COMPLETE, CONFIG_FILE, RUN_CONFIG
from trilm.store.open import open_model
from trilm.store.snapshot import write_snapshot

CFG = preset("floatlm-nano", vocab_size=320, layers=1)
TEXTS = ["the cat sat on the mat", "a dog ran in the fog", "lorem ipsum dolor sit amet"] * 20


def write_run(root: Path) -> Path:
    """A run directory with one snapshot, the run's tokenizer (whose hash the snapshot records) and the
    run's resolved config."""
    tok = train_tokenizer(TEXTS, root / TOKENIZER_MODEL, vocab_size=300, max_sentences=200)
    gen = torch.Generator().manual_seed(0)
    state = {name: torch.randn(shape, generator=gen) for name, shape in canonical_shapes(CFG).items()}
    meta = model_meta(CFG, step=10, tokens=10_240, run=root.name, tokenizer_hash=tok.hash, val_loss=4.1)
    snap = write_snapshot(root / "snapshots" / "step-10", CFG, meta, state, marker={"kind": "snapshot"})
    (root / RUN_CONFIG).write_text("run_dir: run\ndata: {train_dir: nowhere}\n")
    return snap


def open_and_read(snap: Path) -> int:
    """What every command does with a model directory: open it, then read (and verify) its weights."""
    opened = open_model(snap)
    _ = opened.label, opened.fingerprint(), opened.tokenizer.require(snap).encode("the cat")
    return len(opened.weights.float_state())


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return write_run(tmp_path_factory.mktemp("snap") / "run").parents[1]


@pytest.fixture
def copy_of(run, tmp_path):
    def make() -> Path:
        out = tmp_path / "run"
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(run, out)
        return out / "snapshots" / "step-10"

    return make


def test_the_snapshot_opens(copy_of):
    assert open_and_read(copy_of()) == len(canonical_shapes(CFG))


@SETTINGS
@given(data=st.data(), name=st.sampled_from([CONFIG_FILE, COMPLETE]))
def test_damaged_bytes_are_read_or_named(copy_of, data, name):
    snap = copy_of()
    path = snap / name
    path.write_bytes(truncated_or_flipped(data, path.read_bytes()))
    named(lambda: open_and_read(snap), ConfigError, snap, must_fail=False)


@SETTINGS
@given(data=st.data())
def test_a_damaged_tokenizer_is_named(copy_of, data):
    """The snapshot records its tokenizer's hash: any change to the run's tokenizer file is refused."""
    snap = copy_of()
    path = snap.parents[1] / TOKENIZER_MODEL
    raw = path.read_bytes()
    damaged = truncated_or_flipped(data, raw)
    path.write_bytes(damaged)
    named(lambda: open_and_read(snap), ConfigError, path, must_fail=damaged != raw)


@SETTINGS
@given(data=st.data(), name=st.sampled_from([CONFIG_FILE, COMPLETE]), value=hostile_values())
def test_any_value_at_any_key_is_read_or_named(copy_of, data, name, value):
    snap = copy_of()
    path = snap / name
    content = json.loads(path.read_text())
    key = data.draw(st.sampled_from([*dotted_keys(content), ("meta", "extra"), ("files", "x/../../y")]))
    node = content
    for part in key[:-1]:
        node = node.setdefault(part, {}) if isinstance(node, dict) else {}
    if isinstance(node, dict):
        node[key[-1]] = copy.deepcopy(value)
    path.write_text(json.dumps(content))
    named(lambda: open_and_read(snap), ConfigError, snap, must_fail=False)


@settings(SETTINGS, max_examples=25)
@given(data=st.data())
def test_a_damaged_run_config_is_ignored_or_named(copy_of, data):
    """The run's ``resolved_config.yaml`` says only whether training added BOS; damaged, it says nothing."""
    snap = copy_of()
    path = snap.parents[1] / RUN_CONFIG
    raw = data.draw(
        st.sampled_from(
            [b"\xff\xfe", YAML_DEEP.encode(), f"data: {YAML_BOMB}".encode(), b"data: [1]", b"- 1"]
        )
        | st.binary(max_size=64)
    )
    path.write_bytes(raw)
    named(lambda: open_and_read(snap), ConfigError, snap, must_fail=False)


HOSTILE = {
    "config.json a list": (CONFIG_FILE, b"[1]"),
    "config.json nested too deeply": (CONFIG_FILE, b"[" * 100_000),
    "config.json not utf-8": (CONFIG_FILE, b'{"format": "\xff"}'),
    "meta extra a string": (CONFIG_FILE, None),
    "meta size a number": (CONFIG_FILE, None),
    "COMPLETE nested too deeply": (COMPLETE, b"[" * 100_000),
    "COMPLETE sizes as text": (COMPLETE, None),
    "COMPLETE a file named with a NUL": (COMPLETE, None),
    "the run's tokenizer cut in half": (f"../../{TOKENIZER_MODEL}", None),
}


def _edit(snap: Path, case: str) -> None:
    name, raw = HOSTILE[case]
    path = snap / name
    if raw is not None:
        path.write_bytes(raw)
        return
    if name.endswith(TOKENIZER_MODEL):
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        return
    content = json.loads(path.read_text())
    if case == "meta extra a string":
        content["meta"]["extra"] = "ab"
    elif case == "meta size a number":
        content["meta"]["size"] = 5
    elif case == "COMPLETE sizes as text":
        content["files"][CONFIG_FILE]["bytes"] = "many"
    else:
        content["files"]["a\x00b"] = {"bytes": 1, "crc32": 0}
    path.write_text(json.dumps(content))


@pytest.mark.parametrize("case", HOSTILE, ids=HOSTILE.keys())
def test_hostile_snapshot_files_exit_2_writing_nothing(copy_of, tmp_path, capsys, case):
    snap = copy_of()
    _edit(snap, case)
    where = snap.parents[1] if "tokenizer" in case else snap
    named(lambda: open_and_read(snap), ConfigError, where, must_fail=True)
    out = tmp_path / "out"
    assert main(["export", "hf", str(snap), str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trilm export: error: ") and str(where) in err, err
    assert not out.exists()
