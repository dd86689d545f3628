"""The one way trilm writes a file or a directory: temporary name, fsync, rename, marker last.

Every writer in trilm (snapshots, QuantLMs, pruned models, exports, checkpoints, token shards, tables,
tuning caches) goes through this module, so a crash or ``kill -9`` at any moment leaves either the old
target or the new one, never half of one, and the leftovers have one naming convention::

    .<name>.tmp-<host>-<pid>     what is being written (a file or a directory)
    .<name>.old-<host>-<pid>     a directory being replaced, moved aside until the new one is in place

Because the name says which process wrote it, the next writer of the same target removes the leftovers of
processes that are gone (same host, pid no longer running) and never touches those of a live writer — no
time window is involved. Leftovers of another host are left alone: their writer cannot be checked from
here. Two shorter forms that older trilm versions wrote are cleaned up too: ``.<name>.tmp-<pid>`` once
its pid is gone, ``.tmp-<name>`` always (it names no writer).

A directory is published by :func:`publish_directory`: every file is fsynced, the directory is renamed into
place (an existing one moved aside first when replacing), and only then are the marker files written (e.g.
``COMPLETE`` with the manifest of :mod:`trilm.store.integrity`), so a directory with its marker is whole.

This module sits at the bottom of the package (it imports nothing from trilm), so the data path, the
formats and the results table use it as well as the model store above them.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

HOST = re.sub(r"[^A-Za-z0-9_.]", "_", socket.gethostname()) or "host"
_LEFTOVER = re.compile(r"^\.(?P<name>.+)\.(?P<kind>tmp|old)-(?P<host>[A-Za-z0-9_.]+)-(?P<pid>\d+)$")
_LEGACY_PID = re.compile(r"^\.(?P<name>.+)\.tmp-(?P<pid>\d+)$")

Markers = Mapping[str, "str | bytes"]


def owner_tag() -> str:
    """``<host>-<pid>``: who is writing, as temporary names record it."""
    return f"{HOST}-{os.getpid()}"


def temp_path(final: str | Path, owner: str | None = None, kind: str = "tmp") -> Path:
    """The temporary sibling of ``final`` that this process (or ``owner``) writes."""
    final = Path(final)
    return final.with_name(f".{final.name}.{kind}-{owner or owner_tag()}")


def process_alive(pid: int) -> bool:
    """Whether a process with this id runs on this machine (signal 0 checks without touching it)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        return True
    return True


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _stale_owner(child: Path, name: str | None) -> bool:
    """Whether ``child`` is a temporary of ``name`` (any name when None) whose writer is gone."""
    m = _LEFTOVER.match(child.name)
    if m:
        return (name is None or m["name"] == name) and m["host"] == HOST and not process_alive(int(m["pid"]))
    m = _LEGACY_PID.match(child.name)
    if m:
        return (name is None or m["name"] == name) and not process_alive(int(m["pid"]))
    return child.name.startswith(".tmp-") and (name is None or child.name == f".tmp-{name}")


def stale_leftovers(final: str | Path) -> list[Path]:
    """Temporary siblings of ``final`` whose writing process is gone (see the module docstring)."""
    final = Path(final)
    if not final.parent.is_dir():
        return []
    candidates = [final.parent / f".tmp-{final.name}", *final.parent.glob(f".{glob_escape(final.name)}.*-*")]
    return sorted(p for p in candidates if p.exists() and _stale_owner(p, final.name))


def stale_leftovers_in(parent: str | Path) -> list[Path]:
    """Every temporary in ``parent`` whose writing process is gone, whatever its target."""
    parent = Path(parent)
    if not parent.is_dir():
        return []
    return sorted(p for p in parent.glob(".*") if _stale_owner(p, None))


def glob_escape(name: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", name)


def clean_leftovers(final: str | Path) -> list[Path]:
    """Remove what killed writers of ``final`` left behind; returns what was removed."""
    removed = stale_leftovers(final)
    for path in removed:
        _remove(path)
    return removed


def fsync_dir(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: str | Path) -> None:
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())


class AtomicFile:
    """A file written under its temporary name and renamed over ``path`` by :meth:`commit`.

    For writers that stream into a file across calls (token shards); the others use :func:`atomic_file`.
    """

    def __init__(self, path: str | Path, mode: str = "wb"):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        clean_leftovers(self.path)
        self.tmp = temp_path(self.path)
        self.fh: IO[Any] = open(self.tmp, mode)  # noqa: SIM115 - closed by commit/abort

    def commit(self) -> Path:
        self.fh.flush()
        os.fsync(self.fh.fileno())
        self.fh.close()
        os.replace(self.tmp, self.path)
        fsync_dir(self.path.parent)
        return self.path

    def abort(self) -> None:
        if not self.fh.closed:
            self.fh.close()
        self.tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_file(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path to write ``path``'s new content to; on success it replaces ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    clean_leftovers(path)
    tmp = temp_path(path)
    try:
        yield tmp
        fsync_file(tmp)
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_bytes(path: str | Path, data: bytes) -> Path:
    with atomic_file(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def write_text(path: str | Path, text: str) -> Path:
    return write_bytes(path, text.encode("utf-8"))


def write_json(path: str | Path, obj: Any, *, indent: int | None = 2, sort_keys: bool = False) -> Path:
    return write_text(path, json.dumps(obj, indent=indent, sort_keys=sort_keys) + "\n")


def copy_file(src: str | Path, path: str | Path) -> Path:
    with atomic_file(path) as tmp:
        shutil.copyfile(src, tmp)
    return Path(path)


# ---- directories -----------------------------------------------------------------------------------------
def _missing_parents(path: Path) -> list[Path]:
    out = []
    for parent in path.parents:
        if parent.exists():
            break
        out.append(parent)
    return out


def staging_directory(final: str | Path, owner: str | None = None) -> Path:
    """Create (empty) the temporary directory that becomes ``final``, after cleaning stale leftovers."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    clean_leftovers(final)
    tmp = temp_path(final, owner)
    _remove(tmp)
    tmp.mkdir()
    return tmp


def publish_directory(
    tmp: str | Path, final: str | Path, *, replace: bool = False, markers: Markers | None = None
) -> Path:
    """Move a finished staging directory to ``final`` and write ``markers`` (name → content) into it last.

    ``final`` must be absent or empty unless ``replace``: then the old directory is moved aside and
    removed once the new one is in place, so some whole version is there at every moment.
    """
    tmp, final = Path(tmp), Path(final)
    for path in sorted(tmp.rglob("*")):
        if path.is_file() and not path.is_symlink():
            fsync_file(path)
    fsync_dir(tmp)
    old = None
    if final.exists():
        if final.is_dir() and not any(final.iterdir()):
            final.rmdir()
        elif replace:
            old = temp_path(final, kind="old")
            _remove(old)
            os.rename(final, old)
        else:
            raise FileExistsError(f"{final}: exists and is not empty")
    os.rename(tmp, final)
    fsync_dir(final.parent)
    for name, content in (markers or {}).items():
        write_bytes(final / name, content.encode("utf-8") if isinstance(content, str) else content)
    if old is not None:
        _remove(old)
    return final


def discard_directory(tmp: str | Path, created: list[Path] | tuple[Path, ...] = ()) -> None:
    """Remove a staging directory and the (now empty) parents that were created for it."""
    _remove(Path(tmp))
    for parent in created:
        with contextlib.suppress(OSError):
            parent.rmdir()


@contextlib.contextmanager
def atomic_directory(
    final: str | Path,
    *,
    replace: bool = False,
    markers: Callable[[Path], Markers] | None = None,
) -> Iterator[Path]:
    """Yield a staging directory; when the block succeeds it becomes ``final`` (see
    :func:`publish_directory`), with ``markers(staging)`` written last. On any error the staging
    directory, and parent directories created for it, are removed."""
    final = Path(final)
    created = _missing_parents(final)
    tmp = staging_directory(final)
    try:
        yield tmp
        publish_directory(tmp, final, replace=replace, markers=markers(tmp) if markers else None)
    except BaseException:
        discard_directory(tmp, created)
        raise
