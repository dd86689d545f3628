"""The results table: one row per (run, snapshot, evaluation), as CSV, JSON or JSON Lines.

This is the contract between the per-checkpoint evaluation (which writes it) and the scaling-law tools (which
read it). The columns, in order:

===================== ====== =================================================================================
column                type   meaning
===================== ====== =================================================================================
run                   str    run identifier (one training run; its checkpoints share it)
family                str    ``trilm``, ``floatlm``, ``bilm``, ``quantlm-<method>-<bits>`` or free text
size                  str    preset name, e.g. ``99M``; rows of equal size are paired across families
params                int    N, all parameters (embedding and LM head included), > 0
nonembedding_params   int    N without the token embedding and LM head, 0 < · ≤ params
linear_params         int    parameters of the quantized linear layers (the ones stored at low precision)
tokens                float  D, training tokens seen at this snapshot, ≥ 0
flops                 float  training FLOPs spent up to this snapshot, ≥ 0
bits_per_param        float  average storage bits per parameter of the model, see :func:`model_bits`
step                  int    optimizer step of the snapshot, ≥ 0
eval                  str    evaluation name, e.g. ``val_loss``
loss                  float  the evaluation's loss in nats (cross-entropy), > 0
===================== ====== =================================================================================

Further columns are allowed, kept in :attr:`ResultRow.extra` and written back. A row is identified by
``(run, step, eval)``: :func:`append_rows` skips rows already present and refuses to overwrite a row whose
values differ. Every read error names the file, the line (CSV/JSONL) or row index (JSON) and the column.

**Bits per parameter** come from :mod:`trilm.bits`, the one definition: ``bits_per_param =
model_bits(linear, N − linear, linear_bits) / N`` where the quantized linears count at their *value* bits
and everything else (embedding, LM head, norms) at 16: TriLM ``log2(3) ≈ 1.585``, BiLM 1, FloatLM 16, a
QuantLM the bits its method's paper counts (GPTQ ``b + (16 + b) / g``). The model size in bits, the x-axis
of the size comparison, is ``params · bits_per_param``. Stored bits (bytes on disk) go in an extra column
``stored_bits_per_param`` where an evaluation knows them.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from trilm.atomic import write_text
from trilm.bits import FLOAT_BITS, TERNARY_BITS, model_bits
from trilm.bits import bits_per_param as _bits_per_param
from trilm.bits import group_quant_bits as quantized_linear_bits
from trilm.families import family_kind, family_linear_bits
from trilm.families import family_linear_bits as default_linear_bits

# the bit helpers are trilm.bits' and trilm.families', re-exported under the table's own names
__all__ = [
    "COLUMNS",
    "FLOAT_BITS",
    "TERNARY_BITS",
    "ResultRow",
    "TableError",
    "append_rows",
    "default_linear_bits",
    "family_kind",
    "model_bits",
    "quantized_linear_bits",
    "read_table",
    "row_from_record",
    "write_table",
]
from trilm.config import ConfigError


class TableError(ConfigError):
    """A results table cannot be read or written; the message names the file, line and column."""


_STR, _INT, _FLOAT = "str", "int", "float"
COLUMNS: dict[str, str] = {
    "run": _STR,
    "family": _STR,
    "size": _STR,
    "params": _INT,
    "nonembedding_params": _INT,
    "linear_params": _INT,
    "tokens": _FLOAT,
    "flops": _FLOAT,
    "bits_per_param": _FLOAT,
    "step": _INT,
    "eval": _STR,
    "loss": _FLOAT,
}


@dataclasses.dataclass
class ResultRow:
    """One evaluation of one snapshot; see the module docstring for the meaning of each field."""

    run: str
    family: str
    size: str
    params: int
    nonembedding_params: int
    linear_params: int
    tokens: float
    flops: float
    bits_per_param: float
    step: int
    eval: str
    loss: float
    extra: dict[str, str] = dataclasses.field(default_factory=dict)
    source: str = dataclasses.field(default="", compare=False)

    def __post_init__(self) -> None:
        problem = self.problem()
        if problem:
            raise TableError(f"{self.source}, {problem}" if self.source else problem)

    def problem(self) -> str | None:
        """A message naming the first invalid field, or None."""
        for name in ("run", "family", "size", "eval"):
            if not str(getattr(self, name)).strip():
                return f"column '{name}': must not be empty"
        for name in (
            "params",
            "nonembedding_params",
            "linear_params",
            "tokens",
            "flops",
            "bits_per_param",
            "step",
            "loss",
        ):
            value = getattr(self, name)
            if not math.isfinite(value):
                return f"column '{name}': {value!r} is not a finite number"
        checks = [
            ("params", self.params > 0, "must be > 0"),
            ("nonembedding_params", 0 < self.nonembedding_params <= self.params, "must be in (0, params]"),
            ("linear_params", 0 <= self.linear_params <= self.params, "must be in [0, params]"),
            ("tokens", self.tokens >= 0, "must be ≥ 0"),
            ("flops", self.flops >= 0, "must be ≥ 0"),
            ("bits_per_param", 0 < self.bits_per_param <= 64, "must be in (0, 64]"),
            ("step", self.step >= 0, "must be ≥ 0"),
            ("loss", self.loss > 0, "must be > 0"),
        ]
        for name, ok, rule in checks:
            if not ok:
                return f"column '{name}': {getattr(self, name)!r} {rule}"
        return None

    @property
    def key(self) -> tuple[str, int, str]:
        return (self.run, self.step, self.eval)

    @property
    def model_bits(self) -> float:
        """Model size in bits: ``params · bits_per_param``."""
        return self.params * self.bits_per_param

    @classmethod
    def from_counts(
        cls,
        *,
        run: str,
        family: str,
        size: str,
        params: int,
        nonembedding_params: int,
        linear_params: int,
        tokens: float,
        flops: float,
        step: int,
        eval: str,
        loss: float,
        linear_bits: float | None = None,
        **extra: Any,
    ) -> ResultRow:
        """Build a row, computing ``bits_per_param`` from ``linear_bits`` (default: from the family name)."""
        bits = family_linear_bits(family) if linear_bits is None else linear_bits
        if bits is None:
            raise TableError(f"family {family!r}: cannot infer linear bits; pass linear_bits")
        bpp = _bits_per_param(params, linear_params, bits)
        return cls(
            run=run,
            family=family,
            size=size,
            params=params,
            nonembedding_params=nonembedding_params,
            linear_params=linear_params,
            tokens=tokens,
            flops=flops,
            bits_per_param=bpp,
            step=step,
            eval=eval,
            loss=loss,
            extra={k: str(v) for k, v in extra.items()},
        )

    def to_record(self) -> dict[str, Any]:
        out: dict[str, Any] = {name: getattr(self, name) for name in COLUMNS}
        out.update(self.extra)
        return out

    def same_values(self, other: ResultRow) -> bool:
        for name, kind in COLUMNS.items():
            a, b = getattr(self, name), getattr(other, name)
            if kind == _FLOAT:
                if not math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0):
                    return False
            elif a != b:
                return False
        return self.extra == other.extra


def _parse(value: Any, kind: str, where: str, column: str) -> Any:
    if kind == _STR:
        if value is None:
            raise TableError(f"{where}, column '{column}': missing value")
        return str(value).strip()
    if value is None or (isinstance(value, str) and not value.strip()):
        raise TableError(f"{where}, column '{column}': missing value")
    if isinstance(value, bool):
        raise TableError(f"{where}, column '{column}': expected a number, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise TableError(f"{where}, column '{column}': {value!r} is not a number") from None
    except OverflowError:  # a JSON integer of hundreds of digits
        raise TableError(f"{where}, column '{column}': {value} is beyond the range of a number") from None
    if not math.isfinite(number):
        raise TableError(f"{where}, column '{column}': {value!r} is not a finite number (NaN or infinite)")
    if kind == _INT:
        if not number.is_integer():
            raise TableError(f"{where}, column '{column}': {value!r} is not an integer")
        return int(number)
    return number


def row_from_record(record: dict[str, Any], where: str) -> ResultRow:
    """Validate one record (a CSV/JSON row as a mapping) into a :class:`ResultRow`; errors name ``where``."""
    if not isinstance(record, dict):
        raise TableError(f"{where}: expected an object with the table columns, got {type(record).__name__}")
    missing = [c for c in COLUMNS if c not in record]
    if missing:
        raise TableError(f"{where}: missing column{'s' if len(missing) > 1 else ''} {', '.join(missing)}")
    values = {c: _parse(record[c], kind, where, c) for c, kind in COLUMNS.items()}
    extra = {str(k): "" if v is None else str(v) for k, v in record.items() if k not in COLUMNS}
    return ResultRow(**values, extra=extra, source=where)


def _read_text(path: Path) -> str:
    """The file as UTF-8 text; an undecodable byte is a :class:`TableError` naming the line."""
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise TableError(
            f"{path} line {line}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start});"
            " save the table as UTF-8"
        ) from None


def _json_problem(exc: Exception) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return exc.msg
    return "nested too deeply" if isinstance(exc, RecursionError) else str(exc)


def _csv_records(path: Path, text: str) -> Iterable[tuple[str, dict[str, Any]]]:
    with io.StringIO(text, newline="") as fh:
        reader = csv.DictReader(fh)
        try:
            if reader.fieldnames is None:
                return
            missing = [c for c in COLUMNS if c not in reader.fieldnames]
            if missing:
                raise TableError(
                    f"{path}: header lacks column{'s' if len(missing) > 1 else ''} {', '.join(missing)}"
                )
            for record in reader:
                if None in record:
                    raise TableError(
                        f"{path} line {reader.line_num}: more fields than the header has columns"
                    )
                yield f"{path} line {reader.line_num}", record
        except csv.Error as exc:  # a field past csv's size limit (128 KiB)
            raise TableError(f"{path} line {reader.line_num + 1}: not a CSV row ({exc})") from None


def _records(path: Path) -> Iterable[tuple[str, dict[str, Any]]]:
    suffix = path.suffix.lower()
    if suffix in (".csv", ".jsonl", ".json"):
        text = _read_text(path)
    if suffix == ".csv":
        yield from _csv_records(path, text)
    elif suffix == ".jsonl":
        with io.StringIO(text) as fh:
            for number, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except (ValueError, RecursionError) as exc:  # also too many digits, too deep
                    raise TableError(f"{path} line {number}: invalid JSON: {_json_problem(exc)}") from None
                yield f"{path} line {number}", record
    elif suffix == ".json":
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:
            line = f" line {exc.lineno}" if isinstance(exc, json.JSONDecodeError) else ""
            raise TableError(f"{path}{line}: invalid JSON: {_json_problem(exc)}") from None
        rows = data.get("rows") if isinstance(data, dict) else data
        if not isinstance(rows, list):
            raise TableError(f"{path}: expected a list of rows or an object with a 'rows' list")
        for index, record in enumerate(rows):
            yield f"{path} row {index}", record
    else:
        raise TableError(f"{path}: unknown table format {suffix!r}; use .csv, .json or .jsonl")


def read_table(*paths: str | Path) -> list[ResultRow]:
    """Read and validate one or more results tables; identical duplicate rows are kept once.

    Raises :class:`TableError` for a missing file, a bad value (naming file, line and column) or two rows
    with the same ``(run, step, eval)`` and different values.
    """
    rows: list[ResultRow] = []
    seen: dict[tuple[str, int, str], ResultRow] = {}
    for path in map(Path, paths):
        if not path.is_file():
            raise TableError(f"{path}: no such results table")
        for where, record in _records(path):
            row = row_from_record(record, where)
            previous = seen.get(row.key)
            if previous is not None:
                if not previous.same_values(row):
                    raise TableError(
                        f"{where}: run {row.run!r} step {row.step} eval {row.eval!r} is already in"
                        f" {previous.source} with different values"
                    )
                continue
            seen[row.key] = row
            rows.append(row)
    return rows


def write_table(path: str | Path, rows: Iterable[ResultRow]) -> Path:
    """Write rows to ``path`` (format from its suffix) atomically: a temporary file renamed over it."""
    path = Path(path)
    rows = list(rows)
    extras = sorted({k for r in rows for k in r.extra})
    records = [{**{c: "" for c in extras}, **r.to_record()} for r in rows]
    suffix = path.suffix.lower()
    if suffix == ".csv":
        text = io.StringIO(newline="")
        writer = csv.DictWriter(text, fieldnames=[*COLUMNS, *extras], lineterminator="\n")
        writer.writeheader()
        writer.writerows(records)
        content = text.getvalue()
    elif suffix == ".json":
        content = json.dumps({"format": "trilm-results", "version": 1, "rows": records}, indent=1) + "\n"
    elif suffix == ".jsonl":
        content = "".join(json.dumps(r) + "\n" for r in records)
    else:
        raise TableError(f"{path}: unknown table format {suffix!r}; use .csv, .json or .jsonl")
    return write_text(path, content)


def append_rows(path: str | Path, rows: Iterable[ResultRow], *, replace: bool = False) -> tuple[int, int]:
    """Add rows to the table at ``path`` (created if absent); return ``(added, skipped)``.

    A row whose ``(run, step, eval)`` is present with the same values is skipped. With different values it
    raises :class:`TableError`, unless ``replace`` is set, in which case the new values win. The file is
    rewritten atomically, so an interrupted write never loses the rows already there.
    """
    path = Path(path)
    existing = read_table(path) if path.exists() else []
    index = {r.key: i for i, r in enumerate(existing)}
    added = skipped = 0
    for row in rows:
        i = index.get(row.key)
        if i is None:
            index[row.key] = len(existing)
            existing.append(row)
            added += 1
        elif existing[i].same_values(row):
            skipped += 1
        elif replace:
            existing[i] = row
            added += 1
        else:
            raise TableError(
                f"{path}: run {row.run!r} step {row.step} eval {row.eval!r} is already present with"
                " different values (pass replace=True to overwrite)"
            )
    write_table(path, existing)
    return added, skipped
