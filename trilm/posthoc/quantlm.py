"""From a float model to a QuantLM directory: checks, calibration, the block-wise engine, the packed snapshot.

A QuantLM is a packed snapshot (:func:`trilm.store.snapshot.write_snapshot_files`): the block linears in
``packed.safetensors`` (``IntWeight``: codes, scales, zeros, g_idx), embeddings, norms and head as floats in
``model.safetensors``, the tokenizer copied next to them, and ``meta.extra["quant"]`` recording the method,
every option, the bits per weight (as the paper counts them and as stored), the calibration source and seed,
timings and memory. The source is opened (and its weights verified) by :func:`trilm.store.open_model`.
The QuantLM is written into a staging directory (:mod:`trilm.atomic`), optionally evaluated from there
through ``trilm.infer.load_inference_model`` (so through ``trilm.kernels.QuantLinear``), and only then renamed
into place with its ``COMPLETE`` manifest: an error at any point leaves nothing behind and never touches
an existing model, and what a killed run left is removed by the next one.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from trilm.atomic import atomic_directory
from trilm.config import Config, ConfigError
from trilm.dtypes import dtype_name
from trilm.formats import layer_bits, model_bits_summary
from trilm.infer import load_inference_model, load_with_meta
from trilm.model.config import ModelConfig
from trilm.model.snapshot import SnapshotMeta
from trilm.model.spec import canonical_shapes
from trilm.posthoc.calibration import CalibrationConfig, check_vocabulary, load_calibration
from trilm.posthoc.engine import EngineConfig, EngineReport, quantize_blockwise
from trilm.posthoc.evaluate import validation_loss
from trilm.posthoc.layerwise import block_method
from trilm.posthoc.registry import MethodOptions, get_method
from trilm.store.integrity import complete_marker
from trilm.store.open import ModelDir, open_model
from trilm.store.snapshot import (
    is_snapshot,
    read_snapshot_config,
    write_snapshot_config,
    write_snapshot_files,
)


@dataclasses.dataclass
class QuantizeJob:
    """Everything ``trilm quantize`` was asked to do."""

    source: Path
    method: str
    config: Config
    calib: CalibrationConfig | None
    """Where the calibration windows come from; None for a data-free method (RTN), which reads none."""
    out: Path
    engine: EngineConfig = dataclasses.field(default_factory=EngineConfig)
    options: MethodOptions = dataclasses.field(default_factory=MethodOptions)
    tokenizer: Path | None = None
    force_tokenizer: bool = False
    """Accept ``tokenizer`` where the store's tokenizer policy would refuse it (not the model's own)."""
    eval_split: Path | None = None
    """A prepared split: evaluate the written QuantLM's validation loss before it is moved into place."""
    eval_sequences: int = 0
    eval_seq_len: int | None = None
    """Tokens per validation sequence (None: the calibration length, else min(2048, context))."""
    opened: ModelDir | None = None
    """The source as the caller already opened it (``trilm quantize`` reads its context length first): the
    job uses it instead of opening the directory again."""


@dataclasses.dataclass
class QuantizeSummary:
    out: Path
    quant: dict[str, Any]
    report: EngineReport
    val_loss: float | None


def open_source(path: Path, tokenizer: Path | None = None, force_tokenizer: bool = False) -> ModelDir:
    """The float model to quantize, opened through the store (weights read later, verified first)."""
    return open_model(path, tokenizer=tokenizer, force_tokenizer=force_tokenizer)


def check_source(src: ModelDir, method: str) -> None:
    """Float methods quantize float weights: refuse TriLM/BiLM checkpoints and models already packed."""
    cfg = src.config
    if src.stored_packed:
        raise ConfigError(
            f"{src.given}: already a packed model ({src.kind}: QuantLM or packed export); quantize its float "
            "source"
        )
    if cfg.family != "floatlm":
        fmt = cfg.weight_format
        raise ConfigError(
            f"{src.given}: a {cfg.family} model — its block weights are already {fmt}; {method} quantizes "
            "float weights (give a FloatLM snapshot or a Hugging Face Llama)"
        )


def check_shapes(cfg: ModelConfig, config: Config) -> None:
    """Every block linear's input size against the method's grouping, before any work is done."""
    check = getattr(config, "check_in_features", None)
    if check is None:
        return
    by_k: dict[int, list[str]] = {}
    for name, shape in canonical_shapes(cfg).items():
        if name.startswith("layers.") and len(shape) == 2:
            by_k.setdefault(shape[1], []).append(name.removesuffix(".weight"))
    for k, names in by_k.items():
        try:
            check(k, names[0])
        except ConfigError as exc:
            if len(names) == 1:
                raise
            kinds = sorted({n.split(".", 2)[2] for n in names})
            raise ConfigError(
                f"{exc} — and so for all {len(names)} layers with K={k} ({', '.join(kinds)})"
            ) from None


def job_identity(job: QuantizeJob) -> dict[str, Any]:
    """What makes two QuantLMs the same model: source, method, all settings, calibration."""
    return {
        "source": str(job.source.resolve()),
        "method": job.method,
        "options": _options(job),
        "calibration": job.calib.to_dict() if job.calib is not None else None,
    }


def _options(job: QuantizeJob) -> dict[str, Any]:
    return {
        **job.config.to_dict(),
        "true_sequential": job.options.true_sequential,
        "scale_dtype": dtype_name(job.options.scale_dtype),
    }


def check_output(out: Path, identity: dict[str, Any]) -> None:
    """Refuse an output directory that holds anything but this same QuantLM (which is then replaced)."""
    if not out.exists():
        return
    if not out.is_dir():
        raise ConfigError(f"{out}: exists and is not a directory")
    if not any(out.iterdir()):
        return
    if not is_snapshot(out):
        raise ConfigError(f"{out}: not empty and not a trilm snapshot; refusing to write a QuantLM into it")
    _, meta = read_snapshot_config(out)
    quant = meta.extra.get("quant") or {}
    theirs = {k: quant.get(k) for k in identity}
    if theirs != identity:
        what = f"a {quant.get('method')} QuantLM of {quant.get('source')}" if quant else "another model"
        raise ConfigError(
            f"{out}: already holds {what}, not this one; choose another --out or remove the directory"
        )


def quantize_to_quantlm(job: QuantizeJob) -> QuantizeSummary:
    """Run a whole quantization job; see the module docstring for what is written and when."""

    start = time.perf_counter()
    method = get_method(job.method)
    if method.data_free and job.calib is not None:  # it reads no data: the same QuantLM with or without
        job = dataclasses.replace(job, calib=None, eval_seq_len=job.eval_seq_len or job.calib.seq_len)
    if method.unwritable is not None and (why := method.unwritable(job.config)):
        raise ConfigError(f"--method {job.method}: {why}")
    src = job.opened
    if src is None:
        src = open_source(job.source, job.tokenizer, job.force_tokenizer)
    cfg, src_meta = src.config, src.meta
    check_source(src, job.method)
    check_shapes(cfg, job.config)
    identity = job_identity(job)
    check_output(job.out, identity)
    if job.calib is None and not method.data_free:
        raise ConfigError(
            f"--calib: --method {job.method} needs calibration data (a prepared split, folder or text file)"
        )
    if job.calib is not None and job.calib.seq_len > cfg.context:
        raise ConfigError(f"calibration seq_len {job.calib.seq_len} exceeds the model context {cfg.context}")

    model, _ = load_with_meta(src)  # a damaged source fails here, before calibration data is read
    src.weights.release()
    tokenizer = src.tokenizer.tokenizer
    calib = None
    if job.calib is not None:
        calib = load_calibration(job.calib, tokenizer)
        check_vocabulary(calib.windows, cfg.padded_vocab, job.calib.source)
    model.requires_grad_(False).eval()
    t_quant = time.perf_counter()
    options = dataclasses.replace(job.options, calibration=job.calib, tokenizer=tokenizer)
    driver = block_method(method, job.config, options)
    report = quantize_blockwise(model, calib.windows if calib else None, driver, job.engine)
    packed = {name: rec.packed for name, rec in report.layers.items()}

    bits = model_bits_summary(packed)
    quant: dict[str, Any] = {
        **identity,
        "method_settings": driver.describe(),
        "bits": {
            "paper": bits["value"]
            if bits["value"] is not None
            else (method.paper_bits(job.config) if method.paper_bits else None),
            "minimum": bits["minimum"],
            "stored": bits["stored"],
            "stored_note": "bytes of packed.safetensors tensors (codes, scales, zeros, g_idx) / weights",
            "minimum_note": "information-theoretic minimum of the layers' output (formats that define it)",
        },
        "calibration_data": calib.record if calib else None,
        "source_meta": {"val_loss": src_meta.val_loss, "step": src_meta.step, "run": src_meta.run},
        "layers": {
            name: {"bits_per_weight": round(rec.packed.bits_per_weight(), 6), "proxy_loss": rec.proxy_loss}
            | {f"{k}_bits": v for k, v in layer_bits(rec.packed).items() if k != "stored" and v is not None}
            | {k: v for k, v in rec.extra.items() if isinstance(v, int | float | str | None)}
            for name, rec in report.layers.items()
        },
        "seconds": {"calibration_data": t_quant - start, "quantize": report.seconds},
        "block_seconds": report.block_seconds,
        "memory": report.memory,
        "device": job.engine.device,
    }
    meta = dataclasses.replace(
        src_meta, extra={**src_meta.extra, "quant": quant}, val_loss=None, train_loss=None
    )
    if meta.tokenizer_hash is None and tokenizer is not None:
        meta.tokenizer_hash = tokenizer.hash
    float_state = {k: v for k, v in model.state_dict().items() if k.removesuffix(".weight") not in packed}
    tok_file = Path(tokenizer.path) if tokenizer is not None else None
    val_loss = _write(job, cfg, float_state, packed, meta, tok_file, start)
    return QuantizeSummary(job.out, meta.extra["quant"], report, val_loss)


def _write(job, cfg, float_state, packed, meta: SnapshotMeta, tokenizer: Path | None, start: float):
    val_loss = None
    with atomic_directory(job.out, replace=True, markers=complete_marker({"kind": "quantlm"})) as tmp:
        write_snapshot_files(tmp, cfg, meta, float_state, packed, tokenizer=tokenizer)
        if job.eval_split is not None:
            written = load_inference_model(tmp, device=job.engine.device)
            seq = min(cfg.context, job.eval_seq_len or (job.calib.seq_len if job.calib else 2048))
            val_loss = validation_loss(
                written, job.eval_split, seq, max_sequences=job.eval_sequences, device=job.engine.device
            )
            meta.extra["quant"]["eval"] = {
                "split": str(job.eval_split),
                "seq_len": seq,
                "max_sequences": job.eval_sequences,
                "val_loss": val_loss,
            }
            meta.val_loss = val_loss
        meta.extra["quant"]["seconds"]["total"] = time.perf_counter() - start
        write_snapshot_config(tmp, cfg, meta)
    return val_loss
