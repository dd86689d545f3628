"""``trilm suite status``: where every run of a suite stands, read from its run directory alone.

Nothing here talks to a scheduler: the run directory is the contract (``trilm/train/checkpoint.py``), so the
same table works for local, SLURM and hostfile launches. A run is

- ``pending``: no run directory (or nothing in it yet);
- ``running``: a live process holds its ``.lock`` (the trainer holds it for the whole run and the kernel
  drops it when the process dies, even by ``kill -9`` or ``scancel``). The metrics log's age decides
  instead (written within ``stale_after`` seconds) for a run directory without a lock file (an older
  run's), and, as a second sign, when the lock was taken on another host, whose lock may
  not be visible here (``flock`` on some shared filesystems is node-local);
- ``stopped``: it has progress and nobody trains it (killed, preempted, cancelled, or crashed — the next
  ``trilm suite launch`` resumes it from the newest complete state);
- ``failed``: the local launcher recorded an error (``FAILED`` in the run directory, cleared on relaunch);
- ``finished``: the resumable state of the last step is complete (the trainer writes it after the last
  snapshot, so a run killed between the two is not finished and redoes its last steps).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from trilm.config import ConfigError
from trilm.model.flops import flops_per_token
from trilm.store.integrity import latest_complete
from trilm.store.layout import LOCK_FILE
from trilm.store.snapshot import read_snapshot_config
from trilm.suite.config import Suite, SuiteRun
from trilm.suite.forecast import suite_forecasts
from trilm.suite.text import duration, si, table
from trilm.train.checkpoint import RunDir, lock_holder, lock_taken_elsewhere

FAILED = "FAILED"
STATES = ("finished", "running", "stopped", "failed", "pending")
STALE_AFTER = 900.0
FORECAST_NOTE = (
    "final loss: measured for finished runs; otherwise Tissue et al.'s curve law fitted on every run's"
    " checkpoints at once (with its cooldown branches'; the annealing parameter shared, so a run before its"
    " decay borrows it), [interval] = 95 % of bootstrap refits; * = the law is not identified (see below)"
)


@dataclasses.dataclass
class RunStatus:
    run: SuiteRun
    state: str
    step: int = 0
    last_snapshot: int | None = None
    last_state: int | None = None
    train_loss: float | None = None
    val_loss: float | None = None
    tokens_per_s: float | None = None
    last_update: float | None = None
    started: float | None = None
    """Time of the first metrics record: ``last_update - started`` is the run's wall time so far (pauses
    between an interruption and its resume included)."""
    error: str = ""
    forecast: Any = None
    """A :class:`trilm.suite.forecast.Forecast` once :func:`add_forecasts` ran (the table then shows it)."""

    @property
    def wall_s(self) -> float | None:
        if self.started is None or self.last_update is None:
            return None
        return max(0.0, self.last_update - self.started)

    @property
    def steps(self) -> int:
        return self.run.cfg.steps

    @property
    def tokens(self) -> int:
        return self.step * self.run.cfg.batch_tokens

    @property
    def eta_s(self) -> float | None:
        if self.state == "finished":
            return 0.0
        if not self.tokens_per_s:
            return None
        return (self.steps - self.step) * self.run.cfg.batch_tokens / self.tokens_per_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "run": self.run.name,
            "family": self.run.family,
            "size": self.run.size,
            "state": self.state,
            "step": self.step,
            "steps": self.steps,
            "tokens": self.tokens,
            "last_snapshot": self.last_snapshot,
            "last_state": self.last_state,
            "train_loss": self.train_loss,
            "val_loss": self.val_loss,
            "tokens_per_s": self.tokens_per_s,
            "eta_s": self.eta_s,
            "wall_s": self.wall_s,
            "error": self.error,
            **({} if self.forecast is None else {"forecast": dataclasses.asdict(self.forecast)}),
        }


def tail_records(path: Path, max_bytes: int = 256 * 1024) -> list[dict[str, Any]]:
    """The JSON records in the last ``max_bytes`` of a JSONL file (a partial first line is dropped)."""
    if not path.is_file():
        return []
    size = path.stat().st_size
    with path.open("rb") as fh:
        fh.seek(max(0, size - max_bytes))
        chunk = fh.read().decode("utf-8", errors="replace")
    lines = chunk.splitlines()
    if size > max_bytes and lines:
        lines = lines[1:]
    out = []
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            out.append(record)
    return out


def _first_time(path: Path) -> float | None:
    with path.open() as fh:
        try:
            value = json.loads(fh.readline()).get("time")
        except json.JSONDecodeError:
            return None
    return float(value) if isinstance(value, int | float) else None


def _last(records: list[dict[str, Any]], key: str) -> Any:
    for record in reversed(records):
        if record.get(key) is not None:
            return record
    return None


def _snapshot_val_loss(path: Path) -> float | None:

    try:
        return read_snapshot_config(path)[1].val_loss
    except ConfigError:
        return None


def run_status(run: SuiteRun, now: float | None = None, stale_after: float = STALE_AFTER) -> RunStatus:
    now = time.time() if now is None else now
    rd = RunDir(run.run_dir)
    if not rd.root.is_dir():
        return RunStatus(run, "pending")
    snap = latest_complete(rd.snapshots)
    state = latest_complete(rd.state)
    metrics_path = rd.logs / "metrics.jsonl"
    records = tail_records(metrics_path)
    status = RunStatus(
        run,
        "pending",
        last_snapshot=snap[0] if snap else None,
        last_state=state[0] if state else None,
    )
    steps = [s for s in (status.last_snapshot, status.last_state) if s is not None]
    loss_rec = _last(records, "loss")
    if loss_rec is not None:
        status.train_loss = float(loss_rec["loss"])
    rate_rec = _last(records, "tokens_per_s")
    if rate_rec is not None:
        status.tokens_per_s = float(rate_rec["tokens_per_s"])
    val_rec = _last(records, "val_loss")
    if val_rec is not None:
        status.val_loss = float(val_rec["val_loss"])
    elif snap is not None:
        status.val_loss = _snapshot_val_loss(snap[1])
    if records:
        steps.append(int(records[-1].get("step", 0)))
        status.last_update = os.path.getmtime(metrics_path)
        status.started = _first_time(metrics_path)
    status.step = max(steps, default=0)
    failed = rd.root / FAILED
    if status.last_state == run.cfg.steps:
        status.state, status.step = "finished", run.cfg.steps
    elif failed.is_file():
        lines = failed.read_text().strip().splitlines()
        status.state, status.error = "failed", lines[-1] if lines else "failed"
    elif lock_holder(rd.root) is not None or (
        (not (rd.root / LOCK_FILE).is_file() or lock_taken_elsewhere(rd.root))
        and status.last_update is not None
        and now - status.last_update < stale_after
    ):
        status.state = "running"
    elif records or steps:
        status.state = "stopped"
    return status


def suite_status(suite: Suite, stale_after: float = STALE_AFTER) -> list[RunStatus]:
    now = time.time()
    return [run_status(r, now, stale_after) for r in suite.runs]


def add_forecasts(statuses: list[RunStatus], cfg=None, branches: Iterable[SuiteRun] = ()) -> list[RunStatus]:
    """Attach each run's final-loss forecast (:mod:`trilm.suite.forecast`: the suite's runs, with the
    checkpoints of their cooldown ``branches``, fitted together); kept out of :func:`run_status` because it
    fits a law and the launcher polls the status."""
    forecasts = suite_forecasts([(s.run, s.state) for s in statuses], branches, cfg)
    for s in statuses:
        s.forecast = forecasts[s.run.name]
    return statuses


def _flops_per_token(run: SuiteRun) -> float:

    return flops_per_token(run.cfg.model, run.cfg.sequence_length)


def suite_eta(statuses: list[RunStatus]) -> float | None:
    """Seconds for the remaining FLOPs of every unfinished run at the FLOP/s of the most recent run."""
    timed = [s for s in statuses if s.tokens_per_s and s.last_update is not None]
    if not timed:
        return None
    latest = max(timed, key=lambda s: s.last_update or 0.0)
    assert latest.tokens_per_s is not None  # timed holds runs with a measured rate only
    rate = latest.tokens_per_s * _flops_per_token(latest.run)
    left = sum(
        (s.steps - s.step) * s.run.cfg.batch_tokens * _flops_per_token(s.run)
        for s in statuses
        if s.state != "finished"
    )
    return left / rate


def render_status(suite: Suite, statuses: list[RunStatus]) -> str:
    headers = ["run", "state", "step", "tokens", "snapshot", "state ckpt", "train loss", "val loss"]
    headers += ["tokens/s", "wall", "ETA"]
    shown = any(s.forecast is not None for s in statuses)
    if shown:
        headers.append("final loss [interval]")
    rows = []
    for s in statuses:
        rows.append(
            [
                s.run.name,
                s.state,
                f"{s.step:,}/{s.steps:,}",
                f"{si(s.tokens)}/{si(s.steps * s.run.cfg.batch_tokens)}",
                "–" if s.last_snapshot is None else f"{s.last_snapshot:,}",
                "–" if s.last_state is None else f"{s.last_state:,}",
                "–" if s.train_loss is None else f"{s.train_loss:.4f}",
                "–" if s.val_loss is None else f"{s.val_loss:.4f}",
                "–" if s.tokens_per_s is None else si(s.tokens_per_s),
                duration(s.wall_s),
                "done" if s.state == "finished" else duration(s.eta_s),
            ]
        )
        if shown:
            rows[-1].append("–" if s.forecast is None else s.forecast.text())
    counts: dict[str, int] = {}
    for s in statuses:
        counts[s.state] = counts.get(s.state, 0) + 1
    done = sum(s.tokens for s in statuses)
    total = sum(s.steps * s.run.cfg.batch_tokens for s in statuses)
    progress = f"tokens {si(done)} of {si(total)} ({100 * done / max(total, 1):.1f}%)"
    eta = suite_eta(statuses)
    if eta is not None:
        progress += f"; the rest at the latest run's FLOP/s: {duration(eta)}"
    lines = [
        f"suite {suite.name}: {len(statuses)} runs under {suite.root}: "
        + ", ".join(f"{counts[state]} {state}" for state in STATES if state in counts),
        progress,
        "",
        table(headers, rows, left=2),
    ]
    if shown:
        lines += ["", FORECAST_NOTE]
        lines += [f"{s.run.name}: {s.forecast.note}" for s in statuses if s.forecast and s.forecast.note]
    errors = [f"{s.run.name}: {s.error}" for s in statuses if s.error]
    if errors:
        lines += ["", *[f"failed: {e}" for e in errors]]
    return "\n".join(lines)
