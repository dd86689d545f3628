"""Checkpoints to export or evaluate, found under run directories, exported suites, snapshots or HF folders.

``trilm export suite`` and ``trilm eval suite`` take the same inputs and must see the same checkpoints, in the
same order, with the same identity (run, step, family): this module is that one definition. An exported suite
is read through its index (:data:`SUITE_INDEX`, written by :mod:`trilm.export.suite`), so evaluating an export
finds exactly the checkpoints the export wrote.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trilm.config import ConfigError

SUITE_INDEX = "suite_index.json"


@dataclasses.dataclass
class Checkpoint:
    """One model to evaluate: where it is, its config and meta (a plain dict) and the row identity."""

    path: Path
    step: int
    meta: dict[str, Any]
    cfg: Any

    @property
    def quant(self) -> dict[str, Any]:
        quant = (self.meta.get("extra") or {}).get("quant")
        return quant if isinstance(quant, dict) else {}

    @property
    def run(self) -> str:
        if self.quant:
            return self.path.name
        in_run = self.path.parent.name == "snapshots"
        return str(self.meta.get("run") or (self.path.parent.parent.name if in_run else self.path.name))

    @property
    def family(self) -> str:
        if not self.quant:
            return str(self.meta.get("family") or self.cfg.family)
        method = str(self.quant.get("method") or "posthoc").lower()
        options = self.quant.get("options") if isinstance(self.quant.get("options"), dict) else {}
        bits = options.get("bits") if options else None
        return f"quantlm-{method}" + (f"-{bits}" if bits is not None else "")


def load_checkpoint(path: Path, step: int | None = None) -> Checkpoint:
    from trilm.model.snapshot import is_snapshot, read_snapshot

    if is_snapshot(path):
        cfg, meta = read_snapshot(path)
        data = meta.to_dict()
    else:
        from trilm.model.hf import model_config_from_hf, read_hf_config

        cfg = model_config_from_hf(read_hf_config(path), path=str(path / "config.json"))
        data = {"family": cfg.family, "size": cfg.name, "run": path.name}
        marker = path / "trilm_export.json"
        if marker.is_file():
            data.update({k: v for k, v in json.loads(marker.read_text()).items() if v is not None})
    return Checkpoint(path, int(step if step is not None else data.get("step") or 0), data, cfg)


def discover(paths: Sequence[str | Path]) -> list[Checkpoint]:
    """Checkpoints under run directories, exported suites, snapshots or HF directories, in order given."""
    from trilm.train.checkpoint import complete_steps

    found: list[Checkpoint] = []
    for raw in paths:
        path = Path(raw)
        if (path / "snapshots").is_dir():
            found += [load_checkpoint(p, step) for step, p in complete_steps(path / "snapshots")]
        elif (path / SUITE_INDEX).is_file():
            index = json.loads((path / SUITE_INDEX).read_text())
            for entry in index.get("checkpoints", []):
                latent = entry.get("paths", {}).get("latent")
                if latent:
                    found.append(load_checkpoint(path / latent, entry.get("step")))
        elif (path / "config.json").is_file():
            found.append(load_checkpoint(path))
        else:
            raise ConfigError(
                f"{path}: not a run directory (snapshots/), an exported suite ({SUITE_INDEX}), a snapshot "
                "or a Hugging Face directory"
            )
    return found
