"""Loss curves as data: one table per run of step, learning rate and loss, read from CSV or JSONL.

Why a table: the curve laws (:mod:`trilm.scaling.laws.curve`) are fitted on every logged step of a run, and
the same format serves a curve made by hand, one exported from another framework, and trilm's own runs — a
run's ``logs/metrics.jsonl`` is such a table (``step``, ``tokens``, ``lr``, ``loss`` at every logged step,
``val_loss`` where evaluated).

The columns:

- ``step`` (required): the optimizer step after which the row's values hold, an integer ≥ 0;
- ``lr``: the learning rate of that step. Rows with a rate define the schedule; between them the rate is
  linear in the step. Every step from the first rated row to the last must be covered;
- ``loss`` (or the column chosen with ``loss_column``, e.g. ``val_loss``): the measured loss. A row without
  one only defines the schedule;
- anything else (``tokens``, ``time``…) is kept out of the fit.

Rows of one step are merged (a later value replaces an earlier one), so a resumed run's log, which repeats
the steps after its last state, reads as the run. A malformed table raises :class:`FitError` naming the
file, the line and the column.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from trilm.config import shown
from trilm.scaling.errors import FitError

CURVE_COLUMNS = ("step", "tokens", "lr", "loss", "val_loss")
"""The columns :func:`write_curve` writes, in order."""
MAX_STEPS = 10_000_000
"""The last step a table may name: the schedule holds one rate per step (80 MB at this bound; Spectra's
longest run has about 300,000 steps)."""


class LossCurve:
    """A run's losses at some steps and the learning rate of every step.

    ``lr[s - 1]`` is the rate of step ``s`` for ``s = 1 … len(lr)``; ``steps`` (ascending, each in
    ``1 … len(lr)``) are where a loss was measured.
    """

    def __init__(self, name: str, lr: ArrayLike, steps: ArrayLike, loss: ArrayLike) -> None:
        self.name = name
        self.lr: np.ndarray = np.asarray(lr, float)
        self.steps: np.ndarray = np.asarray(steps, int)
        self.loss: np.ndarray = np.asarray(loss, float)
        self._check()

    def __repr__(self) -> str:
        return f"LossCurve({self.name!r}, {self.lr.size} steps, {self.steps.size} losses)"

    def _check(self) -> None:
        where = f"{self.name}: "
        if self.lr.ndim != 1 or self.lr.size == 0:
            raise FitError(f"{where}the schedule has no steps")
        if not np.all(np.isfinite(self.lr)) or np.any(self.lr < 0) or self.lr.max() <= 0:
            raise FitError(f"{where}learning rates must be finite, ≥ 0, with a positive peak")
        if self.steps.shape != self.loss.shape:
            raise FitError(f"{where}{self.steps.size} steps but {self.loss.size} losses")
        outside = self.steps[(self.steps < 1) | (self.steps > self.lr.size)]
        if outside.size:
            raise FitError(
                f"{where}a loss at step {int(outside[0])} lies outside the schedule's 1…{self.lr.size}"
            )
        if np.any(np.diff(self.steps) <= 0):
            raise FitError(f"{where}the steps with a loss must be strictly increasing")
        if self.loss.size and not (np.all(np.isfinite(self.loss)) and np.all(self.loss > 0)):
            raise FitError(f"{where}losses must be positive and finite")

    @property
    def total(self) -> int:
        return int(self.lr.size)

    def until(self, step: int) -> LossCurve:
        """The same run seen up to ``step``: its losses there and before, with the whole schedule."""
        keep = self.steps <= step
        return LossCurve(self.name, self.lr, self.steps[keep], self.loss[keep])

    def after(self, step: int) -> LossCurve:
        keep = self.steps >= step
        return LossCurve(self.name, self.lr, self.steps[keep], self.loss[keep])

    @classmethod
    def from_schedule(
        cls, name: str, schedule: Any, steps: Sequence[int] = (), loss: Sequence[float] = ()
    ) -> LossCurve:
        """A curve over a :class:`trilm.schedule.Schedule` (its rate at each step)."""
        lr = np.array([schedule.lr(i) for i in range(schedule.total)], float)
        return cls(name, lr, np.asarray(steps, int), np.asarray(loss, float))


def _number(value: Any, where: str, column: str, integer: bool = False) -> float | None:
    if value is None or (isinstance(value, str) and value.strip() == ""):
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise FitError(
            f"{where}: column {column!r} must be a number, got {type(value).__name__} {shown(value)}"
        )
    try:
        number = float(value)
    except (ValueError, OverflowError):
        raise FitError(f"{where}: column {column!r} must be a number, got {shown(value)}") from None
    if not math.isfinite(number):
        raise FitError(f"{where}: column {column!r} must be finite, got {shown(value)}")
    if integer and number != int(number):
        raise FitError(f"{where}: column {column!r} must be a whole number, got {shown(value)}")
    return number


def _records(path: Path) -> Iterable[tuple[str, dict[str, Any]]]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FitError(f"{path}: no such loss-curve table") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise FitError(f"{path}: cannot read the loss-curve table ({exc})") from None
    if path.suffix.lower() in (".jsonl", ".json"):
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise FitError(f"{path}, line {number}: not JSON ({exc.msg})") from None
            if not isinstance(record, dict):
                raise FitError(f"{path}, line {number}: expected an object, got {type(record).__name__}")
            yield f"{path}, line {number}", record
        return
    if path.suffix.lower() != ".csv":
        raise FitError(f"{path}: a loss-curve table is .csv or .jsonl, got {path.suffix or 'no suffix'}")
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if not header:
        raise FitError(f"{path}: empty table (expected a header with step, lr, loss)")
    header = [h.strip() for h in header]
    for number, row in enumerate(reader, 2):
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != len(header):
            raise FitError(f"{path}, line {number}: {len(row)} cells for {len(header)} columns")
        yield f"{path}, line {number}", dict(zip(header, row))


def read_curve(path: str | Path, *, loss_column: str = "loss", name: str | None = None) -> LossCurve:
    """Read one loss-curve table (CSV or JSONL); see the module docstring for the columns."""
    path = Path(path)
    lr, steps, losses, _ = _parse(path, loss_column, require_column=True)
    return LossCurve(name or str(path), lr, steps, losses)


SCHEDULE_POINTS = 200
"""How many evenly spaced steps :func:`read_schedule` predicts at, besides the table's own rows."""


def read_schedule(path: str | Path, *, loss_column: str = "loss") -> tuple[LossCurve, LossCurve | None]:
    """A schedule table (``step``, ``lr``; losses optional) as where to predict — every row's step and
    :data:`SCHEDULE_POINTS` evenly spaced steps — and, if it has losses, the measured curve."""
    path = Path(path)
    lr, steps, losses, rated = _parse(path, loss_column, require_column=False)
    where = np.union1d(rated[rated >= 1], np.linspace(1, lr.size, SCHEDULE_POINTS).round().astype(int))
    target = LossCurve(str(path), lr, where, np.ones(where.size))
    measured = LossCurve(str(path), lr, steps, losses) if steps.size else None
    return target, measured


def _parse(
    path: Path, loss_column: str, require_column: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(per-step rates, steps with a loss, their losses, the steps of rated rows) of one table."""
    rates: dict[int, float] = {}
    losses: dict[int, float] = {}
    first: dict[str, str] = {}
    seen_column = False
    for where, record in _records(path):
        if "step" not in record:
            raise FitError(f"{where}: no 'step' column (a loss-curve table needs step, lr and {loss_column})")
        step = _number(record["step"], where, "step", integer=True)
        if step is None or not 0 <= step <= MAX_STEPS:
            raise FitError(
                f"{where}: column 'step' must be a whole number in 0…{MAX_STEPS:,},"
                f" got {shown(record['step'])}"
            )
        s = int(step)
        lr = _number(record.get("lr"), where, "lr")
        if lr is not None:
            if lr < 0:
                raise FitError(f"{where}: column 'lr' must be ≥ 0, got {shown(record['lr'])}")
            rates[s] = lr
        if loss_column in record:
            seen_column = True
        value = _number(record.get(loss_column), where, loss_column)
        if value is not None:
            if value <= 0:
                raise FitError(
                    f"{where}: column {loss_column!r} must be positive, got {shown(record[loss_column])}"
                )
            losses[s] = value
            first.setdefault(str(s), where)
    if not rates:
        raise FitError(f"{path}: no row has an 'lr': the schedule is not defined")
    if require_column and not seen_column:
        raise FitError(f"{path}: no {loss_column!r} column")
    rated = np.array(sorted(rates))
    last = int(rated[-1])
    if last < 1:
        raise FitError(f"{path}: the schedule ends at step {last}; a curve needs at least one step")
    for s in losses:
        if not rated[0] <= s <= last or s < 1:
            raise FitError(
                f"{first[str(s)]}: a {loss_column} at step {s} lies outside the schedule, steps"
                f" {max(int(rated[0]), 1)}…{last}"
            )
    every = np.arange(1, last + 1)
    lr = np.interp(every, rated, [rates[int(s)] for s in rated])
    steps = np.array(sorted(losses), int)
    return lr, steps, np.array([losses[int(s)] for s in steps], float), rated


def read_curves(paths: Sequence[str | Path], *, loss_column: str = "loss") -> list[LossCurve]:
    curves = [read_curve(p, loss_column=loss_column) for p in paths]
    for curve in curves:
        if curve.steps.size == 0:
            raise FitError(f"{curve.name}: no row has a {loss_column!r}: nothing to fit")
    return curves


def write_curve(path: str | Path, rows: Iterable[dict[str, Any]]) -> Path:
    """Write rows with any of :data:`CURVE_COLUMNS` as a CSV loss-curve table (missing values empty)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(CURVE_COLUMNS), extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "" if row.get(k) is None else row[k] for k in CURVE_COLUMNS})
    tmp.replace(path)
    return path


def run_curve_path(run_dir: str | Path) -> Path:
    """Where a trilm run keeps its loss-curve table: ``logs/metrics.jsonl``."""
    return Path(run_dir) / "logs" / "metrics.jsonl"


__all__ = [
    "CURVE_COLUMNS",
    "LossCurve",
    "read_curve",
    "read_curves",
    "read_schedule",
    "run_curve_path",
    "write_curve",
]
