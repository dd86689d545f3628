"""The one tokenizer policy: which tokenizer belongs to a model directory, and the BOS convention.

A tokenizer is a SentencePiece ``tokenizer.model`` or a Hugging Face ``tokenizer.json`` (with its
``tokenizer_config.json`` and chat template), loaded by :meth:`trilm.data.tokenizer.Tokenizer.load`.

Candidates, in order: the tokenizer the user names (``--tokenizer``: a file or a directory), the model
directory's own (``tokenizer.json``, then ``tokenizer.model``), and for a snapshot of a training run the run
directory's (``RUN/tokenizer.model``). It must be the tokenizer the model was trained with:

- when the model records a hash (a snapshot's ``meta.tokenizer_hash``; for an HF directory the hash in
  ``trilm_export.json`` or ``tokenizer_config.json``), the own candidate with that hash is taken, and a
  tokenizer with another hash is refused by name — never used: its ids would be noise to the model;
- a named tokenizer must also agree with the model's own tokenizer when the directory has one but records
  no hash (the same vocabulary, token for token), and its vocabulary must be the model's size (rounded up
  to 128 rows, as embeddings are padded): a 2,048-token tokenizer is not a 49,152-token model's;
- a vocabulary larger than the model's embedding is always refused: its ids index no trained row.

``force`` (``--force-tokenizer``) accepts a named tokenizer that fails the first two checks, and the
choice says what was overridden. Without any candidate the model has no tokenizer, and
:class:`TokenizerChoice` says why; commands that need text refuse then, naming the way out.

trilm **trains without BOS** (each document is its tokens followed by EOS); ``--add-bos`` at data
preparation is the recorded exception, and an imported model's tokenizer may say it adds BOS (Llama-3).
:func:`trained_with_bos` reads which, and :func:`prefix_token_id` is the token a text with no context is
conditioned on: EOS without BOS (what precedes every document in training), BOS with it.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from trilm.config import ConfigError, read_yaml_file
from trilm.data.errors import DataError
from trilm.data.tokenizer import (
    HF_TOKENIZER_FILE,
    TOKENIZER_MODEL,
    Tokenizer,
    is_hf_tokenizer_file,
    padded_size,
)
from trilm.store.errors import StoreError
from trilm.store.jsonfile import read_json_object
from trilm.store.layout import HF_TOKENIZER_CONFIG, RUN_CONFIG

VOCAB_ROUNDING = 128
"""Vocabulary sizes are compared rounded up to this many rows (embeddings are padded so)."""


@dataclasses.dataclass(frozen=True)
class TokenizerChoice:
    """The tokenizer of a model directory (loaded and checked), or None with the reason."""

    tokenizer: Tokenizer | None
    source: str
    """``given`` (--tokenizer), ``model`` (the directory's own), ``run`` (its run directory's) or ``none``."""
    reason: str = ""
    forced: str = ""
    """What ``force`` overrode (empty when nothing was)."""

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


def own_candidates(directory: Path, run_dir: Path | None = None) -> list[tuple[Path, str]]:
    """The tokenizer files a model directory (and its run) holds, in the order they are preferred."""
    found = []
    hf = directory / HF_TOKENIZER_FILE
    if hf.is_file() and is_hf_tokenizer_file(hf):
        found.append((hf, "model"))
    if (directory / TOKENIZER_MODEL).is_file():
        found.append((directory / TOKENIZER_MODEL, "model"))
    if (
        run_dir is not None
        and (run_dir / HF_TOKENIZER_FILE).is_file()
        and is_hf_tokenizer_file(run_dir / HF_TOKENIZER_FILE)
    ):
        found.append((run_dir / HF_TOKENIZER_FILE, "run"))
    if run_dir is not None and (run_dir / TOKENIZER_MODEL).is_file():
        found.append((run_dir / TOKENIZER_MODEL, "run"))
    return found


def _load(path: Path) -> Tokenizer:
    try:
        return Tokenizer.load(path)
    except DataError as exc:
        raise StoreError(str(exc)) from None


def _check_fits(tok: Tokenizer, vocab_size: int | None, padded_vocab: int | None, recorded_in: str) -> None:
    rows = vocab_size if vocab_size is not None else padded_vocab
    if rows is not None and tok.vocab_size > rows:
        raise StoreError(
            f"{tok.path}: the tokenizer has {tok.vocab_size:,} tokens, more than the model's vocabulary "
            f"({rows:,}, {recorded_in}); it cannot be this model's tokenizer"
        )


def vocabulary_difference(ours: Tokenizer, theirs: Tokenizer) -> str:
    """Empty when the two tokenizers map the same strings to the same ids, else what differs."""
    a, b = ours.vocabulary(), theirs.vocabulary()
    if a == b:
        return ""
    either = set(a) | set(b)
    differ = sum(1 for t in either if a.get(t) != b.get(t))
    return f"{differ:,} of the {len(either):,} token strings of either have another id or none"


def _foreign(
    tok: Tokenizer,
    *,
    expected_hash: str | None,
    recorded_in: str,
    own: Tokenizer | None,
    vocab_size: int | None,
) -> str:
    """Why a named tokenizer is not the model's (empty when nothing says so)."""
    if expected_hash and tok.hash != expected_hash:
        return (
            f"tokenizer hash {tok.hash[:16]}… differs from the expected {expected_hash[:16]}… (recorded in "
            f"{recorded_in}): it belongs to another model"
        )
    if own is not None and own.hash != tok.hash:
        diff = vocabulary_difference(own, tok)
        if diff:
            return f"its vocabulary is not that of the model's own tokenizer {own.path} ({diff})"
    if vocab_size is not None and padded_size(tok.vocab_size, VOCAB_ROUNDING) != padded_size(
        vocab_size, VOCAB_ROUNDING
    ):
        return (
            f"the tokenizer has {tok.vocab_size:,} tokens, the model's vocabulary {vocab_size:,} "
            f"({recorded_in}): it is another model's tokenizer"
        )
    return ""


def choose_tokenizer(
    directory: str | Path,
    *,
    expected_hash: str | None,
    recorded_in: str,
    vocab_size: int | None,
    run_dir: Path | None = None,
    override: str | Path | None = None,
    force: bool = False,
    padded_vocab: int | None = None,
) -> TokenizerChoice:
    """Apply the policy of the module docstring to a model directory (``run_dir`` for a run snapshot)."""
    directory = Path(directory)
    candidates = own_candidates(directory, run_dir)
    if override:
        tok = _load(Path(override))
        own_tokenizer = None
        if not expected_hash and candidates and candidates[0][0].resolve() != tok.path.resolve():
            own_tokenizer = _load(candidates[0][0])
        _check_fits(tok, vocab_size, padded_vocab, recorded_in)
        why = _foreign(
            tok,
            expected_hash=expected_hash,
            recorded_in=recorded_in,
            own=own_tokenizer,
            vocab_size=vocab_size,
        )
        if why and not force:
            raise StoreError(
                f"{tok.path}: {why}; pass the one it was trained with (or --force-tokenizer to use this one "
                "anyway)"
            )
        return TokenizerChoice(tok, "given", f"--tokenizer {tok.path}", forced=why)
    if expected_hash:
        # the directory's own files first (a tokenizer.json and a tokenizer.model may both be there: two
        # representations of one tokenizer); the run's copy only when the directory has none of its own
        own = [c for c in candidates if c[1] == "model"] or candidates
        for path, source in own:
            tok = _load(path)
            if tok.hash == expected_hash:
                _check_fits(tok, vocab_size, padded_vocab, recorded_in)
                return TokenizerChoice(tok, source, f"{path}")
        if own:
            tok = _load(own[0][0])
            raise StoreError(
                f"{tok.path}: tokenizer hash {tok.hash[:16]}… differs from the expected "
                f"{expected_hash[:16]}… (recorded in {recorded_in}): it belongs to another model; remove it "
                "or pass --tokenizer with the right one"
            )
    elif candidates:
        path, source = candidates[0]
        tok = _load(path)
        _check_fits(tok, vocab_size, padded_vocab, recorded_in)
        return TokenizerChoice(tok, source, f"{path}")
    where = "next to the model" + (" or in its run directory" if run_dir is not None else "")
    return TokenizerChoice(None, "none", f"no {HF_TOKENIZER_FILE} or {TOKENIZER_MODEL} {where}")


def tokenizer_files(tokenizer: Tokenizer | str | Path) -> dict[str, Path]:
    """The files to copy into a model directory for ``tokenizer`` (a loaded one, or its path), by name."""
    if isinstance(tokenizer, Tokenizer):
        return tokenizer.files
    path = Path(tokenizer)
    if path.is_dir() or is_hf_tokenizer_file(path):
        return _load(path).files
    return {TOKENIZER_MODEL: path}


def prefix_token_id(tok: Tokenizer, add_bos: bool) -> int:
    """The token a model conditions on before a text with no context: BOS if trained with it, else EOS."""
    return tok.bos_id if add_bos and tok.bos_id >= 0 else tok.eos_id


def trained_with_bos(
    directory: str | Path,
    meta_extra: dict[str, Any],
    run_dir: Path | None,
    tokenizer: Tokenizer | None = None,
) -> bool:
    """Whether the model prepended BOS to its documents in training.

    Read from what the directory records (``add_bos`` in the snapshot's meta, as imports and packed
    exports write it; ``add_bos_token`` of an HF directory's ``tokenizer_config.json``, or a tokenizer
    that puts BOS first itself, ``tokenizer``), else from the
    training split's ``index.json`` named by the run's ``resolved_config.yaml``; else trilm's convention:
    False.
    """
    if "add_bos" in meta_extra:
        return bool(meta_extra["add_bos"])
    hf = read_json_object(Path(directory) / HF_TOKENIZER_CONFIG)
    if "add_bos_token" in hf:
        return bool(hf["add_bos_token"])
    if tokenizer is not None and tokenizer.adds_bos is not None:
        return bool(tokenizer.adds_bos)
    if run_dir is None or not (run_dir / RUN_CONFIG).is_file():
        return False
    try:
        train_dir = (read_yaml_file(run_dir / RUN_CONFIG) or {}).get("data", {}).get("train_dir")
        index = json.loads((Path(train_dir) / "index.json").read_text()) if train_dir else {}
        return bool(index.get("settings", {}).get("add_bos", False))
    except (ConfigError, OSError, ValueError, RecursionError, TypeError, AttributeError):
        return False  # a damaged run config or index says nothing: trilm's convention holds
