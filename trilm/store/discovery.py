"""Checkpoints under run directories, exported suites, snapshots or HF folders, and finished step folders.

``trilm export suite`` and ``trilm eval suite`` take the same inputs and must see the same checkpoints, in the
same order, with the same identity (run, step, family): this module is that one definition. An exported suite
is read through its index (``suite_index.json``, written by :mod:`trilm.export.suite`), so evaluating an
export finds exactly the checkpoints the export wrote. Every checkpoint is a
:class:`~trilm.store.open.ModelDir` opened by :func:`~trilm.store.open.open_model`: its weights are read
(and verified) only when used.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trilm.store.errors import StoreError
from trilm.store.integrity import complete_steps
from trilm.store.layout import CONFIG_FILE, SNAPSHOTS_DIR, SUITE_INDEX
from trilm.store.open import open_model


@dataclasses.dataclass
class Checkpoint:
    """One model of a suite: the opened directory, its step and the identity of its results-table rows."""

    model: Any
    """The :class:`~trilm.store.open.ModelDir`."""
    step: int

    @property
    def path(self) -> Path:
        return self.model.given

    @property
    def meta(self):
        return self.model.meta

    @property
    def cfg(self):
        return self.model.config

    @property
    def quant(self) -> dict[str, Any]:
        quant = self.meta.extra.get("quant")
        return quant if isinstance(quant, dict) else {}

    @property
    def run(self) -> str:
        if self.quant:
            return self.path.name
        run_dir = self.model.run_dir
        return str(self.meta.run or (run_dir.name if run_dir is not None else self.path.name))

    @property
    def family(self) -> str:
        if not self.quant:
            return str(self.meta.family or self.cfg.family)
        method = str(self.quant.get("method") or "posthoc").lower()
        options = self.quant.get("options") if isinstance(self.quant.get("options"), dict) else {}
        bits = options.get("bits") if options else None
        return f"quantlm-{method}" + (f"-{bits}" if bits is not None else "")


def load_checkpoint(path: Path, step: int | None = None) -> Checkpoint:

    model = open_model(path)
    return Checkpoint(model, int(step if step is not None else model.meta.step or 0))


def _suite_index(path: Path) -> list[dict[str, Any]]:
    index_path = path / SUITE_INDEX
    try:
        index = json.loads(index_path.read_text())
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise StoreError(f"{index_path}: unreadable suite index ({exc})") from None
    entries = index.get("checkpoints") if isinstance(index, dict) else None
    if not isinstance(entries, list):
        raise StoreError(f"{index_path}: no 'checkpoints' list")
    return entries


def discover(paths: Sequence[str | Path]) -> list[Checkpoint]:
    """Checkpoints under run directories, exported suites, snapshots or HF directories, in order given."""
    found: list[Checkpoint] = []
    for raw in paths:
        path = Path(raw)
        if (path / SNAPSHOTS_DIR).is_dir() and not (path / CONFIG_FILE).is_file():
            found += [load_checkpoint(p, step) for step, p in complete_steps(path / SNAPSHOTS_DIR)]
        elif (path / SUITE_INDEX).is_file():
            for entry in _suite_index(path):
                latent = (entry.get("paths") or {}).get("latent") if isinstance(entry, dict) else None
                if latent:
                    found.append(load_checkpoint(path / latent, entry.get("step")))
        elif path.is_dir():  # one model; anything else is refused by open_model, naming what it expected
            found.append(load_checkpoint(path))
        else:
            raise StoreError(
                f"{path}: not a run directory ({SNAPSHOTS_DIR}/), an exported suite ({SUITE_INDEX}), a "
                "snapshot or a Hugging Face directory"
            )
    return found
