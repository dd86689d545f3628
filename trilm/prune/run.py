"""One pruning run, end to end: check the request, score units, slice, write a smaller snapshot.

Every check that can fail on bad input (keep ratio, granularity, method, model kind and integrity, output
directory, calibration data) runs before the search, and the snapshot is written by the store's one writer
(:func:`trilm.store.snapshot.write_snapshot`: staging directory, rename, ``COMPLETE`` last), so a failed
run leaves nothing behind.
"""

from __future__ import annotations

import dataclasses
import datetime
import time
from pathlib import Path
from typing import Any

import torch

from trilm.config import Config, ConfigError, require
from trilm.data.text_source import sample_windows, token_stream
from trilm.data.tokenizer import Tokenizer
from trilm.dtypes import parse_dtype
from trilm.infer import from_state_dict, prepare_for_inference
from trilm.memory import measure_peak, model_bytes
from trilm.model.flops import parameter_counts
from trilm.model.snapshot import SnapshotMeta, model_meta
from trilm.prune.metrics import CalibrationStats, check_metric, collect_stats, unit_scores
from trilm.prune.search import PGConfig, SearchResult, WindowSampler, batch_loss, pg_search
from trilm.prune.slicing import check_sliceable, select_units, slice_model
from trilm.prune.source import Source, load_source, open_prunable
from trilm.prune.units import UnitGroup, check_keep, parse_granularity, unit_group
from trilm.store.snapshot import write_snapshot

METHODS = ("pg", "magnitude", "wanda", "block-importance")
PRUNE_DTYPES = ("float32", "bfloat16")
"""The dtypes a pruning run computes in (``--dtype``)."""


@dataclasses.dataclass
class PruneConfig(Config):
    model: str = ""
    method: str = "pg"
    granularity: str = "channel"
    keep: float = 0.8
    calib: str = ""
    """Calibration text: a prepared split, SlimPajama folder, .jsonl(.zst) or .txt (see text_source)."""
    out: str = ""
    split: str = "train"
    calib_samples: int = 128
    """Windows for the metric statistics (Wanda-SP, block importance; the reference: 128)."""
    calib_seq_len: int = 0
    """Tokens per statistics window; 0 = min(model context, 1024) (the reference: 1024)."""
    per_layer: bool = False
    """Keep the same fraction in every block instead of one global budget."""
    device: str = "cpu"
    dtype: str = "float32"
    pg: PGConfig = dataclasses.field(default_factory=PGConfig)

    def validate(self) -> None:
        require(bool(self.model), "model: a snapshot or Hugging Face directory is required")
        require(bool(self.out), "--out: an output directory is required")
        check_keep(self.keep)
        granularities = parse_granularity(self.granularity)
        require(self.method in METHODS, f"--method: {self.method!r} is not one of {', '.join(METHODS)}")
        if self.method != "pg":
            for g in granularities:
                check_metric(self.method, g)
        elif self.pg.init not in ("auto", "uniform"):
            for g in granularities:
                check_metric(self.pg.init, g)
        require(
            bool(self.calib) or self.method == "magnitude",
            f"--calib: method {self.method} needs calibration data (a prepared split, folder or text file)",
        )
        require(self.calib_samples > 0, f"--calib-samples: must be > 0, got {self.calib_samples}")
        require(self.calib_seq_len >= 0, f"--calib-seq-len: must be >= 0, got {self.calib_seq_len}")
        parse_dtype(self.dtype, "--dtype", PRUNE_DTYPES)

    @property
    def granularities(self) -> tuple[str, ...]:
        return parse_granularity(self.granularity)

    def needs_stats(self) -> bool:
        metrics = (
            {self.method} if self.method != "pg" else {self.pg.init_metric(g) for g in self.granularities}
        )
        return bool(metrics & {"wanda", "block-importance"})


@dataclasses.dataclass
class PruneReport:
    out: Path
    record: dict[str, Any]
    params_before: int
    params_after: int
    search: SearchResult | None = None


def _check_out(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"--out {out}: already exists and is not empty (choose a new directory)")


def _calibration_tokens(cfg: PruneConfig, source: Source, model_cfg) -> torch.Tensor:

    tok = Tokenizer.load(source.tokenizer) if source.tokenizer is not None else None  # checked by the store
    wanted = cfg.calib_samples * calib_seq_len(cfg, model_cfg) if cfg.needs_stats() else 0
    if cfg.method == "pg":
        wanted = max(wanted, cfg.pg.steps * cfg.pg.batch_size * cfg.pg.seq_len)
    tokens = token_stream(cfg.calib, tok, split=cfg.split, max_tokens=max(wanted, 1))
    top = int(tokens.max()) if tokens.numel() else -1
    if top >= model_cfg.vocab_size:
        raise ConfigError(
            f"{cfg.calib}: token id {top} is outside the model's vocabulary ({model_cfg.vocab_size}); "
            "was the calibration data tokenized with another tokenizer?"
        )
    return tokens


def calib_seq_len(cfg: PruneConfig, model_cfg) -> int:
    return cfg.calib_seq_len or min(model_cfg.context, 1024)


def _resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device {name}: CUDA is not available on this machine")
    return device


def prune(cfg: PruneConfig, *, progress: bool = True, log=print) -> PruneReport:
    """Prune ``cfg.model`` and write the smaller snapshot to ``cfg.out``."""

    started = time.perf_counter()
    out = Path(cfg.out)
    _check_out(out)
    opened = open_prunable(cfg.model)
    model_cfg = opened.config
    granularities = cfg.granularities
    groups = [unit_group(model_cfg, g) for g in granularities]
    for group in groups:
        select_units(torch.zeros(group.total), group, cfg.keep, per_layer=cfg.per_layer)  # ratio checks
    check_sliceable(model_cfg, granularities)
    device = _resolve_device(cfg.device)
    source = load_source(opened)
    tokens = _calibration_tokens(cfg, source, source.cfg) if cfg.calib else None
    sampler = None
    if cfg.method == "pg":
        pg = cfg.pg
        sampler = WindowSampler(tokens, pg.seq_len, pg.batch_size, pg.seed, source=cfg.calib)
    stats_windows = None
    if cfg.needs_stats():
        seq = calib_seq_len(cfg, source.cfg)
        stats_windows = sample_windows(tokens, cfg.calib_samples, seq, cfg.pg.seed, source=cfg.calib)

    dtype = parse_dtype(cfg.dtype)
    model = prepare_for_inference(from_state_dict(source.cfg, source.state), device=device, dtype=dtype)
    stats: CalibrationStats | None = None
    if stats_windows is not None:
        stats = collect_stats(model, stats_windows, batch_size=cfg.pg.batch_size, progress=progress)

    kept: dict[str, tuple[UnitGroup, torch.Tensor]] = {}
    search = None
    record_pg: dict[str, Any] | None = None
    if cfg.method == "pg":
        assert sampler is not None  # made above for pg
        metrics = {}
        for group in groups:
            init = cfg.pg.init_metric(group.granularity)
            metrics[group.granularity] = None if init == "uniform" else unit_scores(model, group, init, stats)
        inference = _inference_peak(model, sampler, device)
        weights = model_bytes(model)
        search = pg_search(
            model,
            groups,
            cfg.keep,
            sampler,
            cfg.pg,
            metrics=metrics,
            per_layer=cfg.per_layer,
            progress=progress,
        )
        for group in groups:
            metric = metrics[group.granularity]  # ties (clamped scores) fall back to the metric's order
            tie = metric if metric is not None else search.initial[group.granularity]
            mask = select_units(
                search.scores[group.granularity], group, cfg.keep, per_layer=cfg.per_layer, tiebreak=tie
            )
            kept[group.granularity] = (group, mask)
        record_pg = {
            **cfg.pg.to_dict(),
            "init": {g.granularity: cfg.pg.init_metric(g.granularity) for g in groups},
            "lr_peak": {g.granularity: cfg.pg.lr_for(g.granularity) for g in groups},
            "first_loss": search.losses[0] if search.losses else None,
            "last_loss": search.losses[-1] if search.losses else None,
            "skipped_steps": search.skipped_steps,
            "seconds": round(search.seconds, 3),
            "peak_step_bytes": search.peak.peak_bytes if search.peak else None,
            "inference_forward_bytes": inference,
            "weights_bytes": weights,
            "memory_method": search.peak.method if search.peak else None,
        }
    else:
        for group in groups:
            scores = unit_scores(model, group, cfg.method, stats)
            kept[group.granularity] = (group, select_units(scores, group, cfg.keep, per_layer=cfg.per_layer))
    del model

    new_cfg, new_state = slice_model(source.cfg, source.state, kept)
    tag = f"{cfg.method}-{'+'.join(granularities)}-{cfg.keep:g}"
    new_cfg = new_cfg.replace(name=f"{source.cfg.name}-{tag}")
    before, after = parameter_counts(source.cfg), parameter_counts(new_cfg)
    record = {
        "method": cfg.method,
        "granularity": "+".join(granularities),
        "keep": cfg.keep,
        "per_layer": cfg.per_layer,
        "units": {g: _units_record(group, mask) for g, (group, mask) in kept.items()},
        "source": str(source.path),
        "source_name": source.cfg.name,
        "params_before": before.total,
        "params_after": after.total,
        "linear_params_before": before.linear,
        "linear_params_after": after.linear,
        "calibration": _calibration_record(cfg, source, tokens, stats_windows),
        "pg": record_pg,
        "device": str(device),
        "dtype": cfg.dtype,
        "seconds": None,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    record["seconds"] = round(time.perf_counter() - started, 3)
    meta = _output_meta(source, new_cfg, record)
    write_pruned_snapshot(out, new_cfg, new_state, meta, source.tokenizer)
    if log is not None:
        log(summary_line(record))
    return PruneReport(out, record, before.total, after.total, search)


def _inference_peak(model, sampler: WindowSampler, device: torch.device) -> int:
    """Peak tensor bytes of a plain forward + loss on a search-sized batch (what a PG step is compared to)."""

    batch = sampler.windows[: sampler.batch_size].to(device)
    with torch.inference_mode(), measure_peak(device) as peak:
        batch_loss(model, batch)
    return peak.peak_bytes


def _units_record(group: UnitGroup, mask: torch.Tensor) -> dict[str, Any]:
    per_layer = group.split(mask)
    return {
        "total": group.total,
        "kept": int(mask.sum()),
        "kept_per_layer": [int(m.sum()) for m in per_layer],
        "kept_indices": [torch.nonzero(m).flatten().tolist() for m in per_layer],
    }


def _calibration_record(cfg: PruneConfig, source: Source, tokens, stats_windows) -> dict[str, Any] | None:
    if tokens is None:
        return None
    return {
        "source": str(cfg.calib),
        "split": cfg.split,
        "tokens_read": int(tokens.numel()),
        "stats_windows": None if stats_windows is None else list(stats_windows.shape),
        "seed": cfg.pg.seed,
        "tokenizer": str(source.tokenizer) if source.tokenizer else None,
    }


def _output_meta(source: Source, cfg, record: dict[str, Any]) -> SnapshotMeta:
    src = source.meta
    extra = {k: v for k, v in src.extra.items() if k != "pruning"}
    history = list(src.extra.get("pruning_history", []))
    if "pruning" in src.extra:
        history.append(src.extra["pruning"])
    if history:
        extra["pruning_history"] = history
    extra["pruning"] = record
    meta = model_meta(
        cfg,
        step=src.step,
        tokens=src.tokens,
        samples=src.samples,
        run=src.run,
        tokenizer_hash=src.tokenizer_hash,
        imported_from=src.imported_from,
        extra=extra,
    )
    if cfg.family == "floatlm":
        meta.scale_partitions = src.scale_partitions
    return meta


def write_pruned_snapshot(
    out: Path, cfg, state: dict[str, torch.Tensor], meta: SnapshotMeta, tokenizer: Path | None
) -> Path:
    """config.json + model.safetensors (+ tokenizer.model) into ``out``, all or nothing."""
    out = Path(out)
    _check_out(out)
    return write_snapshot(out, cfg, meta, state, tokenizer=tokenizer, marker={"kind": "pruned"})


def summary_line(record: dict[str, Any]) -> str:
    kept = ", ".join(f"{g} {u['kept']}/{u['total']}" for g, u in record["units"].items())
    ratio = record["params_after"] / record["params_before"]
    line = (
        f"pruned {record['source_name']} ({record['method']}, keep {record['keep']:g}): {kept}; "
        f"params {record['params_before']:,} → {record['params_after']:,} ({ratio:.1%}); "
        f"{record['seconds']:.1f}s"
    )
    pg = record.get("pg")
    if pg and pg.get("peak_step_bytes") is not None:
        line += (
            f"; peak memory: weights {pg['weights_bytes'] / 2**20:.1f} MiB + a search step "
            f"{pg['peak_step_bytes'] / 2**20:.1f} MiB (an inference forward + loss on the same batch: "
            f"{pg['inference_forward_bytes'] / 2**20:.1f} MiB)"
        )
    return line
