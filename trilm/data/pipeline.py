"""The data steps wired together: tokenizer training from a corpus, and the quickstart's whole data job.

``prepare_embedded(out)`` is what ``make quickstart`` calls: train a small tokenizer on the embedded corpus's
train split, then prepare the train and validation splits. On 2 cores it takes seconds, and rerunning it
reuses everything already done (same tokenizer bytes → same hash → finished shards are kept).
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

from trilm.config import Config, require, require_directory_path
from trilm.data import embedded_corpus_dir
from trilm.data.errors import DataError
from trilm.data.prepare import PrepareConfig, prepare
from trilm.data.slimpajama import (
    SPLITS,
    SourceMixture,
    check_source_names,
    hub_split_files,
    read_documents,
    read_documents_datasets,
    split_files,
)
from trilm.data.tokenizer import Tokenizer, train_tokenizer


@dataclasses.dataclass
class TokenizerConfig(Config):
    """Training a SentencePiece BPE tokenizer on (part of) a SlimPajama-shaped corpus."""

    input: str = ""  # SlimPajama-shaped directory or hf:<repo>
    out: str = ""  # .model path, or a directory (→ DIR/tokenizer.model)
    split: str = "train"
    vocab_size: int = 4096
    max_files: int = 0  # 0 = every file of the split
    max_sentences: int = 2_000_000
    exclude_sources: list[str] = dataclasses.field(default_factory=list)
    seed: int = 0

    def validate(self) -> None:
        require(bool(self.input), "input: a SlimPajama-shaped directory or hf:<repo> is required")
        require(bool(self.out), "out: where to write the tokenizer is required")
        if not self.out.endswith(".model"):
            require_directory_path(self.out, "out")
        require(self.split in SPLITS, f"split: {self.split!r} is not one of {list(SPLITS)}")
        require(self.vocab_size >= 260, f"vocab_size: {self.vocab_size} < 260 (byte fallback needs 259 ids)")
        require(self.max_files >= 0, "max_files: must be >= 0")
        check_source_names(self.exclude_sources, "--exclude-source")

    def build(self) -> Tokenizer:
        return train_tokenizer_from_corpus(self)


def train_tokenizer_from_corpus(cfg: TokenizerConfig) -> Tokenizer:
    if cfg.input.startswith("hf:"):
        read = read_documents_datasets
        files = hub_split_files(cfg.split, cfg.input.removeprefix("hf:"))
    else:
        read = read_documents
        files = split_files(cfg.input, cfg.split)
    files = files[: cfg.max_files] if cfg.max_files else files
    mixture = SourceMixture.from_options(cfg.exclude_sources)
    texts = (
        doc.text
        for doc in itertools.chain.from_iterable(read(f) for f in files)
        if mixture.copies(doc.source, doc.file, doc.line) > 0
    )
    provenance = {
        "trained_on": {"input": cfg.input, "split": cfg.split, "files": [f.key for f in files]},
        "excluded_sources": list(cfg.exclude_sources),
    }
    return train_tokenizer(
        texts,
        cfg.out,
        vocab_size=cfg.vocab_size,
        max_sentences=cfg.max_sentences,
        seed=cfg.seed,
        provenance=provenance,
    )


def prepare_embedded(
    out: str | Path,
    *,
    vocab_size: int = 4096,
    workers: int = 2,
    progress: bool = True,
    corpus: str | None = None,
) -> dict[str, Path]:
    """Tokenizer + prepared train and validation splits of the embedded corpus under ``out``.

    Returns ``{"tokenizer": .../tokenizer.model, "train": .../train, "validation": .../validation}``.
    An existing tokenizer of the requested vocabulary size is reused, so a rerun only checks the shards.
    """

    require_directory_path(out, "out")
    out = Path(out)
    corpus = corpus or str(embedded_corpus_dir())
    model = out / "tokenizer.model"
    tok = None
    if model.is_file():
        try:
            tok = Tokenizer.load(model)
        except DataError:
            tok = None
    if tok is None or tok.vocab_size != vocab_size:
        tok = TokenizerConfig(input=corpus, out=str(model), vocab_size=vocab_size).build()
    paths = {"tokenizer": model}
    for split in ("train", "validation"):
        cfg = PrepareConfig(
            input=corpus,
            split=split,
            tokenizer=str(model),
            out=str(out / split),
            workers=workers,
            progress=progress,
        )
        prepare(cfg)
        paths[split] = out / split
    return paths
