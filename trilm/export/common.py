"""What every export shares: the source model opened through the store, and the output written atomically.

The source is whatever :func:`trilm.store.open_model` opens — a complete snapshot of a run (its ``COMPLETE``
marker is required: a run killed mid-save leaves a directory without it), a standalone snapshot, QuantLM,
packed export, pruned snapshot or HF directory — with its files verified against their manifest and its
tokenizer chosen by the store's one policy (its SHA-256 must be the one the model records).

Every output is written under a temporary name and renamed into place (:mod:`trilm.atomic`), with
``COMPLETE`` (the manifest of its files) and the ``trilm_export.json`` marker last, so a crash leaves no half
export. An output that already exists is replaced only when its marker says it is the same kind of export
of the same source model (same file fingerprint); anything else there (another export, other files) is
refused, so nothing already written is lost.

No exported file records a path of the machine that wrote it: the source is named by its run and step (or
directory name) and its fingerprint, and path-valued metadata is reduced to names (:func:`portable`).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trilm.atomic import atomic_directory, atomic_file, write_json
from trilm.config import ConfigError
from trilm.store.integrity import complete_marker
from trilm.store.layout import EXPORT_MARKER
from trilm.store.open import ModelDir, open_model


def open_source(
    path: str | Path, *, tokenizer: str | Path | None = None, require_tokenizer: bool = False
) -> ModelDir:
    """Open the model to export; refuse it when a tokenizer is needed and there is none."""
    src = open_model(path, tokenizer=tokenizer)
    if require_tokenizer:
        src.tokenizer.require(src.given)
    return src


def portable(value: Any) -> Any:
    """``value`` with every absolute path string reduced to its last component (recursively)."""
    if isinstance(value, dict):
        return {k: portable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [portable(v) for v in value]
    if isinstance(value, str) and value.startswith("/") and len(value) > 1:
        return Path(value).name
    return value


def _marker(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _same_source(marker: dict[str, Any], src: ModelDir) -> bool:
    if marker.get("source_fingerprint"):
        return marker["source_fingerprint"] == src.fingerprint()
    return marker.get("source") == str(src.path.resolve())  # a marker without a fingerprint (older exports)


def check_output(out: Path, kind: str, src: ModelDir) -> bool:
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
    if marker.get("kind") != kind or not _same_source(marker, src):
        raise ConfigError(
            f"{out}: holds another export ({marker.get('kind')} of {marker.get('source')}); refusing to "
            f"overwrite it with the {kind} export of {src.label}"
        )
    return True


def marker_payload(kind: str, src: ModelDir, **extra: Any) -> dict[str, Any]:
    meta = src.meta
    return portable(
        {
            "kind": kind,
            "source": src.label,
            "source_fingerprint": src.fingerprint(),
            "family": src.config.family,
            "size": meta.size or src.config.name,
            "run": meta.run,
            "step": meta.step,
            "tokens": meta.tokens,
            "tokenizer_hash": src.tokenizer.hash or meta.tokenizer_hash,
            "add_bos": src.add_bos,
            **extra,
        }
    )


@contextlib.contextmanager
def export_directory(out: str | Path, kind: str, src: ModelDir, **extra: Any) -> Iterator[Path]:
    """Yield a staging directory; on success it replaces ``out`` with ``COMPLETE`` and the marker last."""
    out = Path(out)
    check_output(out, kind, src)
    payload = marker_payload(kind, src, **extra)

    def markers(staging: Path) -> dict[str, str]:
        return {
            **complete_marker({"kind": kind, "step": src.step})(staging),
            EXPORT_MARKER: json.dumps(payload, indent=2) + "\n",
        }

    with atomic_directory(out, replace=True, markers=markers) as tmp:
        yield tmp


@contextlib.contextmanager
def export_file(out: str | Path, kind: str, src: ModelDir, **extra: Any) -> Iterator[Path]:
    """Yield a temporary file path; on success it replaces ``out`` and ``out.json`` records the export."""
    out = Path(out)
    if out.is_dir():
        raise ConfigError(f"{out}: is a directory; give a file path such as {out / 'model.gguf'}")
    check_output(out, kind, src)
    payload = marker_payload(kind, src, **extra)
    with atomic_file(out) as tmp:
        yield tmp
    write_json(out.with_name(out.name + ".json"), payload)
