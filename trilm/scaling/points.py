"""Results tables as the data of a size law: one point per run (its last checkpoint), per family.

A size law is fitted on where runs *ended*: the last checkpoint of each run (a cooldown branch is a run of
its own) for one evaluation. Its bootstrap resamples lineages — a run with its cooldown branches, which share
their training before each branch point — so the interval counts how much the law depends on which runs
were made. The bits per weight ``P`` of the precision law are the family's linear-layer bits
(:func:`trilm.families.family_linear_bits`).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from trilm.families import family_linear_bits
from trilm.scaling.errors import FitError
from trilm.scaling.table import ResultRow


def choose_eval(rows: list[ResultRow], wanted: str = "") -> str:
    """The evaluation to fit: ``wanted``, else ``val_loss``, else the only one the rows hold."""
    names = sorted({r.eval for r in rows})
    if wanted:
        if wanted not in names:
            raise FitError(f"no rows with eval {wanted!r}; the tables have {', '.join(names) or 'no rows'}")
        return wanted
    if "val_loss" in names:
        return "val_loss"
    if len(names) == 1:
        return names[0]
    raise FitError(f"the tables hold several evaluations ({', '.join(names)}); choose one with --eval")


def final_rows(rows: list[ResultRow], eval_name: str) -> list[ResultRow]:
    """The last checkpoint of every run for ``eval_name``, in table order of first appearance."""
    last: dict[str, ResultRow] = {}
    for r in rows:
        if r.eval == eval_name and (r.run not in last or r.step >= last[r.run].step):
            last[r.run] = r
    return list(last.values())


def lineage(row: ResultRow) -> str:
    """A run and its cooldown branches form one lineage (their ``parent`` column names the run)."""
    return row.extra.get("parent", "") or row.run


def size_data(rows: list[ResultRow], x: str = "params") -> dict[str, Any]:
    """``{"N", "D", "P", "loss", "unit"}`` of the rows: N the ``x`` column, D tokens, P linear bits."""
    bits = []
    for r in rows:
        p = family_linear_bits(r.family)
        if p is None:
            raise FitError(f"{r.source or r.run}: family {r.family!r} has no known bits per weight for P")
        bits.append(p)
    return {
        "N": np.array([float(getattr(r, x)) for r in rows]),
        "D": np.array([r.tokens for r in rows], float),
        "P": np.array(bits, float),
        "loss": np.array([r.loss for r in rows], float),
        "unit": [lineage(r) for r in rows],
    }


def by_family(rows: list[ResultRow]) -> dict[str, list[ResultRow]]:
    out: dict[str, list[ResultRow]] = defaultdict(list)
    for r in rows:
        out[r.family].append(r)
    return dict(out)


__all__ = ["by_family", "choose_eval", "final_rows", "lineage", "size_data"]
