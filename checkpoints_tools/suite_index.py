"""Index a run's checkpoint suite and append it to a results table.

    python checkpoints_tools/suite_index.py runs/quickstart/trilm-tiny [more runs…] --table runs/results.csv

Prints step → tokens → validation loss → snapshot path for every complete snapshot, writes
``suite_index.json`` into each run directory, and appends the snapshots' recorded-loss rows to the results
table that ``trilm scaling fit`` reads (rows already present are skipped). For the released formats of every
checkpoint use ``trilm export suite``; for perplexity and lm-eval rows, ``trilm eval suite``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trilm.atomic import write_json
from trilm.eval.suite import suite_rows, write_suite_table
from trilm.store.integrity import complete_steps
from trilm.store.snapshot import read_snapshot_config


def index_run(run_dir: Path) -> list[dict]:
    entries = []
    for step, path in complete_steps(run_dir / "snapshots"):
        meta = read_snapshot_config(path)[1]
        entries.append({"step": step, "tokens": meta.tokens, "val_loss": meta.val_loss, "path": str(path)})
    write_json(run_dir / "suite_index.json", entries)
    return entries


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories (with snapshots/)")
    parser.add_argument("--table", type=Path, default=None, help="results table to append to (CSV or JSON)")
    args = parser.parse_args()
    for run in args.runs:
        if not (run / "snapshots").is_dir():
            print(f"{run}: no snapshots/ directory (is it a trilm run directory?)", file=sys.stderr)
            return 2
        print(f"{run}:")
        for e in index_run(run):
            loss = "-" if e["val_loss"] is None else f"{e['val_loss']:.4f}"
            print(f"  step {e['step']:>7}  tokens {e['tokens']:>14,}  val loss {loss:>8}  {e['path']}")
    if args.table:
        added, skipped = write_suite_table(args.runs, args.table)
        rows = sum(len(suite_rows(r)) for r in args.runs)
        print(f"{args.table}: {added} rows added, {skipped} already present ({rows} snapshots with a loss)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
