"""What every export shares: opening a finished snapshot with its tokenizer, and writing an output atomically.

A snapshot of a training run (``RUN/snapshots/step-N``) is exported only when its ``COMPLETE`` marker is
there: a run killed mid-save leaves a directory without it. Standalone snapshots (imports, QuantLMs, packed
exports) are written under a temporary name and renamed into place with ``config.json`` last, so a
readable ``config.json`` next to its weights is their completion mark; trilm's own writers add ``COMPLETE``
as well. Its tokenizer is the ``tokenizer.model`` next to it, else the one in its run directory, else
``--tokenizer``; whichever it is must have the SHA-256 recorded in the snapshot's meta.

Every output is written under a temporary name and renamed into place with an ``trilm_export.json``
marker, so a crash leaves no half export. An output that already exists is replaced only when its marker
says it is the same kind of export of the same snapshot; anything else there (another export, other files)
is refused, so nothing already written is lost.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trilm.config import ConfigError
from trilm.data.tokenizer import Tokenizer
from trilm.export.tokenizer import trained_with_bos
from trilm.model.config import ModelConfig
from trilm.model.snapshot import WEIGHTS_FILE, read_snapshot

EXPORT_MARKER = "trilm_export.json"
COMPLETE_MARKER = "COMPLETE"


@dataclasses.dataclass
class SnapshotSource:
    """A finished snapshot opened for export: config, meta (a plain dict), tokenizer, BOS convention."""

    path: Path
    cfg: ModelConfig
    meta: dict[str, Any]
    tokenizer: Tokenizer | None
    add_bos: bool

    @property
    def step(self) -> int | None:
        return self.meta.get("step")


def find_tokenizer(
    snapshot: Path, meta: dict[str, Any], override: str | Path | None = None
) -> Tokenizer | None:
    """The snapshot's tokenizer (hash-checked against its meta), or None when there is none to find."""
    expected = meta.get("tokenizer_hash") or None
    if override:
        return Tokenizer.load(override, expected_hash=expected)
    candidates = [snapshot / "tokenizer.model"]
    if snapshot.parent.name == "snapshots":
        candidates.append(snapshot.parent.parent / "tokenizer.model")
    for path in candidates:
        if path.is_file():
            return Tokenizer.load(path, expected_hash=expected)
    return None


def open_snapshot(
    path: str | Path, *, tokenizer: str | Path | None = None, require_tokenizer: bool = False
) -> SnapshotSource:
    """Open a complete snapshot for export; refuse an unfinished one or a tokenizer with another hash."""
    path = Path(path)
    if not path.is_dir():
        raise ConfigError(f"{path}: no such snapshot directory")
    in_run = path.parent.name == "snapshots" or path.name.startswith(".tmp")
    if in_run and not (path / COMPLETE_MARKER).is_file():
        raise ConfigError(
            f"{path}: no {COMPLETE_MARKER} marker: the snapshot was not finished (a run killed while saving "
            "leaves such a directory); export a complete one"
        )
    if not (path / WEIGHTS_FILE).is_file():
        raise ConfigError(f"{path}: no {WEIGHTS_FILE}: not a complete snapshot")
    cfg, snapshot_meta = read_snapshot(path)
    meta = snapshot_meta.to_dict()
    tok = find_tokenizer(path, meta, tokenizer)
    if tok is None and require_tokenizer:
        raise ConfigError(
            f"{path}: no tokenizer.model next to the snapshot or in its run directory; pass --tokenizer PATH "
            "(its SHA-256 must match the snapshot's tokenizer_hash)"
        )
    return SnapshotSource(path, cfg, meta, tok, trained_with_bos(path, meta))


def _marker(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


def check_output(out: Path, kind: str, source: str) -> bool:
    """Raise if ``out`` holds something other than this export; True when it holds this very export."""
    if not out.exists():
        return False
    if out.is_dir():
        if not any(out.iterdir()):
            return False
        marker = _marker(out / EXPORT_MARKER)
    else:
        marker = _marker(out.with_name(out.name + ".json")) if out.suffix == ".gguf" else None
        if marker is None:
            raise ConfigError(f"{out}: exists and is not a trilm {kind} export; choose another output path")
    if marker is None:
        raise ConfigError(f"{out}: is not empty and holds no trilm export; choose an empty or new directory")
    if marker.get("kind") != kind or marker.get("source") != source:
        raise ConfigError(
            f"{out}: holds another export ({marker.get('kind')} of {marker.get('source')}); refusing to "
            f"overwrite it with the {kind} export of {source}"
        )
    return True


def marker_payload(kind: str, src: SnapshotSource, **extra: Any) -> dict[str, Any]:
    return {
        "kind": kind,
        "source": str(src.path.resolve()),
        "family": src.cfg.family,
        "size": src.meta.get("size", src.cfg.name),
        "step": src.step,
        "tokens": src.meta.get("tokens"),
        "tokenizer_hash": src.tokenizer.hash if src.tokenizer else src.meta.get("tokenizer_hash"),
        "add_bos": src.add_bos,
        **extra,
    }


@contextlib.contextmanager
def export_directory(out: str | Path, kind: str, src: SnapshotSource, **extra: Any) -> Iterator[Path]:
    """Yield a temporary directory; on success it replaces ``out`` and gets the export marker."""
    out = Path(out)
    check_output(out, kind, str(src.path.resolve()))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".tmp-{out.name}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    (tmp / EXPORT_MARKER).write_text(json.dumps(marker_payload(kind, src, **extra), indent=2) + "\n")
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)


@contextlib.contextmanager
def export_file(out: str | Path, kind: str, src: SnapshotSource, **extra: Any) -> Iterator[Path]:
    """Yield a temporary file path; on success it replaces ``out`` and ``out.json`` records the export."""
    out = Path(out)
    if out.is_dir():
        raise ConfigError(f"{out}: is a directory; give a file path such as {out / 'model.gguf'}")
    check_output(out, kind, str(src.path.resolve()))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".tmp-{out.name}")
    try:
        yield tmp
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, out)
    sidecar = out.with_name(out.name + ".json")
    sidecar.write_text(json.dumps(marker_payload(kind, src, **extra), indent=2) + "\n")
