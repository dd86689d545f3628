"""The run directory, its lock, and checkpoints written by every rank at once.

Layout (the contract other tools read; file names are :mod:`trilm.store.layout`'s)::

    run_dir/resolved_config.yaml      the TrainConfig actually used
    run_dir/tokenizer.model           copy of the tokenizer (+ tokenizer.trilm.json with its hash)
    run_dir/state/step-N/             resumable state: DeepSpeed engine files + trainer_state.json + rng
    run_dir/snapshots/step-N/         model-only suite member: model.safetensors + config.json (meta inside)
    run_dir/logs/                     metrics.jsonl, events.jsonl, tensorboard
    run_dir/.lock                     held (``flock``) by the training that owns the directory

Every checkpoint directory is written by :func:`atomic_directory`: the one atomic writer
(:mod:`trilm.atomic`) with its staging directory shared by all ranks, and the ``COMPLETE`` marker with the
manifest of every file (:mod:`trilm.store.integrity`, hashed by all ranks in parallel) written last.
Readers ignore directories without the marker, so a run killed mid-save resumes from the previous complete
state; a state truncated or altered *after* it was written is recognised by its manifest and skipped on
resume. The kernel drops the ``.lock`` when its holder dies, even by SIGKILL, so whether a run is being
trained is a question about a live process (:func:`lock_holder`), not about how recently it logged.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import os
import re
import shutil
import socket
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

import torch.distributed as dist

from trilm.atomic import (
    discard_directory,
    owner_tag,
    publish_directory,
    staging_directory,
    stale_leftovers_in,
)
from trilm.config import ConfigError
from trilm.store.integrity import complete_marker, complete_steps
from trilm.store.layout import COMPLETE, LOCK_FILE, RUN_CONFIG, SNAPSHOTS_DIR, STATES_DIR, step_dir_name


class RunDir:
    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.state = self.root / STATES_DIR
        self.snapshots = self.root / SNAPSHOTS_DIR
        self.logs = self.root / "logs"
        self.config = self.root / RUN_CONFIG

    def make(self) -> None:
        for d in (self.state, self.snapshots, self.logs):
            d.mkdir(parents=True, exist_ok=True)

    def snapshot(self, step: int) -> Path:
        return self.snapshots / step_dir_name(step)

    def state_dir(self, step: int) -> Path:
        return self.state / step_dir_name(step)


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _world() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def shared_map(work: list[str], fn) -> dict:
    """``{item: fn(item)}`` over ``work``, rank r doing items r, r + world, …; collective when distributed."""
    mine = {item: fn(item) for item in work[_rank() :: _world()]}
    if _world() == 1:
        return mine
    gathered: list[dict | None] = [None] * _world()
    dist.all_gather_object(gathered, mine)
    return {k: v for part in gathered for k, v in (part or {}).items()}


@contextlib.contextmanager
def atomic_directory(final: Path, marker_payload: dict | None = None) -> Iterator[Path]:
    """All ranks write into the yielded staging directory; rank 0 publishes it, replacing an older
    directory of the same step, and writes ``COMPLETE`` last (its manifest hashed by all ranks)."""
    owner = [owner_tag() if _rank() == 0 else None]
    if _world() > 1:
        dist.broadcast_object_list(owner, src=0)
    tmp = staging_directory(final, owner[0]) if _rank() == 0 else None
    if _world() > 1:
        holder = [tmp]
        dist.broadcast_object_list(holder, src=0)
        tmp = holder[0]
    assert tmp is not None  # rank 0 made it, the broadcast handed it to the other ranks
    try:
        yield tmp
    except BaseException:
        if _rank() == 0:
            discard_directory(tmp)
        raise
    _barrier()
    markers = complete_marker(marker_payload, mapper=shared_map)(tmp)
    if _rank() == 0:
        publish_directory(tmp, final, replace=True, markers=markers)
    _barrier()


def lock_holder(root: str | Path) -> str | None:
    """Who holds ``root/.lock`` (its recorded pid and host) while a live process holds it; None when free.

    A lock taken on this host is looked up in the kernel's lock table (``/proc/locks``) without touching
    it: even an instant's probing ``flock`` could make a training starting at that moment refuse its own
    directory. A lock recorded by another host (a cluster node, on a shared filesystem) is not in this
    host's table, so it is probed with ``LOCK_SH | LOCK_NB`` (never waited for or broken), which sees it
    where the filesystem carries ``flock`` between hosts (NFS does; some parallel filesystems keep it
    node-local: see :func:`lock_taken_elsewhere`).
    """
    path = Path(root) / LOCK_FILE
    try:
        st = path.stat()
        recorded = path.read_text().strip()
    except OSError:
        return None
    if not lock_taken_elsewhere(root):
        held = _in_lock_table(st)
        if held is not None:
            return (recorded or "another process") if held else None
    try:
        fh = open(path)  # noqa: SIM115 - closed below
    except OSError:
        return None
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = fh.read().strip() or "another process"
        fh.close()
        return holder
    except OSError:  # a filesystem without flock: nobody can hold it
        fh.close()
        return None
    fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
    fh.close()
    return None


def lock_taken_elsewhere(root: str | Path) -> bool:
    """``root/.lock`` was last taken on another host (its record names another host name). Whether that
    lock is still held may be invisible here, so run status then also trusts a fresh metrics log."""
    try:
        recorded = (Path(root) / LOCK_FILE).read_text()
    except OSError:
        return False
    host = re.search(r" on (\S+), started ", recorded)
    return host is not None and host.group(1) != socket.gethostname()


def _in_lock_table(st: os.stat_result) -> bool | None:
    """Whether a process on this host holds a ``flock`` on the file ``st`` describes; None without
    ``/proc/locks``."""
    key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        table = Path("/proc/locks").read_text()
    except OSError:
        return None
    return any(
        len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == key
        for fields in (line.split() for line in table.splitlines())
    )


class RunLock:
    """An exclusive ``flock`` on ``run_dir/.lock`` for the lifetime of a training (rank 0 holds it).

    The file records who holds it (pid, host, start time) for the error message; the lock itself is the
    kernel's, released when the holder exits or is killed, so a crashed run never leaves it stuck.
    """

    def __init__(self, root: Path):
        self.path = Path(root) / LOCK_FILE
        self._fh: IO[str] | None = None

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


def prune_states(parent: Path, keep_last: int, keep: Iterable[int] = ()) -> list[int]:
    """Delete all but the newest ``keep_last`` complete states, never one whose step is in ``keep`` (the
    branch points), and what killed writers left; rank 0 only."""
    if _rank() != 0:
        return []
    removed = []
    kept = set(keep)
    steps = [(s, p) for s, p in complete_steps(parent) if s not in kept]
    for step, path in steps[: max(len(steps) - keep_last, 0)]:
        (path / COMPLETE).unlink()
        shutil.rmtree(path)
        removed.append(step)
    for leftover in stale_leftovers_in(parent):
        shutil.rmtree(leftover, ignore_errors=True)
    return removed
