"""Where a run's ``init_from`` snapshot is read: once, where the run starts (the trainer) or a command needs
the model (``trilm train --dry-run``, ``trilm suite launch``).

A run config is data: parsing and validating it opens no file, so a run that takes its model from its
``init_from`` snapshot holds a :class:`~trilm.train.config.ModelFromSnapshot` until
:func:`resolve_init_from` opens the snapshot, completes the model from it and checks that the run can start
from it. A snapshot of another family makes the run a conversion, whose recipe is filled in there too
(:func:`trilm.train.convert.apply_recipe`).
"""

from __future__ import annotations

from trilm.store.errors import StoreError
from trilm.store.open import ModelDir, open_model
from trilm.train.config import TrainConfig
from trilm.train.convert import apply_recipe


def open_init_from(cfg: TrainConfig) -> ModelDir | None:
    """The ``init_from`` snapshot of ``cfg`` opened (weights are read later, on first use), or None for a
    run without one; a directory that cannot be opened is an error naming ``init_from``."""
    return _opened(cfg.init_from) if cfg.init_from else None


def resolve_init_from(cfg: TrainConfig, source: ModelDir | None = None) -> TrainConfig:
    """``cfg`` with the model of its ``init_from`` snapshot (the snapshot's config with the run's model keys
    on top, where the run's model section is partial), checked against that snapshot: a packed snapshot,
    or one whose tensors differ from the model, is refused naming ``init_from``. ``source`` is the snapshot
    already opened (:func:`open_init_from`: the trainer and the dry run read its weights too); without it,
    it is opened here. Where the snapshot is of another family than the run's model, the run converts it:
    ``convert.recipe`` fills in the rest, distilling from the snapshot
    (:func:`~trilm.train.convert.apply_recipe`; a snapshot does not record its rate, so ``optim.lr`` stays
    the run's). A run without ``init_from`` is returned as it is."""
    if not cfg.init_from:
        return cfg
    opened = source if source is not None else _opened(cfg.init_from)
    cfg = cfg.over_snapshot(opened)
    if opened.config.family == cfg.model.family:
        return cfg
    return apply_recipe(cfg, teacher=cfg.init_from)


def _opened(path: str) -> ModelDir:
    try:
        return open_model(path)
    except StoreError as exc:
        exc.args = (f"init_from: {exc}",)
        raise
