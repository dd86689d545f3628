"""``trilm export suite RUN_DIR… --out SUITE``: every scheduled checkpoint in every release format, indexed.

Layout (one directory per model and checkpoint, each written atomically)::

    SUITE/suite_index.json, suite_index.csv     family, size, run, step, tokens, losses, paths, bytes
    SUITE/<run>/step-<N>/latent/                the snapshot: latent weights + config + tokenizer (training
                                                can continue from it: ``init_from`` / fine-tuning)
    SUITE/<run>/step-<N>/hf/                    unpacked LlamaForCausalLM (fp16) with tokenizer files
    SUITE/<run>/step-<N>/packed/                packed snapshot (TriLM/BiLM codes + partition scales)
    SUITE/<run>/step-<N>/gguf/<type>.gguf       llama.cpp: TQ2_0/TQ1_0 where the shapes allow them exactly,
                                                else F16 (FloatLM: F16)
    SUITE/<run>/step-<N>/README.md              model card: config, tokens seen, losses, evaluations
    SUITE/<run>/step-<N>/checkpoint.json        this checkpoint's index entry; COMPLETE marks it finished

A checkpoint is written under a temporary name and renamed into place with its ``COMPLETE`` marker last
(:mod:`trilm.atomic`); a rerun skips every checkpoint with its marker, so exporting a run again after more
training adds only the new checkpoints, and a failed checkpoint leaves nothing (no empty folder either).
The index is rebuilt from the finished checkpoints at the end of every run, also one that failed half-way.
An output folder that is not empty and holds no exported suite is refused before anything is written.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from pathlib import Path
from typing import Any

from tqdm import tqdm

from trilm.atomic import atomic_directory, write_json, write_text
from trilm.config import Config, ConfigError, require, require_directory_path
from trilm.export import packed as packed_export
from trilm.export.card import write_model_card
from trilm.export.common import portable
from trilm.export.gguf import export_snapshot_gguf
from trilm.export.hf import export_snapshot_hf
from trilm.model.snapshot import SnapshotMeta
from trilm.scaling.table import read_table
from trilm.store.discovery import discover
from trilm.store.integrity import complete_marker
from trilm.store.layout import (
    COMPLETE,
    SUITE_ENTRY,
    SUITE_INDEX,
    SUITE_INDEX_CSV,
    step_dir_name,
)
from trilm.store.snapshot import write_snapshot_files

INDEX_CSV = SUITE_INDEX_CSV
ENTRY = SUITE_ENTRY


@dataclasses.dataclass
class SuiteExportConfig(Config):
    out: str = ""
    hf_dtype: str = "float16"
    packed: bool = True
    gguf: bool = True
    steps: list[int] = dataclasses.field(default_factory=list)
    """Only these steps (empty: every complete snapshot)."""
    table: str = ""
    """A results table whose rows for a checkpoint go into its model card."""
    progress: bool = True

    def validate(self) -> None:
        require(bool(self.out), "out: the suite directory is required")
        require_directory_path(self.out, "--out")
        require(self.hf_dtype in ("float16", "bfloat16", "float32"), f"hf_dtype: {self.hf_dtype!r}")


def _bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _evals(table: str, run: str, step: int) -> dict[str, float]:
    if not table:
        return {}

    out: dict[str, float] = {}
    for row in read_table(table):
        if row.run == run and row.step == step:
            out[row.eval] = row.loss
            for key, value in row.extra.items():
                if key.startswith("lm_eval/"):
                    try:
                        out[key] = float(value)
                    except ValueError:
                        continue
    return out


def _gguf(src, folder: Path) -> tuple[dict[str, str], dict[str, str]]:
    """Write the GGUF types the model allows exactly; returns (type → file name, type → why not)."""

    folder.mkdir()
    wanted = ["f16"] if src.config.family == "floatlm" else ["tq2_0", "tq1_0"]
    written, refused = {}, {}
    for qtype in wanted:
        try:
            export_snapshot_gguf(src.path, folder / f"{qtype}.gguf", qtype=qtype, src=src)
            written[qtype] = f"{qtype}.gguf"
        except ConfigError as exc:
            refused[qtype] = str(exc)
    if not written:
        export_snapshot_gguf(src.path, folder / "f16.gguf", qtype="f16", src=src)
        written["f16"] = "f16.gguf"
    return written, refused


def _latent_copy(src, folder: Path) -> None:
    """The snapshot itself, with its tokenizer, as a standalone snapshot (no machine paths in its meta)."""
    folder.mkdir()
    meta = SnapshotMeta.from_dict(portable(src.meta.to_dict()))
    tok = src.tokenizer.require(src.given)
    write_snapshot_files(
        folder, src.config, meta, src.weights.float_state(), src.weights.packed_layers(), tokenizer=tok.path
    )
    write_text(folder / COMPLETE, complete_marker({"step": src.step})(folder)[COMPLETE])


def export_checkpoint(ck, target: Path, cfg: SuiteExportConfig) -> dict[str, Any]:
    """Write one checkpoint's directory (atomically) and return its index entry."""

    src = ck.model
    src.tokenizer.require(src.given)
    paths: dict[str, Any] = {}
    notes: dict[str, str] = {}
    entry: dict[str, Any] = {}
    with atomic_directory(target, replace=True, markers=complete_marker({"step": ck.step})) as tmp:
        _latent_copy(src, tmp / "latent")
        paths["latent"] = "latent"
        export_snapshot_hf(src.path, tmp / "hf", dtype=cfg.hf_dtype, src=src)
        paths["hf"] = "hf"
        if cfg.packed:
            if src.config.family == "floatlm" and not src.stored_packed:
                notes["packed"] = "a FloatLM has no ternary/binary codes to pack"
            else:
                packed_export.export_snapshot_packed(src.path, tmp / "packed", src=src)
                paths["packed"] = "packed"
        if cfg.gguf:
            written, refused = _gguf(src, tmp / "gguf")
            paths["gguf"] = {k: f"gguf/{v}" for k, v in written.items()}
            notes.update({f"gguf {k}": v for k, v in refused.items()})
        meta = src.meta
        rel = Path(ck.run) / target.name
        entry = {
            "family": ck.family,
            "size": meta.size or ck.cfg.name,
            "run": ck.run,
            "step": ck.step,
            "tokens": meta.tokens,
            "train_loss": meta.train_loss,
            "val_loss": meta.val_loss,
            "params": meta.params,
            "source": src.label,
            "paths": {
                k: (str(rel / v) if isinstance(v, str) else {q: str(rel / f) for q, f in v.items()})
                for k, v in paths.items()
            },
            "bytes": {k: _bytes(tmp / k) for k in paths},
            "notes": portable(notes),
        }
        files = {k: str(v) for k, v in paths.items()}
        write_model_card(tmp, src, files=files, evals=_evals(cfg.table, ck.run, ck.step))
        write_json(tmp / ENTRY, entry)
    src.weights.release()
    return entry


def read_index(out: str | Path) -> list[dict[str, Any]]:
    """Entries of every finished checkpoint under a suite directory, by family, size, run and step."""
    out = Path(out)
    entries = []
    for marker in sorted(out.glob(f"*/step-*/{ENTRY}")):
        if (marker.parent / COMPLETE).is_file():
            entries.append(json.loads(marker.read_text()))
    return sorted(entries, key=lambda e: (e["family"], str(e["size"]), e["run"], e["step"]))


def write_index(out: str | Path) -> list[dict[str, Any]]:
    """Rewrite ``suite_index.json`` and ``suite_index.csv`` from the finished checkpoints."""
    out = Path(out)
    entries = read_index(out)
    write_json(out / SUITE_INDEX, {"format": "trilm-suite", "version": 1, "checkpoints": entries})
    columns = ["family", "size", "run", "step", "tokens", "train_loss", "val_loss", "params"]
    kinds = sorted({k for e in entries for k in e["bytes"]})
    text = io.StringIO(newline="")
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow([*columns, *(f"path_{k}" for k in kinds), *(f"bytes_{k}" for k in kinds)])
    for e in entries:
        where = [e["paths"].get(k, "") for k in kinds]
        flat = [json.dumps(w) if isinstance(w, dict) else w for w in where]
        writer.writerow([*(e.get(c) for c in columns), *flat, *(e["bytes"].get(k, "") for k in kinds)])
    write_text(out / INDEX_CSV, text.getvalue())
    return entries


def check_suite_output(out: Path) -> None:
    """Refuse an output folder that is not empty and holds no exported suite: nothing there is overwritten."""
    if not out.exists():
        return
    if not out.is_dir():
        raise ConfigError(f"--out {out}: exists and is not a directory")
    if any(out.iterdir()) and not (out / SUITE_INDEX).is_file() and not any(out.glob(f"*/step-*/{ENTRY}")):
        raise ConfigError(
            f"--out {out}: not empty and not an exported suite (no {SUITE_INDEX}); choose an empty or a new "
            "folder"
        )


def export_suite(run_dirs: list[str | Path], cfg: SuiteExportConfig) -> tuple[list[dict[str, Any]], int]:
    """Export every (selected) complete checkpoint of ``run_dirs`` into ``cfg.out``.

    Returns (the suite's index entries, how many checkpoints this call wrote).
    """
    out = Path(cfg.out)
    check_suite_output(out)
    checkpoints = [ck for ck in discover(run_dirs) if not cfg.steps or ck.step in cfg.steps]
    if not checkpoints:
        raise ConfigError(
            f"{', '.join(map(str, run_dirs))}: no complete checkpoint to export (a snapshot without its "
            "COMPLETE marker is unfinished)" + (f" among steps {cfg.steps}" if cfg.steps else "")
        )
    for ck in checkpoints:  # a missing tokenizer is found before anything is written
        ck.model.tokenizer.require(ck.path)
    todo = [ck for ck in checkpoints if not (out / ck.run / step_dir_name(ck.step) / COMPLETE).is_file()]
    bar = None
    if cfg.progress and len(todo) > 1:
        bar = tqdm(total=len(todo), unit="checkpoint", desc="export suite")
    try:
        for ck in todo:
            export_checkpoint(ck, out / ck.run / step_dir_name(ck.step), cfg)
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
        if any(out.glob(f"*/step-*/{ENTRY}")):
            write_index(out)
    return read_index(out), len(todo)
