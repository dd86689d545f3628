"""What an analysis holds: its configuration, each fit with the points it was made on, and the report.

Kept apart from :mod:`trilm.scaling.analyse` (which computes them) so the plot and report writers depend on
these types only, not on the analysis code.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Literal

import numpy as np

from trilm.config import Config, require
from trilm.scaling.fitter import HUBER_DELTA, Fit
from trilm.scaling.table import ResultRow, family_kind


@dataclasses.dataclass
class AnalysisConfig(Config):
    """What to fit and how; ``trilm scaling fit`` maps its flags onto these fields."""

    form: Literal["auto", "N", "D", "ND"] = "auto"
    eval: str = ""
    """evaluation to analyse; empty: ``val_loss`` if present, else the only one in the table"""
    x: Literal["params", "nonembedding_params"] = "params"
    bootstrap: int = 1000
    seed: int = 0
    level: float = 0.95
    reference: str = ""
    """family the others are compared with; empty: ``floatlm`` if present, else the first family"""
    families: list[str] = dataclasses.field(default_factory=list)
    nd_points: Literal["final", "all"] = "final"
    d_from: float = 0.0
    """L(D) along a run uses its checkpoints from this fraction of the run's tokens on. Warm-up is not a
    power law in D (the rate is still rising), so ``trilm suite analyse`` sets it to the end of its runs'
    warm-up; 0 = every checkpoint with D > 0."""
    loso: bool = True
    plots: bool = True
    delta: float = HUBER_DELTA

    def validate(self) -> None:
        require(self.bootstrap >= 0, f"bootstrap: must be ≥ 0, got {self.bootstrap}")
        require(0 < self.level < 1, f"level: must be in (0, 1), got {self.level}")
        require(self.delta > 0, f"delta: must be > 0, got {self.delta}")
        require(0 <= self.d_from < 1, f"d_from: must be a fraction in [0, 1), got {self.d_from}")


@dataclasses.dataclass
class FittedPoints:
    """A :class:`~trilm.scaling.fitter.Fit` with the points it was made on: their inputs, losses and labels
    (the size or checkpoint of each, which the report names), and the fit's leave-one-size-out refits.

    The fit itself (parameters, bootstrap refits, intervals, whether it is identified and why not) is
    ``fit``; this holds only what the fit does not: which table rows it saw."""

    fit: Fit
    inputs: dict[str, np.ndarray]
    loss: np.ndarray
    labels: list[str]
    loso: list[dict[str, Any]] | None = None

    @property
    def label(self) -> str:
        return self.fit.label

    @property
    def identified(self) -> bool:
        return self.fit.identified

    @property
    def because(self) -> str:
        """Why the fit is not identified, one string (empty when it is)."""
        return "; ".join(self.fit.reasons)

    @property
    def data(self) -> dict[str, np.ndarray]:
        """The fitter's data: the inputs and ``loss``."""
        return {**self.inputs, "loss": self.loss}

    def to_dict(self) -> dict[str, Any]:
        out = self.fit.to_dict()
        out["log_residuals"] = [float(v) for v in self.fit.log_residuals]
        out["param_se"] = {
            k: float(np.std(v, ddof=1)) if v.size > 1 and np.isfinite(v).all() else None
            for k, v in self.fit.boot_params().items()
        }
        out["points"] = [
            {"label": lab, **{k: float(v[i]) for k, v in self.inputs.items()}, "loss": float(self.loss[i])}
            for i, lab in enumerate(self.labels)
        ]
        if self.loso is not None:
            out["leave_one_size_out"] = self.loso
        return out


@dataclasses.dataclass
class FamilyAnalysis:
    family: str
    finals: list[ResultRow]
    law_x: FittedPoints | None = None
    law_bits: FittedPoints | None = None
    law_nd: FittedPoints | None = None
    branch_finals: list[ResultRow] = dataclasses.field(default_factory=list)
    """Final checkpoints of cooldown branches (one per branch): points of L(N, D), not of L(N)."""
    envelope: Any = None
    """Approach 1 (:mod:`trilm.scaling.envelope`) over the cooled points, when two sizes have curves."""

    def cooled(self) -> list[ResultRow]:
        """Every cooled-down checkpoint: the runs' finals and their branches' finals."""
        return [*self.finals, *self.branch_finals]


@dataclasses.dataclass
class Report:
    """Everything ``analyse`` computed; ``to_dict()`` is what ``fit.json`` holds."""

    config: AnalysisConfig
    tables: list[str]
    eval_name: str
    n_rows: int
    families: dict[str, FamilyAnalysis]
    runs: dict[str, list[ResultRow]]
    run_fits: dict[str, FittedPoints]
    comparisons: list[dict[str, Any]]
    notes: list[str]
    files: dict[str, str] = dataclasses.field(default_factory=dict)
    events: dict[str, list[dict[str, Any]]] = dataclasses.field(default_factory=dict)
    """Per run, its schedule's events (``{"name", "step", "tokens"}``) when the caller knows them (``trilm
    suite analyse`` does); the training-curve plot marks them."""

    def to_dict(self) -> dict[str, Any]:
        fams = {}
        for name, fa in self.families.items():
            fams[name] = {
                "kind": family_kind(name),
                "final_checkpoints": [r.to_record() for r in fa.finals],
                "branch_final_checkpoints": [r.to_record() for r in fa.branch_finals],
                "L(x)": fa.law_x.to_dict() if fa.law_x else None,
                "L(bits)": fa.law_bits.to_dict() if fa.law_bits else None,
                "L(N,D)": fa.law_nd.to_dict() if fa.law_nd else None,
                "envelope": fa.envelope.to_dict() if fa.envelope is not None else None,
            }
        return _jsonable(
            {
                "config": self.config.to_dict(),
                "tables": self.tables,
                "eval": self.eval_name,
                "n_rows": self.n_rows,
                "x_axis": self.config.x,
                "families": fams,
                "runs_L(D)": {run: fit.to_dict() for run, fit in self.run_fits.items()},
                "comparisons": self.comparisons,
                "notes": self.notes,
                "events": self.events,
                "files": self.files,
            }
        )


def _jsonable(value: Any) -> Any:
    """Plain JSON: NaN becomes null, ±inf the strings "inf"/"-inf", numpy scalars Python numbers."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return [_jsonable(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value
