"""What a snapshot is, as data: its typed metadata and the canonical tensors a config implies.

The files themselves (``config.json``, ``model.safetensors``, ``packed.safetensors``, ``COMPLETE``) are read
and written by :mod:`trilm.store`; this module stays below it so that the model, inference and post-hoc
code can describe a snapshot without depending on where it lives.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from trilm.model.config import ModelConfig
from trilm.model.flops import parameter_counts


@dataclasses.dataclass
class SnapshotMeta:
    """What a snapshot records about how it was made; every reader goes through this one type.

    Training fills the counts and losses; ``size`` is the family-free size name (``tiny``, ``1.1b``) so that
    rows of TriLM, FloatLM and BiLM of one size pair in the results table. Post-hoc methods and pruning
    describe themselves under ``extra`` (``extra["quant"]``, ``extra["pruning"]``); keys this class does not
    know are kept in ``extra`` too, so reading and writing a snapshot loses nothing.
    """

    step: int | None = None
    tokens: int | None = None
    samples: int | None = None
    run: str | None = None
    family: str | None = None
    size: str | None = None
    params: int | None = None
    nonembedding_params: int | None = None
    linear_params: int | None = None
    scale_partitions: int | None = None
    flops: float | None = None
    tokenizer_hash: str | None = None
    train_loss: float | None = None
    val_loss: float | None = None
    imported_from: str | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> SnapshotMeta:
        data = dict(data or {})
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        extra = dict(data.pop("extra", None) or {})
        known = {k: data.pop(k) for k in list(data) if k in names}
        extra.update(data)
        meta = cls(**known, extra=extra)
        if meta.family and meta.size and meta.size.startswith(f"{meta.family}-"):
            meta.size = meta.size[len(meta.family) + 1 :]  # older snapshots name sizes with the family
        return meta

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
        out = {k: v for k, v in out.items() if v is not None}
        if self.extra:
            out["extra"] = self.extra
        return out


def model_meta(cfg: ModelConfig, *, tp: int = 1, **fields: Any) -> SnapshotMeta:
    """The metadata of a whole model of config ``cfg``, as every writer of one fills it.

    What the config implies is filled here: the family, the family-free size name, the parameter counts
    and the scale partitions of a build at TP=``tp``. ``fields`` gives the rest (step, tokens, run,
    losses, ``extra``...) and may override any of those.
    """
    counts = parameter_counts(cfg)
    implied: dict[str, Any] = {
        "family": cfg.family,
        "size": cfg.size_name,
        "params": counts.total,
        "nonembedding_params": counts.nonembedding,
        "linear_params": counts.linear,
        "scale_partitions": cfg.scale_partitions(tp),
    }
    return SnapshotMeta(**{**implied, **fields})
