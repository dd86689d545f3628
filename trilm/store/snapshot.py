"""Snapshot directories: reading their ``config.json``, and the one writer of their files.

The layout is :mod:`trilm.store.layout`'s. :func:`write_snapshot` writes a whole snapshot atomically with
its ``COMPLETE`` manifest (imports, QuantLMs, packed exports, pruned models, suite copies);
:func:`write_snapshot_files` fills a directory that some caller publishes itself (training, where every
rank writes into one staging directory, and writers that check the result before publishing it).
"""

from __future__ import annotations

import json
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from trilm.atomic import atomic_directory, copy_file, write_text
from trilm.config import ConfigError, shown
from trilm.formats import save_packed
from trilm.model.config import ModelConfig
from trilm.model.snapshot import SnapshotMeta
from trilm.model.spec import canonical_shapes
from trilm.store.errors import StoreError
from trilm.store.integrity import complete_marker
from trilm.store.jsonfile import read_json
from trilm.store.layout import (
    CONFIG_FILE,
    PACKED_FILE,
    SNAPSHOT_FORMAT,
    SNAPSHOT_VERSION,
    WEIGHTS_FILE,
)
from trilm.store.tensors import write_tensors
from trilm.store.tokenizer import tokenizer_files


def snapshot_config_text(cfg: ModelConfig, meta: SnapshotMeta | None = None) -> str:
    payload = {
        "format": SNAPSHOT_FORMAT,
        "version": SNAPSHOT_VERSION,
        "model": cfg.to_dict(),
        "meta": (meta or SnapshotMeta()).to_dict(),
    }
    return json.dumps(payload, indent=2)


def write_snapshot_config(directory: str | Path, cfg: ModelConfig, meta: SnapshotMeta | None = None) -> Path:
    """(Re)write ``config.json`` of a directory being written (atomically, as every file here)."""
    return write_text(Path(directory) / CONFIG_FILE, snapshot_config_text(cfg, meta))


def read_snapshot_config(directory: str | Path) -> tuple[ModelConfig, SnapshotMeta]:
    """(model config, metadata) of a snapshot directory; errors name the file and the bad key."""
    path = Path(directory) / CONFIG_FILE
    payload = read_json(path, f" (is {directory} a trilm snapshot?)")
    if not isinstance(payload, dict) or payload.get("format") != SNAPSHOT_FORMAT:
        found = payload.get("format") if isinstance(payload, dict) else None
        raise StoreError(f"{path}: format {found!r} is not {SNAPSHOT_FORMAT!r}")
    if "model" not in payload:
        raise StoreError(f"{path}: missing key 'model'")
    try:
        cfg = ModelConfig.from_dict(payload["model"], prefix="model.")
    except ConfigError as exc:
        raise StoreError(f"{path}: {exc}") from None
    meta = payload.get("meta") or {}
    if not isinstance(meta, dict):
        raise StoreError(f"{path}: 'meta' must be a mapping, got {type(meta).__name__}")
    problem = _meta_problem(meta)
    if problem:
        raise StoreError(f"{path}: meta.{problem}")
    return cfg, SnapshotMeta.from_dict(meta)


_META_KINDS = {
    float: (int, float),
    int: (int,),
    str: (str,),
    dict: (dict,),
}


def _meta_problem(meta: dict[str, Any]) -> str | None:
    """The first field of a snapshot's ``meta`` whose value is not of its type (None when all are): every
    reader of a snapshot uses these fields as typed (steps and counts in arithmetic, names as text)."""
    for name, tp in typing.get_type_hints(SnapshotMeta).items():
        value = meta.get(name)
        if value is None:
            continue
        if typing.get_origin(tp) is dict:
            kind: type = dict
        else:
            kind = next(k for k in (float, int, str) if k in (tp, *typing.get_args(tp)))
        if isinstance(value, bool) or not isinstance(value, _META_KINDS[kind]):
            return f"{name}: expected {'a mapping' if kind is dict else kind.__name__}, got {shown(value)}"
    return None


def is_snapshot(directory: str | Path) -> bool:
    path = Path(directory) / CONFIG_FILE
    if not path.is_file():
        return False
    try:
        return json.loads(path.read_text()).get("format") == SNAPSHOT_FORMAT
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError, OSError):
        return False


def check_coverage(
    where: str | Path,
    cfg: ModelConfig,
    float_state: Mapping[str, torch.Tensor],
    packed_layers: Mapping[str, Any],
) -> None:
    """Float tensors and packed layers cover the model's canonical tensors exactly once, in their shapes."""
    shapes = canonical_shapes(cfg)
    packed_names = {f"{name}.weight" for name in packed_layers}
    both = set(float_state) & packed_names
    if both:
        raise ConfigError(f"{where}: tensors given both packed and float: {sorted(both)[:3]}")
    given = set(float_state) | packed_names
    if given != set(shapes):
        missing, unexpected = sorted(set(shapes) - given), sorted(given - set(shapes))
        raise ConfigError(
            f"{where}: tensors do not match the model config: missing {missing[:3]}, "
            f"unexpected {unexpected[:3]}"
        )
    found = {k: tuple(v.shape) for k, v in float_state.items()}
    found.update({f"{k}.weight": tuple(v.shape) for k, v in packed_layers.items()})
    wrong = [f"{k} {found[k]} (expected {shapes[k]})" for k in shapes if found[k] != shapes[k]]
    if wrong:
        raise ConfigError(f"{where}: tensor shapes do not match the model config: {wrong[:3]}")


def write_snapshot_files(
    directory: str | Path,
    cfg: ModelConfig,
    meta: SnapshotMeta | None,
    state: Mapping[str, torch.Tensor],
    packed: Mapping[str, Any] | None = None,
    tokenizer: Any = None,
) -> Path:
    """Weights (+ packed layers, tokenizer) and ``config.json`` into an existing (staging) directory.

    ``tokenizer`` is a loaded :class:`~trilm.data.tokenizer.Tokenizer` or its path; its files are copied
    under their own names (``tokenizer.model``; ``tokenizer.json`` and its companions)."""

    directory = Path(directory)
    packed = dict(packed or {})
    check_coverage(directory, cfg, state, packed)
    write_tensors(directory / WEIGHTS_FILE, state, metadata={"format": SNAPSHOT_FORMAT})
    if packed:
        save_packed(directory / PACKED_FILE, packed)  # one header key: safetensors orders several at random
    if tokenizer is not None:
        for name, source in tokenizer_files(tokenizer).items():
            copy_file(source, directory / name)
    write_snapshot_config(directory, cfg, meta)
    return directory


def write_snapshot(
    out: str | Path,
    cfg: ModelConfig,
    meta: SnapshotMeta | None,
    state: Mapping[str, torch.Tensor],
    packed: Mapping[str, Any] | None = None,
    tokenizer: Any = None,
    *,
    replace: bool = False,
    marker: dict[str, Any] | None = None,
) -> Path:
    """A whole snapshot at ``out``: written under a temporary name, renamed, ``COMPLETE`` last.

    ``out`` must be new or empty unless ``replace`` (the caller has checked that what is there may go).
    """
    out = Path(out)
    if not replace and out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise StoreError(f"{out}: exists and is not empty; write the snapshot into a new or empty directory")
    payload = {"step": meta.step if meta is not None else None, **(marker or {})}
    with atomic_directory(out, replace=replace, markers=complete_marker(payload)) as tmp:
        write_snapshot_files(tmp, cfg, meta, state, packed, tokenizer)
    return out
