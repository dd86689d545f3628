"""Every checkpoint of a suite into the results table: the one writer of rows (``trilm eval suite``).

Inputs are run directories (``RUN/snapshots/step-N``, complete ones only), exported suites (their
``suite_index.json``), single snapshots (also QuantLMs and packed exports) or Hugging Face directories. Per
checkpoint it writes, into the table that ``trilm scaling fit`` reads:

- a ``val_loss`` row: the loss the trainer (or post-hoc method) measured on its validation set, read from the
  snapshot's meta — no model run needed;
- a ``ppl/<data>`` row per ``data`` source: the rolling-window loss of :mod:`trilm.eval.ppl` (perplexity and
  bits per byte in extra columns);
- lm-eval results (``tasks``), as extra columns ``lm_eval/<task>/<metric>`` of the checkpoint's first row.

Bits per parameter come from :mod:`trilm.bits` (value bits; ``stored_bits_per_param`` as an extra column
for packed snapshots). A QuantLM's row belongs to its own family (``quantlm-<method>[-<bits>]``) and run
(its directory name), so it never collides with the float model it came from. Checkpoints whose rows are
all in the table already are skipped without being loaded, so rerunning after more training adds only the
new ones.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from tqdm import tqdm

from trilm.bits import bits_per_param, stored_linear_bits
from trilm.config import Config, ConfigError, require
from trilm.data.sampler import ValidationSet
from trilm.data.shards import TokenShards
from trilm.eval.harness import metrics, run_lm_eval, task_manager
from trilm.eval.model import load_eval_model
from trilm.eval.ppl import evaluate_perplexity
from trilm.families import snapshot_linear_bits
from trilm.infer import load_inference_model
from trilm.model.flops import parameter_counts
from trilm.scaling.table import ResultRow, TableError, append_rows, read_table
from trilm.store.discovery import Checkpoint, discover

TASKS_COLUMN = "lm_eval_tasks"


@dataclasses.dataclass
class SuiteEvalConfig(Config):
    """What to evaluate per checkpoint (the recorded validation loss is always taken when there is one)."""

    data: list[str] = dataclasses.field(default_factory=list)
    """Perplexity sources (prepared split, SlimPajama folder, .jsonl, .txt); one ``ppl/<name>`` row each."""
    seq_len: int = 0
    """Window length for perplexity (0: the model's context)."""
    stride: int = 0
    """New tokens per window (0: seq_len, disjoint windows)."""
    max_tokens: int = 0
    """Evaluate only the first tokens of each source (0: all)."""
    tasks: list[str] = dataclasses.field(default_factory=list)
    """lm-eval tasks (e.g. ``trilm_local``); metrics become extra columns."""
    limit: float = 0.0
    """lm-eval examples per task (0: all)."""
    batch_size: int = 8
    device: str = "cpu"
    recorded: bool = True
    """Write the ``val_loss`` row recorded in the snapshot's meta."""
    # The field shadows Config.replace() on this class (kept: it is the --replace option's name).
    replace: bool = False  # type: ignore[assignment]
    """Re-evaluate checkpoints already in the table and overwrite their rows."""
    progress: bool = True

    def validate(self) -> None:
        for key in ("seq_len", "stride", "max_tokens", "batch_size"):
            require(getattr(self, key) >= 0, f"{key}: must be ≥ 0, got {getattr(self, key)}")
        require(self.batch_size > 0, "batch_size: must be > 0")
        require(self.limit >= 0, f"limit: must be ≥ 0, got {self.limit}")


def _row(ck: Checkpoint, eval_name: str, loss: float, extra: dict[str, Any]) -> ResultRow:

    counts = parameter_counts(ck.cfg)
    meta = ck.meta
    params = int(meta.params or counts.total)
    linear = int(meta.linear_params or counts.linear)
    value_bits, stored_bits = snapshot_linear_bits({**meta.to_dict(), "family": ck.family})
    if stored_bits is None and ck.model.stored_packed:
        layers = ck.model.weights.packed_layers()
        stored_bits = stored_linear_bits(layers) if layers else None
    if value_bits is None:
        value_bits = stored_bits if stored_bits is not None else 16.0
    if stored_bits is not None:
        extra = {**extra, "stored_bits_per_param": bits_per_param(params, linear, stored_bits)}
    branch = meta.extra.get("branch")
    if isinstance(branch, dict) and branch.get("parent"):
        extra = {**extra, "parent": branch["parent"], "branch_step": branch.get("step")}
    return ResultRow(
        run=ck.run,
        family=ck.family,
        size=str(meta.size or ck.cfg.name),
        params=params,
        nonembedding_params=int(meta.nonembedding_params or counts.nonembedding),
        linear_params=linear,
        tokens=float(meta.tokens or 0),
        flops=float(meta.flops or 0),
        bits_per_param=bits_per_param(params, linear, value_bits),
        step=ck.step,
        eval=eval_name,
        loss=float(loss),
        extra={k: "" if v is None else str(v) for k, v in extra.items()},
    )


def _data_name(source: str) -> str:
    path = Path(source)
    return path.stem if path.suffix else path.name


def evaluate_checkpoint(ck: Checkpoint, evals: SuiteEvalConfig) -> list[ResultRow]:
    """The rows of one checkpoint (loads the model only when a perplexity or lm-eval run is asked for)."""
    rows: list[ResultRow] = []
    val = ck.meta.val_loss
    if evals.recorded and val is not None:
        rows.append(_row(ck, "val_loss", val, {}))
    if evals.data or evals.tasks:
        em = load_eval_model(ck.model, device=evals.device)
        for source in evals.data:
            result = evaluate_perplexity(
                em,
                source,
                seq_len=evals.seq_len or None,
                stride=evals.stride or None,
                max_tokens=evals.max_tokens or None,
                batch_size=evals.batch_size,
            )
            extra = {
                "ppl": result.ppl,
                "bits_per_byte": result.bits_per_byte,
                "eval_tokens": result.tokens,
                "seq_len": result.seq_len,
                "stride": result.stride,
            }
            rows.append(_row(ck, f"ppl/{_data_name(source)}", result.loss, extra))
        if evals.tasks:
            results = run_lm_eval(em, evals.tasks, limit=evals.limit or None, batch_size=evals.batch_size)
            columns: dict[str, float | str] = {f"lm_eval/{k}": v for k, v in metrics(results).items()}
            columns[TASKS_COLUMN] = ",".join(evals.tasks)
            if not rows:
                raise ConfigError(
                    f"{ck.path}: lm-eval results need a row to go on: the snapshot records no val_loss; "
                    "add --data SOURCE for a perplexity row"
                )
            first = rows[0]
            rows[0] = dataclasses.replace(
                first, extra={**first.extra, **{k: str(v) for k, v in columns.items()}}
            )
        del em
    return rows


def _expected_evals(ck: Checkpoint, evals: SuiteEvalConfig) -> list[str]:
    names = ["val_loss"] if evals.recorded and ck.meta.val_loss is not None else []
    return names + [f"ppl/{_data_name(s)}" for s in evals.data]


def _is_done(ck: Checkpoint, evals: SuiteEvalConfig, present: dict[tuple[str, int, str], ResultRow]) -> bool:
    names = _expected_evals(ck, evals)
    if not names or any((ck.run, ck.step, n) not in present for n in names):
        return False
    if not evals.tasks:
        return True
    done = present[(ck.run, ck.step, names[0])].extra.get(TASKS_COLUMN, "").split(",")
    return all(t in done for t in evals.tasks)


def write_rows(table: str | Path, rows: list[ResultRow], *, replace: bool = False) -> tuple[int, int]:
    """Add rows to the table; a row equal to one there except for new extra columns is merged into it.

    That is how lm-eval columns join a checkpoint's recorded-loss row written earlier. A row whose table
    values differ is refused (naming it) unless ``replace``.
    """
    path = Path(table)
    existing = {r.key: r for r in read_table(path)} if path.is_file() else {}
    merged = []
    for row in rows:
        old = existing.get(row.key)
        if old is not None and not replace:
            if not dataclasses.replace(row, extra=old.extra).same_values(old):
                raise TableError(
                    f"{path}: run {row.run!r} step {row.step} eval {row.eval!r} is already present with "
                    "different values (evaluate with replace to overwrite)"
                )
            row = dataclasses.replace(row, extra={**old.extra, **row.extra})
        merged.append(row)
    return append_rows(path, merged, replace=True)


def evaluate_suite(
    paths: Sequence[str | Path],
    table: str | Path | None = None,
    evals: SuiteEvalConfig | None = None,
) -> list[ResultRow]:
    """Evaluate every checkpoint under ``paths``; add the rows to ``table`` when one is given.

    Returns this call's rows. Checkpoints whose rows (and requested lm-eval tasks) are in the table already
    are skipped unless ``evals.replace``. When models are run, each checkpoint's rows are written as soon as
    it is done, so an interrupted evaluation keeps what it finished.
    """
    evals = evals or SuiteEvalConfig()
    if evals.tasks:
        task_manager(evals.tasks)  # unknown task names fail before any checkpoint is evaluated
    checkpoints = discover(paths)
    if not checkpoints:
        raise ConfigError(
            f"{', '.join(map(str, paths))}: no complete checkpoint to evaluate (a snapshot without its "
            "COMPLETE marker is unfinished)"
        )
    present: dict[tuple[str, int, str], ResultRow] = {}
    if table is not None and Path(table).is_file() and not evals.replace:
        present = {r.key: r for r in read_table(table)}
    todo = [ck for ck in checkpoints if not _is_done(ck, evals, present)]
    compute = bool(evals.data or evals.tasks)
    if table is not None and compute and evals.recorded:  # the cheap rows first: the table is whole at once
        recorded = [_row(ck, "val_loss", ck.meta.val_loss, {}) for ck in todo if ck.meta.val_loss is not None]
        if recorded:
            write_rows(table, recorded, replace=evals.replace)
    rows: list[ResultRow] = []
    bar = None
    if evals.progress and compute and len(todo) > 1:
        bar = tqdm(total=len(todo), unit="checkpoint", desc="eval suite")
    for ck in todo:
        ck_rows = evaluate_checkpoint(ck, evals)
        rows += ck_rows
        if table is not None and compute and ck_rows:
            write_rows(table, ck_rows, replace=evals.replace)
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    if table is not None and not compute and rows:
        write_rows(table, rows, replace=evals.replace)
    return rows


# -- compatible entry points -------------------------------------------------------------------------------
def suite_rows(run_dir: str | Path, eval_name: str = "val_loss") -> list[ResultRow]:
    """The recorded-loss rows of one run (one per complete snapshot with a ``val_loss``)."""
    rows = evaluate_suite([run_dir], None, SuiteEvalConfig(progress=False))
    return [dataclasses.replace(r, eval=eval_name) for r in rows]


def write_suite_table(run_dirs: Sequence[str | Path], table: str | Path) -> tuple[int, int]:
    """Add the recorded-loss rows of every run to ``table``; returns (added, skipped as already present)."""
    rows = evaluate_suite(run_dirs, None, SuiteEvalConfig(progress=False))
    return write_rows(table, rows)


@torch.no_grad()
def evaluate_snapshot(
    snapshot: str | Path, split_dir: str | Path, seq_len: int, batch_size: int = 8, max_sequences: int = 0
) -> float:
    """Mean next-token loss (nats) over a prepared split's fixed validation sequences, as the trainer
    measures it (the same sequences, the same mean), with the lean inference model."""

    model = load_inference_model(snapshot)
    valid = ValidationSet(TokenShards.open(split_dir), seq_len, max_sequences)
    total, count = 0.0, 0
    for batch in valid.batches(batch_size):
        logits = model(batch[:, :-1]).float()
        loss = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten(), reduction="sum")
        total += float(loss.double())
        count += batch[:, 1:].numel()
    return total / count
