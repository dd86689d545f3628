"""Structured pruning: policy-gradient mask search (forward passes only) and metric baselines.

::

    from trilm.prune import PruneConfig, prune
    prune(PruneConfig(model="runs/…/step-384", method="pg", granularity="channel", keep=0.8,
                      calib="data/train", out="pruned/"))

The result is an ordinary snapshot with per-layer shapes (``layer_kv_heads`` / ``layer_ffn``) and
``meta.extra["pruning"]``; it loads with ``trilm.infer.load_inference_model`` and
``trilm.train.models.load_model``.
See docs/pruning.md.
"""

from trilm.prune.estimator import MovingBaseline, pg_gradient, project_to_budget
from trilm.prune.masks import UnitMasks
from trilm.prune.metrics import METRICS, CalibrationStats, collect_stats, unit_scores
from trilm.prune.run import METHODS, PruneConfig, PruneReport, prune
from trilm.prune.search import PGConfig, SearchResult, WindowSampler, pg_search
from trilm.prune.slicing import select_units, slice_model
from trilm.prune.units import GRANULARITIES, UnitGroup, kept_count, unit_group

__all__ = [
    "GRANULARITIES",
    "METHODS",
    "METRICS",
    "CalibrationStats",
    "MovingBaseline",
    "PGConfig",
    "PruneConfig",
    "PruneReport",
    "SearchResult",
    "UnitGroup",
    "UnitMasks",
    "WindowSampler",
    "collect_stats",
    "kept_count",
    "pg_gradient",
    "pg_search",
    "project_to_budget",
    "prune",
    "select_units",
    "slice_model",
    "unit_group",
    "unit_scores",
]
