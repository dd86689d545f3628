"""Hugging Face tokenizers (``tokenizer.json``): byte-level BPE as Llama-3, SmolLM and most shipped models.

trilm does not re-implement them: the tokenizer is loaded by transformers' ``AutoTokenizer`` from the
directory that holds it (with its ``tokenizer_config.json`` and chat template), so encode and decode are
transformers' own, id for id and character for character. A lone ``tokenizer.json`` without its config is
loaded as transformers' generic fast tokenizer over that file.

The hash is the SHA-256 of ``tokenizer.json``: the file that fixes every id. What travels with it into a
model directory (:attr:`HFTokenizer.files`) is the file and its companions — ``tokenizer_config.json``
(special tokens, ``add_bos_token``), ``special_tokens_map.json`` and the chat template — under their own
names, so the copy loads in transformers as the original does.

trilm's conventions on top: :meth:`~HFTokenizer.encode` adds no special tokens (BOS is the model's
recorded convention, EOS ends every document in the data path); special-token strings inside a text are
read as those tokens, as ``AutoTokenizer`` reads them.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from trilm.data.errors import DataError
from trilm.data.tokenizer import HF_TOKENIZER_FILE, Tokenizer

COMPANIONS = ("tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja", "chat_template.json")
"""Files beside ``tokenizer.json`` that transformers reads with it."""


def _load_transformers(path: Path) -> Any:
    """transformers' tokenizer for ``path`` (a ``tokenizer.json``), offline."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
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
        ids = {k: getattr(hf, f"{k}_token_id", None) for k in ("bos", "eos", "pad", "unk")}
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
