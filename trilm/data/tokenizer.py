"""Tokenizers: SentencePiece BPE training on a SlimPajama-shaped corpus; loading either kind, hash-checked.

The hash is the SHA-256 of the tokenizer file's bytes (``tokenizer.model``, or a Hugging Face
``tokenizer.json``). Shards and checkpoints record it, and
``Tokenizer.load(path, expected_hash=...)`` refuses a different model: token ids from one tokenizer are
noise to a model trained with another, and nothing else would catch the mix-up.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import sentencepiece as spm

from trilm.atomic import write_bytes, write_json
from trilm.data.errors import DataError

SIDECAR_SUFFIX = ".trilm.json"
"""``tokenizer.model`` → ``tokenizer.trilm.json``: hash, sizes, provenance. Older runs wrote
``tokenizer.json``, the name Hugging Face uses for its own tokenizer file; :func:`read_sidecar` reads both."""
LEGACY_SIDECAR_SUFFIX = ".json"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def padded_size(vocab_size: int, multiple: int) -> int:
    """Round the embedding rows up to a multiple (64/128) so that matmuls and TP splits stay aligned."""
    if multiple <= 0:
        raise DataError(f"padding multiple must be positive, got {multiple}")
    return -(-vocab_size // multiple) * multiple


def sidecar_path(model: str | os.PathLike) -> Path:
    """Where the JSON sidecar of the tokenizer model file ``model`` lives."""
    model = Path(model)
    return model.with_name(model.stem + SIDECAR_SUFFIX)


def read_sidecar(model: str | os.PathLike) -> dict | None:
    """The sidecar of ``model`` (``tokenizer.trilm.json`` first, then ``tokenizer.json``), or None.

    A ``tokenizer.json`` is only taken when it is a trilm sidecar (it has a ``hash``); a Hugging Face
    tokenizer file of the same name is not one.
    """
    model = Path(model)
    for path in (sidecar_path(model), model.with_suffix(LEGACY_SIDECAR_SUFFIX)):
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_text())
        except (ValueError, RecursionError) as exc:  # ValueError: JSON and UTF-8 errors
            raise DataError(
                f"{path}: not a valid JSON tokenizer sidecar: {type(exc).__name__}: {exc}"
            ) from None
        if isinstance(data, dict) and "hash" in data and "model" not in data:
            return data
    return None


class Tokenizer:
    """A loaded tokenizer: ``encode``/``decode``, special ids, vocabulary size and content hash.

    Two kinds, one interface: a SentencePiece model (``tokenizer.model``: what trilm trains, and LLaMA-1/2)
    and a Hugging Face ``tokenizers`` tokenizer (``tokenizer.json``: byte-level BPE as Llama-3, SmolLM and
    most models people ship, :class:`HFTokenizer`). :meth:`load` picks the kind from the file.
    ``encode`` never adds BOS or EOS: whether a document starts with BOS is the model's convention
    (:mod:`trilm.store.tokenizer`), and every document ends with EOS in the data path.
    """

    kind = "sentencepiece"
    path: Path
    hash: str
    vocab_size: int
    eos_id: int
    bos_id: int
    pad_id: int
    unk_id: int
    chat_template: str | None = None
    """A Jinja chat template (Hugging Face tokenizers that carry one); None for SentencePiece."""
    adds_bos: bool | None = None
    """Whether the tokenizer itself puts BOS first (``add_bos_token`` / its post-processor); None = silent."""

    def __init__(self, path: Path, processor: spm.SentencePieceProcessor, content_hash: str):
        self.path = path
        self.sp = processor
        self.hash = content_hash
        self.vocab_size = processor.get_piece_size()
        self.eos_id = processor.eos_id()
        self.bos_id = processor.bos_id()
        self.pad_id = processor.pad_id()
        self.unk_id = processor.unk_id()

    @classmethod
    def load(cls, path: str | os.PathLike, expected_hash: str | None = None) -> Tokenizer:
        """A SentencePiece ``.model`` or a Hugging Face ``tokenizer.json`` (a directory: the one in it)."""
        path = resolve_tokenizer_path(path)
        content_hash = _sha256(path)
        if expected_hash is not None and expected_hash != content_hash:
            raise DataError(
                f"{path}: tokenizer hash {content_hash[:16]}… differs from the expected "
                f"{expected_hash[:16]}… "
                "(the shards or checkpoint were made with another tokenizer)"
            )
        if is_hf_tokenizer_file(path):
            return HFTokenizer.from_file(path, content_hash)
        processor = spm.SentencePieceProcessor()
        try:
            processor.load(str(path))
        except (OSError, RuntimeError, UnicodeDecodeError) as exc:  # a damaged piece is not UTF-8
            raise DataError(
                f"{path}: not a SentencePiece model ({type(exc).__name__}: {exc}); a Hugging Face tokenizer "
                "is a tokenizer.json"
            ) from None
        tok = SentencePieceTokenizer(path, processor, content_hash)
        if tok.eos_id < 0:
            raise DataError(f"{path}: the model has no EOS piece (documents are separated by EOS)")
        return tok

    @property
    def files(self) -> dict[str, Path]:
        """The files that make up the tokenizer, by the name they have in a model directory."""
        return {TOKENIZER_MODEL: self.path}

    def encode(self, text: str) -> list[int]:
        return self.sp.encode(text)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return self.sp.encode(texts, num_threads=1)

    def decode(self, ids: Iterable[int]) -> str:
        return self.sp.decode([int(i) for i in ids])

    def id_to_piece(self, token_id: int) -> str:
        return self.sp.id_to_piece(int(token_id))

    def vocabulary(self) -> dict[str, int]:
        """Token string → id (what two tokenizers must share to give a model the same ids)."""
        return {self.sp.id_to_piece(i): i for i in range(self.vocab_size)}

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        raise DataError(f"{self.path}: a SentencePiece tokenizer carries no chat template")

    def padded_vocab_size(self, multiple: int = 128) -> int:
        return padded_size(self.vocab_size, multiple)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.path}, vocab_size={self.vocab_size}, hash={self.hash[:12]})"


SentencePieceTokenizer = Tokenizer
"""The SentencePiece kind is the base class itself (it predates the Hugging Face kind)."""

TOKENIZER_MODEL = "tokenizer.model"
HF_TOKENIZER_FILE = "tokenizer.json"


def is_hf_tokenizer_file(path: Path) -> bool:
    """A ``*.json`` that is a ``tokenizers`` serialization (it has a ``model``), not a trilm sidecar."""
    if path.suffix != ".json":
        return False
    try:
        with open(path, "rb") as fh:
            head = fh.read(1 << 16)
    except OSError:
        return False
    return b'"model"' in head or b'"version"' in head


def resolve_tokenizer_path(path: str | os.PathLike) -> Path:
    """The tokenizer file a user's path means: the file itself, or in a directory its ``tokenizer.json``
    (a Hugging Face tokenizer) or ``tokenizer.model`` (SentencePiece), the former first."""
    path = Path(path)
    if path.is_dir():
        hf = path / HF_TOKENIZER_FILE
        if hf.is_file() and is_hf_tokenizer_file(hf):
            return hf
        if (path / TOKENIZER_MODEL).is_file():
            return path / TOKENIZER_MODEL
        raise DataError(f"{path}: no tokenizer in this directory ({HF_TOKENIZER_FILE} or {TOKENIZER_MODEL})")
    if not path.is_file():
        raise DataError(f"{path}: no such tokenizer model")
    return path


# Hugging Face tokenizers (``tokenizer.json``): byte-level BPE as Llama-3, SmolLM and most shipped models.
# They share this module with SentencePiece because Tokenizer.load picks between the two kinds.
#
# trilm does not re-implement them: the tokenizer is loaded by transformers' ``AutoTokenizer`` from the
# directory that holds it (with its ``tokenizer_config.json`` and chat template), so encode and decode are
# transformers' own, id for id and character for character. A lone ``tokenizer.json`` without its config is
# loaded as transformers' generic fast tokenizer over that file.
#
# The hash is the SHA-256 of ``tokenizer.json``: the file that fixes every id. What travels with it into a
# model directory (:attr:`HFTokenizer.files`) is the file and its companions — ``tokenizer_config.json``
# (special tokens, ``add_bos_token``), ``special_tokens_map.json`` and the chat template — under their own
# names, so the copy loads in transformers as the original does.
#
# trilm's conventions on top: :meth:`~HFTokenizer.encode` adds no special tokens (BOS is the model's
# recorded convention, EOS ends every document in the data path); special-token strings inside a text are
# read as those tokens, as ``AutoTokenizer`` reads them.

COMPANIONS = ("tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja", "chat_template.json")
"""Files beside ``tokenizer.json`` that transformers reads with it."""


def _load_transformers(path: Path) -> Any:
    """transformers' tokenizer for ``path`` (a ``tokenizer.json``), offline."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # deferred for start-up time: loads transformers only when called
        from transformers import AutoTokenizer, PreTrainedTokenizerFast
        from transformers.utils import logging as hf_logging

        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
        try:
            if path.name == HF_TOKENIZER_FILE and (path.parent / COMPANIONS[0]).is_file():
                return AutoTokenizer.from_pretrained(str(path.parent), local_files_only=True)
            return PreTrainedTokenizerFast(tokenizer_file=str(path))
        except Exception as exc:  # transformers raises many kinds; the file is what the user gave
            raise DataError(
                f"{path}: not a loadable Hugging Face tokenizer ({type(exc).__name__}: {exc})"
            ) from None
        finally:
            hf_logging.set_verbosity(verbosity)


class HFTokenizer(Tokenizer):
    """A ``tokenizer.json`` tokenizer through transformers (see the module docstring)."""

    kind = "hf"

    def __init__(self, path: Path, hf: Any, content_hash: str):
        self.path = path
        self.hf = hf
        self.hash = content_hash
        self.vocab_size = len(hf)
        ids: dict[str, Any] = {k: getattr(hf, f"{k}_token_id", None) for k in ("bos", "eos", "pad", "unk")}
        self.bos_id, self.eos_id, self.pad_id, self.unk_id = (
            -1 if ids[k] is None else int(ids[k]) for k in ("bos", "eos", "pad", "unk")
        )
        self.chat_template = getattr(hf, "chat_template", None) or None
        self.adds_bos = self._adds_bos()

    @classmethod
    def from_file(cls, path: Path, content_hash: str) -> HFTokenizer:
        tok = cls(path, _load_transformers(path), content_hash)
        if tok.eos_id < 0:
            raise DataError(
                f"{path}: the tokenizer names no EOS token (eos_token in tokenizer_config.json); documents "
                "are separated by EOS"
            )
        return tok

    def _adds_bos(self) -> bool:
        if self.bos_id < 0:
            return False
        with_specials = self.hf("a", add_special_tokens=True)["input_ids"]
        return bool(with_specials) and with_specials[0] == self.bos_id

    @property
    def files(self) -> dict[str, Path]:
        out = {HF_TOKENIZER_FILE: self.path}
        if self.path.name == HF_TOKENIZER_FILE:
            out.update({n: self.path.parent / n for n in COMPANIONS if (self.path.parent / n).is_file()})
        return out

    def encode(self, text: str) -> list[int]:
        return list(self.hf(text, add_special_tokens=False)["input_ids"])

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        if not texts:
            return []
        return [list(ids) for ids in self.hf(list(texts), add_special_tokens=False)["input_ids"]]

    def decode(self, ids: Iterable[int]) -> str:
        return self.hf.decode([int(i) for i in ids])

    def id_to_piece(self, token_id: int) -> str:
        return self.hf.convert_ids_to_tokens(int(token_id))

    def vocabulary(self) -> dict[str, int]:
        return dict(self.hf.get_vocab())

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        """The prompt text of a conversation through the tokenizer's chat template, ready for the
        assistant's reply (transformers' ``apply_chat_template``)."""
        if not self.chat_template:
            raise DataError(f"{self.path}: this tokenizer carries no chat template")
        return self.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def _training_lines(texts: Iterable[str], max_line_chars: int) -> Iterator[str]:
    for text in texts:
        for line in text.split("\n"):
            if line.strip():
                yield line[:max_line_chars]


def train_tokenizer(
    texts: Iterable[str],
    out: str | os.PathLike,
    *,
    vocab_size: int = 4096,
    max_sentences: int = 2_000_000,
    character_coverage: float = 0.9999,
    seed: int = 0,
    num_threads: int = 2,
    provenance: dict | None = None,
) -> Tokenizer:
    """Train a byte-fallback BPE model on the lines of ``texts``; write ``out`` (.model) and a JSON sidecar.

    Settings follow LLaMA's tokenizer: BPE, byte fallback (no unknown bytes), digits split, whitespace kept
    exactly (identity normalisation, so decode(encode(text)) == text), EOS id 2. Lines are reservoir-sampled
    to ``max_sentences`` with ``seed`` so that training cost is bounded on a large corpus. The same lines and
    settings give the same model bytes, hence the same hash (``num_threads`` is part of the settings).
    """
    out = Path(out)
    if out.suffix != ".model":
        out = out / "tokenizer.model"
    if vocab_size < 260:
        raise DataError(f"vocab_size: {vocab_size} is too small for byte fallback (>= 260 needed)")
    out.parent.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    sample: list[str] = []
    for i, line in enumerate(_training_lines(texts, 4096)):
        if i < max_sentences:
            sample.append(line)
        else:
            j = rng.randrange(i + 1)
            if j < max_sentences:
                sample[j] = line
    if not sample:
        raise DataError("tokenizer: no training text (all documents empty or filtered out)")
    model = io.BytesIO()  # written through model_writer: no temporary path ends up inside the model proto
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sample),
        model_writer=model,
        model_type="bpe",
        vocab_size=vocab_size,
        byte_fallback=True,
        split_digits=True,
        allow_whitespace_only_pieces=True,
        remove_extra_whitespaces=False,
        normalization_rule_name="identity",
        character_coverage=character_coverage,
        max_sentence_length=16384,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        num_threads=num_threads,
        minloglevel=2,
    )
    write_bytes(out, model.getvalue())
    tok = Tokenizer.load(out)
    meta = {
        "hash": tok.hash,
        "vocab_size": tok.vocab_size,
        "padded_vocab_size_64": tok.padded_vocab_size(64),
        "padded_vocab_size_128": tok.padded_vocab_size(128),
        "model_type": "bpe",
        "byte_fallback": True,
        "eos_id": tok.eos_id,
        "bos_id": tok.bos_id,
        "training_lines": len(sample),
        "seed": seed,
        **(provenance or {}),
    }
    write_json(sidecar_path(out), meta)
    return tok
