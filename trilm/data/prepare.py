"""Tokenize once: SlimPajama files → packed token shards (one shard per input file), in worker processes.

Usage::

    trilm data prepare --input DIR --split train --tokenizer tok/tokenizer.model --out data/train --workers 8
    trilm data prepare --input hf:cerebras/SlimPajama-627B --split validation ...   # online, via datasets

or from Python: ``prepare(PrepareConfig(...))``. Rerunning the same command resumes: a shard whose sidecar
matches (same input checksum, tokenizer and settings) is kept, anything else is redone. ``index.json`` is
written last (atomically), only when every file is done; it is removed before the first shard is redone, and
a rerun that finds every shard and the index up to date leaves it untouched, so concurrent runs preparing
the same finished split never take it away from a reader.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import multiprocessing
import os
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from tqdm import tqdm

from trilm.config import Config, require, require_directory_path
from trilm.data import shards as shards_mod
from trilm.data.errors import DataError
from trilm.data.slimpajama import (
    SPLITS,
    ReadStats,
    SourceFile,
    SourceMixture,
    file_sha256,
    hub_split_files,
    read_documents,
    read_documents_datasets,
    split_files,
)
from trilm.data.tokenizer import Tokenizer

_BATCH_CHARS = 1 << 22  # encode ~4M characters at a time: amortises the call, bounds memory


@dataclasses.dataclass
class PrepareConfig(Config):
    """What to tokenize, with which tokenizer, into where."""

    input: str = ""  # SlimPajama-shaped directory, or "hf:<repo>" (e.g. hf:cerebras/SlimPajama-627B)
    split: str = "train"
    tokenizer: str = ""  # path of the .model file
    out: str = ""  # the prepared split directory
    workers: int = 1
    reader: str = "zstd"  # "zstd" (direct, exact line numbers) or "datasets" (the hub path; default for hf:)
    exclude_sources: list[str] = dataclasses.field(default_factory=list)
    include_sources: list[str] = dataclasses.field(default_factory=list)
    source_weights: dict[str, float] = dataclasses.field(default_factory=dict)
    skip_bad: bool = False
    add_bos: bool = False
    max_files: int = 0  # 0 = all files of the split
    progress: bool = True

    def validate(self) -> None:
        require(bool(self.input), "input: a SlimPajama-shaped directory or hf:<repo> is required")
        require(self.split in SPLITS, f"split: {self.split!r} is not one of {list(SPLITS)}")
        require(bool(self.tokenizer), "tokenizer: path of a .model file is required")
        require(bool(self.out), "out: output directory is required")
        require_directory_path(self.out, "out")
        require(self.workers >= 1, f"workers: must be >= 1, got {self.workers}")
        require(self.reader in ("zstd", "datasets"), f"reader: {self.reader!r} is not 'zstd' or 'datasets'")
        require(self.max_files >= 0, "max_files: must be >= 0")
        for name, w in self.source_weights.items():
            require(w >= 0, f"source_weights.{name}: must be >= 0, got {w}")
        self.mixture()  # unknown source names are refused here, before any work

    def mixture(self) -> SourceMixture:
        return SourceMixture.from_options(self.exclude_sources, self.source_weights, self.include_sources)

    def files(self) -> list[SourceFile]:
        if self.input.startswith("hf:"):
            files = hub_split_files(self.split, self.input.removeprefix("hf:"))
        else:
            files = split_files(self.input, self.split)
        return files[: self.max_files] if self.max_files else files

    def build(self) -> dict:
        return prepare(self)


@dataclasses.dataclass(frozen=True)
class _Task:
    file: SourceFile
    out: str
    tokenizer: str
    tokenizer_hash: str
    settings: dict
    reader: str


_TOKENIZER: dict[str, Tokenizer] = {}


def _tokenizer(path: str, expected_hash: str) -> Tokenizer:
    tok = _TOKENIZER.get(path)
    if tok is None or tok.hash != expected_hash:
        tok = _TOKENIZER[path] = Tokenizer.load(path, expected_hash=expected_hash)
    return tok


def _settings_key(settings: dict, tokenizer_hash: str, source_sha: str, key: str) -> str:
    """What a finished shard must have been made from to be kept on a rerun."""
    blob = json.dumps([settings, tokenizer_hash, source_sha, key], sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()


def prepare_file(task: _Task) -> dict:
    """Tokenize one input file into one shard; return its sidecar (also when an up-to-date one exists)."""
    out = Path(task.out)
    name = task.file.shard_name
    source_sha = file_sha256(task.file.path) if task.reader == "zstd" else ""
    settings_key = _settings_key(task.settings, task.tokenizer_hash, source_sha, task.file.key)
    done = shards_mod.read_finished_shard(out, name)
    if done is not None and done.get("settings_key") == settings_key:
        return {**done, "resumed": True}
    (out / shards_mod.INDEX_NAME).unlink(missing_ok=True)  # the split changes: no reader may trust it now
    cpu_start = time.process_time()
    tok = _tokenizer(task.tokenizer, task.tokenizer_hash)
    dtype = np.dtype(task.settings["dtype"])
    mixture = SourceMixture(**task.settings["mixture"])
    skip_bad = task.settings["skip_bad"]
    bos = [tok.bos_id] if task.settings["add_bos"] else []
    stats = ReadStats()
    read = read_documents if task.reader == "zstd" else read_documents_datasets
    writer = shards_mod.ShardWriter(out, name, dtype)
    texts: list[str] = []
    sources: list[str] = []
    chars = 0

    def flush() -> None:
        encoded = tok.encode_batch(texts)
        arrays = [np.asarray(bos + ids + [tok.eos_id], dtype=dtype) for ids in encoded]
        writer.add_documents(arrays, sources)
        texts.clear()
        sources.clear()

    try:
        for doc in read(task.file, skip_bad=skip_bad, stats=stats):
            for _ in range(mixture.copies(doc.source, task.file.key, doc.line)):
                texts.append(doc.text)
                sources.append(doc.source)
                chars += len(doc.text)
            if chars >= _BATCH_CHARS:
                flush()
                chars = 0
        flush()
        meta = {
            "source_file": task.file.key,
            "source_path": task.file.path,
            "source_sha256": source_sha,
            "tokenizer_hash": task.tokenizer_hash,
            "settings": task.settings,
            "settings_key": settings_key,
            "read": stats.to_dict(),
        }
        sidecar = writer.finish({**meta, "cpu_seconds": round(time.process_time() - cpu_start, 4)})
        return {**sidecar, "resumed": False}
    except BaseException:
        writer.abort()
        raise


def _run_task(task: _Task) -> dict | DataError:
    try:
        return prepare_file(task)
    except DataError as exc:  # returned, not raised: other files keep going and their work is kept
        return exc


def prepare(cfg: PrepareConfig) -> dict:
    """Prepare one split; returns the ``index.json`` content. Raises DataError naming the failing files."""
    tok = Tokenizer.load(cfg.tokenizer)
    files = cfg.files()
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    dtype = shards_mod.token_dtype(tok.vocab_size)
    settings = {
        "dtype": dtype.name,
        "add_bos": cfg.add_bos,
        "eos": True,
        "skip_bad": cfg.skip_bad,
        "mixture": cfg.mixture().to_dict(),
    }
    reader = "datasets" if cfg.input.startswith("hf:") else cfg.reader
    tasks = [_Task(f, str(out), str(tok.path), tok.hash, settings, reader) for f in files]
    results: dict[str, dict] = {}
    failures: list[str] = []
    started = time.perf_counter()
    bar = _progress(len(tasks), cfg.progress and len(tasks) > 0, f"prepare {cfg.split}")
    tokens = 0
    workers = min(cfg.workers, len(tasks)) or 1
    if workers == 1:
        outcomes: Iterator[dict | DataError] = map(_run_task, tasks)
        pool = None
    else:
        pool = multiprocessing.get_context("spawn").Pool(workers)
        outcomes = pool.imap_unordered(_run_task, tasks)
    try:
        for outcome in outcomes:
            if isinstance(outcome, DataError):
                failures.append(str(outcome))
            else:
                results[outcome["name"]] = outcome
                tokens += outcome["num_tokens"]
            if bar is not None:
                bar.set_postfix(tokens=f"{tokens:,}", refresh=False)
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
        if pool is not None:
            pool.close()
            pool.join()
    if failures:
        kept = len(results)
        raise DataError(
            f"prepare {cfg.split}: {len(failures)} file(s) failed ({kept} finished shard(s) kept; "
            "fix or --skip-bad, then rerun to resume):\n  " + "\n  ".join(failures)
        )
    ordered = [results[f.shard_name] for f in files]
    _check_sources(cfg, ordered)
    index = _index(cfg, tok, dtype, ordered, time.perf_counter() - started)
    if not _describes(out / shards_mod.INDEX_NAME, index):
        shards_mod.atomic_write_json(out / shards_mod.INDEX_NAME, index)
    return index


_RUN_FIELDS = ("seconds", "resumed_shards", "worker_cpu_seconds")  # of one run, not of the data


def _describes(path: Path, index: dict) -> bool:
    """Whether the ``index.json`` at ``path`` already describes these data. A rerun over finished data
    (every suite launch and sweep prepares its data first, often several at once) then leaves the file
    alone: it is never missing or rewritten while another process trains from the split."""
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(old, dict):
        return False
    new = json.loads(json.dumps(index))  # as it would read back (tuples become lists)
    return {k: v for k, v in old.items() if k not in _RUN_FIELDS} == {
        k: v for k, v in new.items() if k not in _RUN_FIELDS
    }


def _check_sources(cfg: PrepareConfig, shards: list[dict]) -> None:
    """Refuse a split that would be empty, or miss a source the user asked to include: a request the
    corpus cannot satisfy is an error, not a 0-token split (the shards stay, so a rerun resumes)."""
    found = {name for s in shards for name, n in s["tokens_per_source"].items() if n > 0}
    missing = [name for name in cfg.include_sources if name not in found]
    where = f"{cfg.input} (split {cfg.split}, {len(shards)} file(s))"
    if missing:
        raise DataError(
            f"--include-source {', '.join(missing)}: {where} holds no document of "
            f"{'this source' if len(missing) == 1 else 'these sources'}"
            + (f" (found: {', '.join(sorted(found))})" if found else "")
            + "; no index.json written"
        )
    if not found:
        raise DataError(f"{where}: no document is left after source filtering; no index.json written")


def _index(cfg: PrepareConfig, tok: Tokenizer, dtype: np.dtype, shards: list[dict], seconds: float) -> dict:
    tokens_per_source: dict[str, int] = {}
    docs_per_source: dict[str, int] = {}
    read = ReadStats()
    for s in shards:
        for k, v in s["tokens_per_source"].items():
            tokens_per_source[k] = tokens_per_source.get(k, 0) + v
        for k, v in s["documents_per_source"].items():
            docs_per_source[k] = docs_per_source.get(k, 0) + v
        r = ReadStats(s["read"]["documents"], dict(s["read"]["skipped"]), dict(s["read"]["examples"]))
        read.merge(r)
    keep = ("name", "num_tokens", "num_documents", "bin_sha256", "sources", "source_file", "source_sha256")
    return {
        "format": shards_mod.FORMAT_VERSION,
        "split": cfg.split,
        "input": cfg.input,
        "dtype": dtype.name,
        "tokenizer_hash": tok.hash,
        "tokenizer_path": str(tok.path),
        "vocab_size": tok.vocab_size,
        "eos_id": tok.eos_id,
        "num_tokens": sum(s["num_tokens"] for s in shards),
        "num_documents": sum(s["num_documents"] for s in shards),
        "tokens_per_source": dict(sorted(tokens_per_source.items())),
        "documents_per_source": dict(sorted(docs_per_source.items())),
        "read": read.to_dict(),
        "settings": shards[0]["settings"] if shards else {},
        "resumed_shards": sum(bool(s.get("resumed")) for s in shards),
        "seconds": round(seconds, 3),
        "worker_cpu_seconds": round(
            sum(s.get("cpu_seconds", 0.0) for s in shards if not s.get("resumed")), 3
        ),
        "fingerprint": shards_mod.fingerprint(tok.hash, dtype.name, shards),
        "shards": [{k: s[k] for k in keep} for s in shards],
    }


def _progress(total: int, enabled: bool, desc: str):
    if not enabled:
        return None

    return tqdm(
        total=total, desc=desc, unit="file", disable=not enabled or os.environ.get("TRILM_NO_PROGRESS")
    )
