"""The ladder's final loss per (family, size) as package data: ``configs/reference/ladder-finals.json``.

    make reference-data                    # the build step (runs python -m experiments.ladder.finals)

``trilm quickstart`` compares the family ordering at each of its sizes with the ladder's (same corpus and
tokenizer, four times the tokens, each run at its best rate). A wheel has no ``docs/``, so the numbers travel
as package data; this script writes them from ``analysis/results.csv`` (the best-rate runs ``report.py``
analysed), so they are never typed by hand.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.common import CHECKOUT

HERE = CHECKOUT / "docs" / "results" / "ladder"
OUT = CHECKOUT / "configs" / "reference" / "ladder-finals.json"


def finals(table: Path) -> dict:
    from trilm.scaling.table import read_table

    last = {}
    for row in read_table(table):
        if row.run not in last or row.step > last[row.run].step:
            last[row.run] = row
    out: dict[str, dict] = {}
    for run, row in sorted(last.items()):
        rate = run.rsplit("-lr", 1)[1] if "-lr" in run else None
        out.setdefault(row.size, {})[row.family] = {
            "loss": round(row.loss, 4),
            "tokens": int(row.tokens),
            "lr": float(rate) if rate else None,
        }
    return out


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    data = {
        "source": "docs/results/ladder/analysis/results.csv "
        "(make reference-data: experiments/ladder/finals.py)",
        "what": "final validation loss (nats/token) of the CPU ladder's best-rate run per family and size",
        "sizes": finals(HERE / "analysis" / "results.csv"),
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
