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

A checkpoint is written under ``.tmp-step-<N>`` and renamed into place; a rerun skips every checkpoint with
its ``COMPLETE`` marker, so exporting a run again after more training adds only the new checkpoints. The
index is rebuilt from the finished checkpoints at the end of every run.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Any

from trilm.config import Config, ConfigError, require, require_directory_path
from trilm.export.checkpoints import SUITE_INDEX, discover
from trilm.export.common import open_snapshot

INDEX_CSV = "suite_index.csv"
ENTRY = "checkpoint.json"


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
    from trilm.scaling.table import read_table

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
    from trilm.export.gguf import export_snapshot_gguf

    folder.mkdir()
    wanted = ["f16"] if src.cfg.family == "floatlm" else ["tq2_0", "tq1_0"]
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


def export_checkpoint(ck, target: Path, cfg: SuiteExportConfig) -> dict[str, Any]:
    """Write one checkpoint's directory (atomically) and return its index entry."""
    from trilm.export.card import write_model_card
    from trilm.export.hf import export_snapshot_hf
    from trilm.export.packed import export_snapshot_packed

    src = open_snapshot(ck.path, require_tokenizer=True)
    tmp = target.parent / f".tmp-{target.name}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    paths: dict[str, Any] = {}
    notes: dict[str, str] = {}
    try:
        latent = tmp / "latent"
        shutil.copytree(ck.path, latent)
        if not (latent / "tokenizer.model").is_file():
            shutil.copyfile(src.tokenizer.path, latent / "tokenizer.model")
        paths["latent"] = "latent"
        export_snapshot_hf(ck.path, tmp / "hf", dtype=cfg.hf_dtype, src=src)
        paths["hf"] = "hf"
        if cfg.packed:
            if src.cfg.family == "floatlm" and not (ck.path / "packed.safetensors").is_file():
                notes["packed"] = "a FloatLM has no ternary/binary codes to pack"
            else:
                export_snapshot_packed(ck.path, tmp / "packed", src=src)
                paths["packed"] = "packed"
        if cfg.gguf:
            written, refused = _gguf(src, tmp / "gguf")
            paths["gguf"] = {k: f"gguf/{v}" for k, v in written.items()}
            notes.update({f"gguf {k}": v for k, v in refused.items()})
        meta = src.meta
        rel = Path(ck.run) / target.name
        entry = {
            "family": ck.family,
            "size": meta.get("size") or ck.cfg.name,
            "run": ck.run,
            "step": ck.step,
            "tokens": meta.get("tokens"),
            "train_loss": meta.get("train_loss"),
            "val_loss": meta.get("val_loss"),
            "params": meta.get("params"),
            "source": str(ck.path.resolve()),
            "paths": {
                k: (str(rel / v) if isinstance(v, str) else {q: str(rel / f) for q, f in v.items()})
                for k, v in paths.items()
            },
            "bytes": {k: _bytes(tmp / k) for k in paths},
            "notes": notes,
        }
        files = {k: str(v) for k, v in paths.items()}
        write_model_card(tmp, src, files=files, evals=_evals(cfg.table, ck.run, ck.step))
        (tmp / ENTRY).write_text(json.dumps(entry, indent=2) + "\n")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if target.exists():
        shutil.rmtree(target)
    os.replace(tmp, target)
    (target / "COMPLETE").write_text(json.dumps({"step": ck.step}))
    return entry


def read_index(out: str | Path) -> list[dict[str, Any]]:
    """Entries of every finished checkpoint under a suite directory, by family, size, run and step."""
    out = Path(out)
    entries = []
    for marker in sorted(out.glob(f"*/step-*/{ENTRY}")):
        if (marker.parent / "COMPLETE").is_file():
            entries.append(json.loads(marker.read_text()))
    return sorted(entries, key=lambda e: (e["family"], str(e["size"]), e["run"], e["step"]))


def write_index(out: str | Path) -> list[dict[str, Any]]:
    """Rewrite ``suite_index.json`` and ``suite_index.csv`` from the finished checkpoints."""
    out = Path(out)
    entries = read_index(out)
    payload = {"format": "trilm-suite", "version": 1, "checkpoints": entries}
    tmp = out / f".{SUITE_INDEX}.tmp"
    tmp.write_text(json.dumps(payload, indent=2) + "\n")
    os.replace(tmp, out / SUITE_INDEX)
    columns = ["family", "size", "run", "step", "tokens", "train_loss", "val_loss", "params"]
    kinds = sorted({k for e in entries for k in e["bytes"]})
    tmp = out / f".{INDEX_CSV}.tmp"
    with tmp.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh, lineterminator="\n")
        writer.writerow([*columns, *(f"path_{k}" for k in kinds), *(f"bytes_{k}" for k in kinds)])
        for e in entries:
            where = [e["paths"].get(k, "") for k in kinds]
            flat = [json.dumps(w) if isinstance(w, dict) else w for w in where]
            writer.writerow([*(e.get(c) for c in columns), *flat, *(e["bytes"].get(k, "") for k in kinds)])
    os.replace(tmp, out / INDEX_CSV)
    return entries


def export_suite(run_dirs: list[str | Path], cfg: SuiteExportConfig) -> tuple[list[dict[str, Any]], int]:
    """Export every (selected) complete checkpoint of ``run_dirs`` into ``cfg.out``.

    Returns (the suite's index entries, how many checkpoints this call wrote).
    """
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    for run in map(Path, run_dirs):
        if not (run / "snapshots").is_dir() and not (run / "config.json").is_file():
            raise ConfigError(f"{run}: not a run directory (no snapshots/) or a snapshot")
    checkpoints = [ck for ck in discover(run_dirs) if not cfg.steps or ck.step in cfg.steps]
    todo = [ck for ck in checkpoints if not (out / ck.run / f"step-{ck.step}" / "COMPLETE").is_file()]
    bar = None
    if cfg.progress and len(todo) > 1:
        from tqdm import tqdm

        bar = tqdm(total=len(todo), unit="checkpoint", desc="export suite")
    for ck in todo:
        export_checkpoint(ck, out / ck.run / f"step-{ck.step}", cfg)
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return write_index(out), len(todo)
