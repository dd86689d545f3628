"""The one tokenizer policy: which ``tokenizer.model`` belongs to a model directory, and the BOS convention.

Candidates, in order: the file the user names (``--tokenizer``), the model directory's own copy, and for a
snapshot of a training run the run directory's (``RUN/tokenizer.model``). The first one that exists is
taken, and it must be the tokenizer the model was trained with:

- its SHA-256 must equal the hash the model records (a snapshot's ``meta.tokenizer_hash``; for an HF
  directory the hash in ``trilm_export.json`` or ``tokenizer_config.json``). Another one is refused by name
  — never skipped in favour of a later candidate and never used: its ids would be noise to the model;
- its vocabulary must fit the model's (``vocab_size``): ids past it index no trained embedding.

Without any candidate the model has no tokenizer, and :class:`TokenizerChoice` says why; commands that
need text refuse then, naming the way out (``--tokenizer``).

trilm **trains without BOS** (each document is its tokens followed by EOS); ``--add-bos`` at data
preparation is the recorded exception. :func:`trained_with_bos` reads which, and :func:`prefix_token_id`
is the token a text with no context is conditioned on: EOS without BOS (what precedes every document in
training), BOS with it.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import yaml

from trilm.data.tokenizer import Tokenizer
from trilm.store.errors import StoreError
from trilm.store.layout import HF_TOKENIZER_CONFIG, RUN_CONFIG, TOKENIZER_FILE
from trilm.store.snapshot import read_json_object


@dataclasses.dataclass(frozen=True)
class TokenizerChoice:
    """The tokenizer of a model directory (loaded and checked), or None with the reason."""

    tokenizer: Tokenizer | None
    source: str
    """``given`` (--tokenizer), ``model`` (the directory's own), ``run`` (its run directory's) or ``none``."""
    reason: str = ""

    @property
    def path(self) -> Path | None:
        return self.tokenizer.path if self.tokenizer is not None else None

    @property
    def hash(self) -> str | None:
        return self.tokenizer.hash if self.tokenizer is not None else None

    def require(self, where: str | Path) -> Tokenizer:
        if self.tokenizer is None:
            raise StoreError(f"{where}: {self.reason}; pass --tokenizer PATH")
        return self.tokenizer


def _load_checked(
    path: Path, expected: str | None, recorded_in: str, vocab_size: int | None, what: str
) -> Tokenizer:
    tok = Tokenizer.load(path)
    if expected and tok.hash != expected:
        raise StoreError(
            f"{path}: tokenizer hash {tok.hash[:16]}… differs from the expected {expected[:16]}… "
            f"(recorded in {recorded_in}): it belongs to another model; {what}"
        )
    if vocab_size is not None and tok.vocab_size > vocab_size:
        raise StoreError(
            f"{path}: the tokenizer has {tok.vocab_size:,} tokens, more than the model's vocabulary "
            f"({vocab_size:,}, {recorded_in}); it cannot be this model's tokenizer"
        )
    return tok


def choose_tokenizer(
    directory: str | Path,
    *,
    expected_hash: str | None,
    recorded_in: str,
    vocab_size: int | None,
    run_dir: Path | None = None,
    override: str | Path | None = None,
) -> TokenizerChoice:
    """Apply the policy of the module docstring to a model directory (``run_dir`` for a run snapshot)."""
    directory = Path(directory)
    if override:
        path = Path(override)
        path = path / TOKENIZER_FILE if path.is_dir() else path
        tok = _load_checked(path, expected_hash, recorded_in, vocab_size, "pass the one it was trained with")
        return TokenizerChoice(tok, "given", f"--tokenizer {path}")
    candidates = [(directory / TOKENIZER_FILE, "model")]
    if run_dir is not None:
        candidates.append((run_dir / TOKENIZER_FILE, "run"))
    for path, source in candidates:
        if path.is_file():
            tok = _load_checked(
                path,
                expected_hash,
                recorded_in,
                vocab_size,
                "remove it or pass --tokenizer with the right one",
            )
            return TokenizerChoice(tok, source, f"{path}")
    where = "next to the model" + (" or in its run directory" if run_dir is not None else "")
    return TokenizerChoice(None, "none", f"no {TOKENIZER_FILE} {where}")


def prefix_token_id(tok: Tokenizer, add_bos: bool) -> int:
    """The token a model conditions on before a text with no context: BOS if trained with it, else EOS."""
    return tok.bos_id if add_bos and tok.bos_id >= 0 else tok.eos_id


def trained_with_bos(directory: str | Path, meta_extra: dict[str, Any], run_dir: Path | None) -> bool:
    """Whether the model prepended BOS to its documents in training.

    Read from what the directory records (``add_bos`` in the snapshot's meta, as imports and packed
    exports write it; ``add_bos_token`` of an HF directory's ``tokenizer_config.json``), else from the
    training split's ``index.json`` named by the run's ``resolved_config.yaml``; else trilm's convention:
    False.
    """
    if "add_bos" in meta_extra:
        return bool(meta_extra["add_bos"])
    hf = read_json_object(Path(directory) / HF_TOKENIZER_CONFIG)
    if "add_bos_token" in hf:
        return bool(hf["add_bos_token"])
    if run_dir is None or not (run_dir / RUN_CONFIG).is_file():
        return False
    try:
        train_dir = (
            (yaml.safe_load((run_dir / RUN_CONFIG).read_text()) or {}).get("data", {}).get("train_dir")
        )
        index = json.loads((Path(train_dir) / "index.json").read_text()) if train_dir else {}
    except (OSError, yaml.YAMLError, json.JSONDecodeError, TypeError, AttributeError):
        return False
    return bool(index.get("settings", {}).get("add_bos", False))
