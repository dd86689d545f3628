"""The run directory and atomic checkpoints.

Layout (the contract other tools read)::

    run_dir/resolved_config.yaml      the TrainConfig actually used
    run_dir/tokenizer.model           copy of the tokenizer (+ tokenizer.trilm.json with its hash)
    run_dir/state/step-N/             resumable state: DeepSpeed engine files + trainer_state.json + rng
    run_dir/snapshots/step-N/         model-only suite member: model.safetensors + config.json (meta inside)
    run_dir/logs/                     metrics.jsonl, events.jsonl, tensorboard

Every checkpoint directory is written under a temporary name, renamed into place, and only then gets its
``COMPLETE`` marker; readers ignore directories without the marker, so a run killed mid-save resumes from
the previous complete state. The marker lists every file with its size and CRC-32, so a state truncated or
altered *after* it was written (a partial copy, a full disk, bit rot) is recognised and skipped on resume
(:func:`verify_directory`) instead of failing deep inside a loader. ``run_dir/.lock`` is held (``flock``)
by the training that owns the directory; the kernel drops it when that process dies, even by SIGKILL.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import re
import shutil
import socket
import zlib
from collections.abc import Iterator
from pathlib import Path

import torch.distributed as dist

from trilm.config import ConfigError

MARKER = "COMPLETE"
LOCK_NAME = ".lock"
_STEP_DIR = re.compile(r"^step-(\d+)$")
_CHUNK = 1 << 24


class RunDir:
    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.state = self.root / "state"
        self.snapshots = self.root / "snapshots"
        self.logs = self.root / "logs"
        self.config = self.root / "resolved_config.yaml"

    def make(self) -> None:
        for d in (self.state, self.snapshots, self.logs):
            d.mkdir(parents=True, exist_ok=True)

    def snapshot(self, step: int) -> Path:
        return self.snapshots / f"step-{step}"

    def state_dir(self, step: int) -> Path:
        return self.state / f"step-{step}"


def is_complete(path: Path) -> bool:
    return (path / MARKER).is_file()


def complete_steps(parent: Path) -> list[tuple[int, Path]]:
    """(step, dir) of every complete ``step-N`` directory under ``parent``, by step."""
    if not parent.is_dir():
        return []
    found = []
    for child in parent.iterdir():
        m = _STEP_DIR.match(child.name)
        if m and child.is_dir() and is_complete(child):
            found.append((int(m.group(1)), child))
    return sorted(found)


def latest_complete(parent: Path) -> tuple[int, Path] | None:
    steps = complete_steps(parent)
    return steps[-1] if steps else None


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _world() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def file_crc32(path: Path) -> int:
    crc = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc


def _shared(work: list[str], fn) -> dict:
    """``{item: fn(item)}`` over ``work``, rank r doing items r, r + world, …; collective when distributed."""
    mine = {item: fn(item) for item in work[_rank() :: _world()]}
    if _world() == 1:
        return mine
    gathered: list[dict | None] = [None] * _world()
    dist.all_gather_object(gathered, mine)
    return {k: v for part in gathered for k, v in (part or {}).items()}


def _manifest(root: Path) -> dict[str, dict]:
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    return _shared(files, lambda rel: {"bytes": (root / rel).stat().st_size, "crc32": file_crc32(root / rel)})


@contextlib.contextmanager
def atomic_directory(final: Path, marker_payload: dict | None = None) -> Iterator[Path]:
    """All ranks write into the yielded temporary directory; rank 0 renames it and writes the marker last
    (with the manifest of every file: size and CRC-32, hashed by all ranks in parallel)."""
    tmp = final.parent / f".tmp-{final.name}"
    if _rank() == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    _barrier()
    yield tmp
    _barrier()
    files = _manifest(tmp)
    if _rank() == 0:
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(final.parent)
        marker = final / MARKER
        marker.write_text(json.dumps({**(marker_payload or {}), "files": files}))
        with open(marker, "rb") as f:
            os.fsync(f.fileno())
    _barrier()


def _check_file(root: Path, rel: str, expected: dict | None) -> str | None:
    path = root / rel
    try:
        size = path.stat().st_size
    except OSError:
        return f"{path}: missing"
    if expected is not None:
        if size != expected["bytes"]:
            return f"{path}: {size} bytes, {expected['bytes']} when written (truncated or replaced)"
        if file_crc32(path) != expected["crc32"]:
            return f"{path}: checksum mismatch (the file changed after it was written)"
    if path.suffix == ".json":
        try:
            json.loads(path.read_text())
        except (ValueError, UnicodeDecodeError) as exc:
            return f"{path}: not valid JSON ({exc})"
    return None


def verify_directory(path: Path, required: tuple[str, ...] = ()) -> list[str]:
    """Problems of a complete checkpoint directory (empty when sound): files missing, truncated, changed
    since the manifest was written, unreadable JSON, or ``required`` files absent. Collective when
    distributed (every rank checks a share of the files and all get the same answer)."""
    marker = path / MARKER
    try:
        payload = json.loads(marker.read_text())
    except OSError:
        return [f"{marker}: missing"]
    except (ValueError, UnicodeDecodeError) as exc:
        return [f"{marker}: unreadable ({exc})"]
    manifest = payload.get("files") if isinstance(payload, dict) else None
    if manifest is None:  # written before markers had a manifest: check what can be checked
        manifest = {str(p.relative_to(path)): None for p in path.rglob("*") if p.is_file()}
        manifest.pop(MARKER, None)
    names = sorted(set(manifest) | set(required))
    checked = _shared(names, lambda rel: _check_file(path, rel, manifest.get(rel)))
    return [checked[name] for name in names if checked[name]]


class RunLock:
    """An exclusive ``flock`` on ``run_dir/.lock`` for the lifetime of a training (rank 0 holds it).

    The file records who holds it (pid, host, start time) for the error message; the lock itself is the
    kernel's, released when the holder exits or is killed, so a crashed run never leaves it stuck.
    """

    def __init__(self, root: Path):
        self.path = Path(root) / LOCK_NAME
        self._fh = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(self.path, "a+")  # noqa: SIM115 - kept open while the lock is held
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "another process"
            fh.close()
            raise ConfigError(
                f"{self.path.parent}: another training is using this run directory ({holder}; lock "
                f"{self.path}); stop it first, or use another run_dir"
            ) from None
        fh.seek(0)
        fh.truncate()
        started = datetime.datetime.now().isoformat(timespec="seconds")
        fh.write(f"pid {os.getpid()} on {socket.gethostname()}, started {started}\n")
        fh.flush()
        self._fh = fh

    def release(self) -> None:
        if self._fh is not None:
            fcntl.flock(self._fh.fileno(), fcntl.LOCK_UN)
            self._fh.close()
            self._fh = None

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def prune_states(parent: Path, keep_last: int) -> list[int]:
    """Delete all but the newest ``keep_last`` complete states (and stale temporaries); rank 0 only."""
    if _rank() != 0:
        return []
    removed = []
    steps = complete_steps(parent)
    for step, path in steps[: max(len(steps) - keep_last, 0)]:
        (path / MARKER).unlink()
        shutil.rmtree(path)
        removed.append(step)
    for child in parent.iterdir() if parent.is_dir() else []:
        if child.name.startswith(".tmp-"):
            shutil.rmtree(child, ignore_errors=True)
    return removed
