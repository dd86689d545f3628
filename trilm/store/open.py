"""``open_model(path)``: the one place a model directory is recognised, checked and read.

Every command that reads a model (quantize, prune, export, import, eval, generate, serve, train's
``init_from``) opens it here and gets the same :class:`ModelDir`: its kind, typed config and meta, the
tokenizer chosen by the one policy (:mod:`trilm.store.tokenizer`), the BOS convention, and its weights,
loaded lazily and verified before first use.

Kinds: ``run-snapshot`` (``RUN/snapshots/step-N``), ``snapshot`` (standalone: imports, suite copies),
``quantlm`` and ``packed`` (packed snapshots: post-hoc QuantLMs, packed exports), ``pruned``, ``hf`` (a
Hugging Face Llama directory) and ``suite-checkpoint`` (``SUITE/<run>/step-N`` of an exported suite, read
through its ``latent/`` snapshot). A run directory or a whole exported suite is refused with the path to
give instead.

Integrity: a run snapshot without its ``COMPLETE`` marker was not finished and is refused. When the marker
has a manifest, every file it lists is checked against it — sizes and small files when the directory is
opened, the CRC-32 of the weight files before a weight is used — and a mismatch is an
:class:`~trilm.store.errors.IntegrityError` naming the file. Tensors that cannot be read or hold NaN/±inf
are refused by file and tensor. ``verify=False`` skips the CRC (sizes and readability are still checked);
the default is on, and ``benchmarks/data/store.py`` measures what it costs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import warnings
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from trilm.config import shown
from trilm.formats import FormatError, decode_packed
from trilm.model.config import ModelConfig
from trilm.model.snapshot import SnapshotMeta
from trilm.store.errors import IntegrityError, StoreError
from trilm.store.hf import is_hf_directory, read_hf_directory, read_hf_state, weight_files
from trilm.store.integrity import (
    SMALL_FILE,
    Complete,
    check_listed,
    complete_steps,
    file_record,
    read_complete,
)
from trilm.store.layout import (
    COMPLETE,
    CONFIG_FILE,
    EXPORT_MARKER,
    PACKED_FILE,
    SNAPSHOTS_DIR,
    SUITE_ENTRY,
    SUITE_INDEX,
    WEIGHTS_FILE,
)
from trilm.store.snapshot import read_snapshot_config
from trilm.store.tensors import read_header, read_tensors
from trilm.store.tokenizer import TokenizerChoice, choose_tokenizer, trained_with_bos

KINDS = ("run-snapshot", "snapshot", "quantlm", "packed", "pruned", "hf", "suite-checkpoint")
WHAT = (
    "a trilm snapshot, a QuantLM or packed export, a pruned snapshot, a Hugging Face Llama directory or a "
    "checkpoint of an exported suite"
)


class Weights:
    """A model directory's tensors by canonical name, read on first use and verified before that."""

    def __init__(self, model: ModelDir):
        self._model = model
        self._float: dict[str, torch.Tensor] | None = None
        self._packed: dict[str, Any] | None = None
        self._verified = False

    def verify(self) -> None:
        """Check every file the manifest lists (size and CRC-32) once; raise naming the first bad one."""
        if not self._verified:
            check_listed(self._model.complete, crc=self._model.verify)
            self._verified = True

    def float_state(self) -> dict[str, torch.Tensor]:
        """Canonical float tensors as stored (TriLM/BiLM latents); packed layers are not among them."""
        if self._float is None:
            self.verify()
            model = self._model
            if model.kind == "hf":
                self._float = read_hf_state(model.path, model.config, model.hf.tied)
            else:
                self._float = read_tensors(model.path / WEIGHTS_FILE)
        return self._float

    def packed_layers(self) -> dict[str, Any]:
        """Packed block linears by canonical name without ``.weight`` ({} when the model has none)."""
        if self._packed is None:
            path = self._model.path / PACKED_FILE
            if self._model.kind == "hf" or not path.is_file():
                self._packed = {}
            else:
                self.verify()
                _, header = read_header(path)
                try:
                    self._packed, _ = decode_packed(read_tensors(path), header, path)
                except FormatError as exc:
                    raise IntegrityError(str(exc)) from None
        return self._packed

    def release(self) -> None:
        """Drop the loaded tensors (the next use reads them again)."""
        self._float = self._packed = None


@dataclasses.dataclass
class ModelDir:
    """A model directory opened by :func:`open_model` (see the module docstring)."""

    kind: str
    path: Path
    """The directory whose files are read (a suite checkpoint's ``latent/``)."""
    given: Path
    """The path as the user gave it."""
    config: ModelConfig
    meta: SnapshotMeta
    tokenizer: TokenizerChoice
    add_bos: bool
    complete: Complete | None
    verify: bool = True
    hf: Any = None
    """For ``hf``: the :class:`~trilm.store.hf.HFDirectory` (special ids, export marker)."""

    @cached_property
    def weights(self) -> Weights:
        return Weights(self)

    @property
    def run_dir(self) -> Path | None:
        """The training run a run snapshot belongs to."""
        return self.path.parent.parent if self.kind == "run-snapshot" else None

    @property
    def stored_packed(self) -> bool:
        """Its block linears are stored as packed codes (a QuantLM or a packed export), so there are no
        latent or float weights to train, quantize or pack again. ("packed" elsewhere — ``--packed``,
        ``load_inference_model(packed=True)`` — means packing latent weights at load time.)"""
        return self.kind in ("quantlm", "packed")

    @property
    def is_packed(self) -> bool:
        """Deprecated name of :attr:`stored_packed`."""
        warnings.warn("ModelDir.is_packed is now ModelDir.stored_packed", DeprecationWarning, stacklevel=2)
        return self.stored_packed

    @property
    def step(self) -> int | None:
        return self.meta.step

    @property
    def label(self) -> str:
        """A portable name for the model: its run and step, or its directory name (never a full path)."""
        run = self.meta.run or (self.run_dir.name if self.run_dir else self.given.name)
        return f"{run}/step-{self.step}" if self.step is not None else run

    def fingerprint(self) -> str:
        """SHA-256 over the sizes and CRC-32 of the model's files: the same bytes, the same fingerprint.

        Taken from the verified manifest when there is one, else computed (one read of each file).
        """
        names = [CONFIG_FILE, WEIGHTS_FILE, PACKED_FILE]
        if self.kind == "hf":
            names = [CONFIG_FILE, *sorted({p.name for p in weight_files(self.path).values()})]
        listed = self.complete.files if self.complete is not None else None
        records = {}
        for name in names:
            if listed is not None and name in listed:
                self.weights.verify()
                records[name] = listed[name]
            elif (self.path / name).is_file():
                records[name] = file_record(self.path / name)
        return hashlib.sha256(json.dumps(records, sort_keys=True).encode()).hexdigest()


def _refuse_containers(path: Path) -> None:
    """A run directory or an exported suite is not one model: say which path to give instead."""
    if (path / SNAPSHOTS_DIR).is_dir() and not (path / CONFIG_FILE).is_file():
        steps = complete_steps(path / SNAPSHOTS_DIR)
        hint = f", e.g. {steps[-1][1]}" if steps else " (it has no complete snapshot yet)"
        raise StoreError(f"{path}: a training run directory, not one model; give one of its snapshots{hint}")
    if (path / SUITE_INDEX).is_file():
        raise StoreError(
            f"{path}: an exported suite, not one model; give one of its checkpoints (<run>/step-N) or use "
            "trilm eval suite"
        )


def _kind(path: Path, meta: SnapshotMeta) -> str:
    if (path / PACKED_FILE).is_file():
        return "quantlm" if "quant" in meta.extra else "packed"
    if "pruning" in meta.extra:
        return "pruned"
    if path.parent.name == SNAPSHOTS_DIR:
        return "run-snapshot"
    return "snapshot"


def _check_finished(path: Path, kind: str, complete: Complete | None) -> None:
    if kind == "run-snapshot" and complete is None:
        raise IntegrityError(
            f"{path}: no {COMPLETE} marker: the snapshot was not finished (a run killed while saving leaves "
            "such a directory); use a complete one"
        )
    if kind != "hf" and not (path / WEIGHTS_FILE).is_file():
        raise IntegrityError(f"{path}: no {WEIGHTS_FILE}: not a complete snapshot")


def _check_manifest(complete: Complete | None, verify: bool) -> None:
    if complete is not None and complete.files is not None:
        check_listed(complete, crc=False)  # every listed file present with its size: a cheap first look
        if verify:
            small = [n for n, rec in complete.files.items() if rec.get("bytes", 0) <= SMALL_FILE]
            check_listed(complete, small)


def open_model(
    path: str | Path,
    *,
    tokenizer: str | Path | None = None,
    verify: bool = True,
    family: str | None = None,
    force_tokenizer: bool = False,
) -> ModelDir:
    """Recognise and check the model directory at ``path``; weights are read later, on first use.

    ``tokenizer`` overrides where the tokenizer comes from (it must still match the model's recorded
    hash, :mod:`trilm.store.tokenizer`; ``force_tokenizer`` accepts one that does not); ``family`` is the
    family of an HF directory whose config does not say it.
    """
    if not isinstance(path, str | os.PathLike):  # a config's value that should have been a path
        raise StoreError(f"{shown(path)}: not a path to a model directory (expected {WHAT})")
    given = Path(path)
    try:
        exists = given.exists()
    except (OSError, ValueError) as exc:  # a name longer than the file system allows, a NUL byte
        reason = getattr(exc, "strerror", None) or exc
        raise StoreError(f"{shown(str(given))}: cannot be a model directory ({reason})") from None
    if not exists:
        raise StoreError(f"{given}: not a directory: nothing is there (expected {WHAT})")
    if not given.is_dir():
        raise StoreError(f"{given}: not a directory but a file (expected {WHAT})")
    kind_override = None
    path = given
    if (given / SUITE_ENTRY).is_file():
        if not (given / COMPLETE).is_file():
            raise IntegrityError(f"{given}: no {COMPLETE} marker: this suite checkpoint was not finished")
        path, kind_override = given / "latent", "suite-checkpoint"
        if not path.is_dir():
            raise StoreError(f"{given}: a suite checkpoint without its latent/ snapshot")
    _refuse_containers(path)
    if not (path / CONFIG_FILE).is_file():
        hint = " (it looks like a prepared data split)" if (path / "index.json").is_file() else ""
        raise StoreError(f"{path}: no {CONFIG_FILE}: not a model directory{hint} (expected {WHAT})")
    complete = read_complete(path)
    if is_hf_directory(path):
        hf = read_hf_directory(path, family)
        cfg = hf.cfg
        meta = _hf_meta(path, hf)
        kind = "hf"
        recorded = f"{path / EXPORT_MARKER}" if hf.export.get("tokenizer_hash") else f"{path / CONFIG_FILE}"
        expected = hf.tokenizer_hash
    else:
        hf = None
        cfg, meta = read_snapshot_config(path)
        kind = _kind(path, meta)
        recorded = f"{path / CONFIG_FILE}"
        expected = meta.tokenizer_hash
    _check_finished(path, kind, complete)
    run_dir = path.parent.parent if kind == "run-snapshot" else None
    choice = choose_tokenizer(
        path,
        expected_hash=expected,
        recorded_in=recorded,
        vocab_size=cfg.vocab_size,
        run_dir=run_dir,
        override=tokenizer,
        force=force_tokenizer,
        padded_vocab=cfg.padded_vocab,
    )
    _check_manifest(complete, verify)
    add_bos = trained_with_bos(path, meta.extra, run_dir, choice.tokenizer)
    return ModelDir(
        kind=kind_override or kind,
        path=path,
        given=given,
        config=cfg,
        meta=meta,
        tokenizer=choice,
        add_bos=add_bos,
        complete=complete,
        verify=verify,
        hf=hf,
    )


def _hf_meta(path: Path, hf) -> SnapshotMeta:
    cfg = hf.cfg
    meta = SnapshotMeta(
        family=cfg.family,
        size=cfg.name,
        run=path.name,
        tokenizer_hash=hf.tokenizer_hash,
        imported_from=str(path),
    )
    export = {k: v for k, v in hf.export.items() if v is not None}
    for key in ("step", "tokens", "size", "run"):
        if key in export:
            setattr(meta, key, export[key])
    meta.extra["hf"] = {"bos_token_id": hf.bos_token_id, "eos_token_id": hf.eos_token_id}
    if hf.tied:
        meta.extra["tied_embeddings"] = True
    if hf.add_bos is not None:
        meta.extra["add_bos"] = hf.add_bos
    return meta
