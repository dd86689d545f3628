"""The ``COMPLETE`` marker: written last into every directory trilm writes, with the manifest of its files.

``COMPLETE`` is a JSON object: what the writer wants to record (``step``, ``kind``) plus ``files``, the size
in bytes and CRC-32 of every other file in the directory. Its presence says the directory was finished
(it is written after the directory is renamed into place, :mod:`trilm.atomic`); its manifest lets a reader
recognise a file truncated or altered *after* it was written — a partial copy, a full disk, a flipped bit —
before using it, instead of computing a silently wrong result from it.

Checking costs one read of each file (CRC-32 runs at memory speed; ``benchmarks/data/store.py`` measures the
load-time cost). A marker without a manifest (``{"step": N}``, as older snapshots hold) says only that
the directory was finished; its files are checked for what can be checked (readable, finite).
"""

from __future__ import annotations

import dataclasses
import json
import zlib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from trilm.atomic import Markers
from trilm.store.errors import IntegrityError
from trilm.store.layout import COMPLETE, STEP_DIR

_CHUNK = 1 << 24
SMALL_FILE = 1 << 20
"""Files up to this size are checked when a directory is opened; larger ones before their first use."""

Mapper = Callable[[list[str], Callable[[str], Any]], dict[str, Any]]
"""``mapper(items, fn) -> {item: fn(item)}``; the default runs here, training shares the work over ranks."""


def _local(items: list[str], fn: Callable[[str], Any]) -> dict[str, Any]:
    return {item: fn(item) for item in items}


def file_crc32(path: str | Path) -> int:
    crc = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc


def file_record(path: str | Path) -> dict[str, int]:
    path = Path(path)
    return {"bytes": path.stat().st_size, "crc32": file_crc32(path)}


def manifest(root: str | Path, mapper: Mapper | None = None) -> dict[str, dict[str, int]]:
    """``{relative path: {bytes, crc32}}`` of every file under ``root`` except the marker itself."""
    root = Path(root)
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and p.name != COMPLETE)
    return (mapper or _local)(files, lambda rel: file_record(root / rel))


def complete_marker(payload: dict[str, Any] | None = None, mapper: Mapper | None = None):
    """The ``markers`` argument of :func:`trilm.atomic.atomic_directory`: ``COMPLETE`` with the manifest."""

    def markers(staging: Path) -> Markers:
        return {COMPLETE: json.dumps({**(payload or {}), "files": manifest(staging, mapper)}, indent=1)}

    return markers


@dataclasses.dataclass
class Complete:
    """A parsed ``COMPLETE`` marker."""

    path: Path
    payload: dict[str, Any]

    @property
    def files(self) -> dict[str, dict[str, int]] | None:
        """The manifest, or None for a marker without one (``{"step": N}``)."""
        files = self.payload.get("files")
        return files if isinstance(files, dict) else None


def read_complete(directory: str | Path) -> Complete | None:
    """The directory's marker, None when it has none; an unreadable marker is an :class:`IntegrityError`."""
    path = Path(directory) / COMPLETE
    if not path.is_file():
        return None
    try:
        payload = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as exc:  # ValueError: not UTF-8, not JSON
        reason = "nested too deeply" if isinstance(exc, RecursionError) else exc
        raise IntegrityError(f"{path}: unreadable completion marker ({reason})") from None
    if not isinstance(payload, dict):
        raise IntegrityError(f"{path}: the completion marker is not a JSON object")
    problem = _manifest_problem(payload.get("files"))
    if problem:
        raise IntegrityError(f"{path}: the manifest is damaged: {problem}")
    return Complete(path, payload)


def _manifest_problem(files: Any) -> str | None:
    """What is wrong with a marker's ``files`` (None when sound or absent): every entry a relative path
    inside the directory, with an integer size and CRC-32."""
    if files is None:
        return None
    if not isinstance(files, dict):
        return f"'files' is a {type(files).__name__}, not a mapping"
    for rel, record in files.items():
        parts = Path(rel).parts
        if not rel or "\x00" in rel or Path(rel).is_absolute() or ".." in parts:
            return f"{rel!r} is not a path inside the directory"
        sound = isinstance(record, dict) and all(
            isinstance(record.get(k), int) and not isinstance(record.get(k), bool) and record[k] >= 0
            for k in ("bytes", "crc32")
        )
        if not sound:
            return f"{rel}: expected bytes and crc32 as counts, got {record!r}"[:300]
    return None


def check_file(
    root: str | Path, rel: str, expected: dict[str, int] | None, *, crc: bool = True
) -> str | None:
    """What is wrong with one file against its manifest entry (None when sound)."""
    path = Path(root) / rel
    try:
        size = path.stat().st_size
    except OSError:
        return f"{path}: missing (listed in {COMPLETE})" if expected is not None else f"{path}: missing"
    if expected is not None:
        if size != expected.get("bytes"):
            return f"{path}: {size:,} bytes, {expected.get('bytes'):,} when written (truncated or replaced)"
        if crc and file_crc32(path) != expected.get("crc32"):
            return f"{path}: CRC-32 differs from the one recorded when it was written (the file is corrupted)"
    if path.suffix == ".json":
        try:
            json.loads(path.read_text())
        except (OSError, ValueError, RecursionError) as exc:  # ValueError: not UTF-8, not JSON
            return (
                f"{path}: not valid JSON ({'nested too deeply' if isinstance(exc, RecursionError) else exc})"
            )
    return None


def verify_directory(
    path: str | Path, required: Iterable[str] = (), mapper: Mapper | None = None
) -> list[str]:
    """Problems of a finished directory (empty when sound): marker missing or unreadable, files missing,
    truncated or changed since the manifest was written, unreadable JSON, ``required`` files absent."""
    path = Path(path)
    try:
        complete = read_complete(path)
    except IntegrityError as exc:
        return [str(exc)]
    if complete is None:
        return [f"{path / COMPLETE}: missing"]
    listed: Mapping[str, dict[str, int] | None] | None = complete.files
    if listed is None:  # a marker without a manifest: check what can be checked
        found = {str(p.relative_to(path)): None for p in path.rglob("*") if p.is_file()}
        found.pop(COMPLETE, None)
        listed = found
    names = sorted(set(listed) | set(required))
    checked = (mapper or _local)(names, lambda rel: check_file(path, rel, listed.get(rel)))
    return [checked[name] for name in names if checked[name]]


def check_listed(complete: Complete | None, names: Iterable[str] | None = None, *, crc: bool = True) -> None:
    """Raise :class:`IntegrityError` naming the first bad file among ``names`` (default: all listed)."""
    if complete is None or complete.files is None:
        return
    root = complete.path.parent
    files = complete.files
    for rel in sorted(files if names is None else [n for n in names if n in files]):
        problem = check_file(root, rel, files[rel], crc=crc)
        if problem:
            raise IntegrityError(problem)


def is_complete(path: Path) -> bool:
    return (Path(path) / COMPLETE).is_file()


def complete_steps(parent: Path) -> list[tuple[int, Path]]:
    """(step, dir) of every complete ``step-N`` directory under ``parent``, by step."""
    parent = Path(parent)
    if not parent.is_dir():
        return []
    found = []
    for child in parent.iterdir():
        m = STEP_DIR.match(child.name)
        if m and child.is_dir() and is_complete(child):
            found.append((int(m.group(1)), child))
    return sorted(found)


def latest_complete(parent: Path) -> tuple[int, Path] | None:
    steps = complete_steps(parent)
    return steps[-1] if steps else None
