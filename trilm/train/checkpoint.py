"""The run directory and atomic checkpoints.

Layout (the contract other tools read)::

    run_dir/resolved_config.yaml      the TrainConfig actually used
    run_dir/tokenizer.model           copy of the tokenizer (+ tokenizer.trilm.json with its hash)
    run_dir/state/step-N/             resumable state: DeepSpeed engine files + trainer_state.json + rng
    run_dir/snapshots/step-N/         model-only suite member: model.safetensors + config.json (meta inside)
    run_dir/logs/                     metrics.jsonl, events.jsonl, tensorboard

Every checkpoint directory is written under a temporary name, renamed into place, and only then gets its
``COMPLETE`` marker; readers ignore directories without the marker, so a run killed mid-save resumes from
the previous complete state.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import torch.distributed as dist

MARKER = "COMPLETE"
_STEP_DIR = re.compile(r"^step-(\d+)$")


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


@contextlib.contextmanager
def atomic_directory(final: Path, marker_payload: dict | None = None) -> Iterator[Path]:
    """All ranks write into the yielded temporary directory; rank 0 renames it and writes the marker last."""
    tmp = final.parent / f".tmp-{final.name}"
    if _rank() == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    _barrier()
    yield tmp
    _barrier()
    if _rank() == 0:
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(final.parent)
        marker = final / MARKER
        marker.write_text(json.dumps(marker_payload or {}))
        with open(marker, "rb") as f:
            os.fsync(f.fileno())
    _barrier()


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
