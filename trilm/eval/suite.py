"""A run's checkpoint suite as rows of the results table (``trilm.scaling.table``).

The trainer measures the validation loss of every snapshot on the fixed validation set and stores it in the
snapshot's ``config.json`` meta, so turning a finished run into results-table rows needs no model evaluation;
:func:`evaluate_snapshot` recomputes a snapshot's loss on any prepared split when that is wanted.
"""

from __future__ import annotations

from pathlib import Path

import torch

from trilm.model.snapshot import read_snapshot
from trilm.scaling.table import ResultRow, append_rows
from trilm.train.checkpoint import complete_steps


def suite_rows(run_dir: str | Path, eval_name: str = "val_loss") -> list[ResultRow]:
    """One row per complete snapshot of ``run_dir`` that has a recorded ``val_loss``."""
    run_dir = Path(run_dir)
    rows = []
    for step, path in complete_steps(run_dir / "snapshots"):
        _, meta = read_snapshot(path)
        if meta.val_loss is None:
            continue
        rows.append(
            ResultRow.from_counts(
                run=meta.run or run_dir.name,
                family=meta.family,
                size=meta.size,
                params=int(meta.params),
                nonembedding_params=int(meta.nonembedding_params),
                linear_params=int(meta.linear_params),
                tokens=float(meta.tokens),
                flops=float(meta.flops),
                step=step,
                eval=eval_name,
                loss=float(meta.val_loss),
            )
        )
    return rows


def write_suite_table(run_dirs: list[str | Path], table: str | Path) -> tuple[int, int]:
    """Append the rows of every run to ``table`` (CSV/JSON); returns (added, skipped as already present)."""
    rows = [row for run in run_dirs for row in suite_rows(run)]
    return append_rows(table, rows)


@torch.no_grad()
def evaluate_snapshot(
    snapshot: str | Path, split_dir: str | Path, seq_len: int, batch_size: int = 8, max_sequences: int = 0
) -> float:
    """Mean next-token loss (nats) of a snapshot over a prepared split's fixed validation sequences."""
    from trilm.data.sampler import ValidationSet
    from trilm.data.shards import TokenShards
    from trilm.model.io import load_model

    model = load_model(snapshot, tp=1).eval()
    valid = ValidationSet(TokenShards.open(split_dir), seq_len, max_sequences)
    total, count = 0.0, 0
    for batch in valid.batches(batch_size):
        loss = model(batch[:, :-1], labels=batch[:, 1:])
        total += float(loss.double().sum())
        count += loss.numel()
    return total / count
