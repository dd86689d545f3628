"""Fixtures of the serving tests: a tiny tokenizer trained here, tiny snapshots with random weights.

Weights are drawn with fan-in scaling and a wider head so that next-token distributions are peaked:
greedy decoding then has clear winners, and comparing the engine with the full forward token for token
is not at the mercy of near-ties at rounding level.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

from trilm.data import embedded_corpus_dir
from trilm.data.slimpajama import read_documents
from trilm.data.tokenizer import Tokenizer, train_tokenizer
from trilm.model import preset
from trilm.model.config import ModelConfig
from trilm.model.snapshot import SnapshotMeta
from trilm.model.spec import canonical_shapes
from trilm.store import snapshot as store

VOCAB = 400
"""Tokenizer vocabulary; the nano models pad their embedding to 512, so ids 400–511 are padding."""


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny matmuls on a shared 2-core machine: one intra-op thread is tens of times faster than two
    threads spinning against other processes."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory) -> Tokenizer:
    files = sorted(embedded_corpus_dir().glob("test/chunk*/*.jsonl.zst"))
    docs = list(itertools.islice((d.text for f in files for d in read_documents(f)), 24))
    out = tmp_path_factory.mktemp("tok") / "tokenizer.model"
    return train_tokenizer(docs, out, vocab_size=VOCAB, num_threads=1, character_coverage=0.995)


def random_state(cfg: ModelConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for name, shape in canonical_shapes(cfg).items():
        if len(shape) == 1:
            state[name] = 1 + 0.1 * torch.randn(shape, generator=gen)
        elif name == "embed.weight":
            state[name] = torch.randn(shape, generator=gen)
        else:
            scale = (3.0 if name == "head.weight" else 1.0) / shape[1] ** 0.5
            state[name] = scale * torch.randn(shape, generator=gen)
    return state


def nano(family: str = "floatlm", **overrides) -> ModelConfig:
    return preset(f"{family}-nano", vocab_size=VOCAB, **overrides)


def write_snapshot(
    directory: Path, cfg: ModelConfig, tokenizer: Tokenizer | None = None, seed: int = 0
) -> Path:
    meta = SnapshotMeta(family=cfg.family, size=cfg.size_name)
    if tokenizer is not None:
        meta.tokenizer_hash = tokenizer.hash
    tok = tokenizer.path if tokenizer is not None else None
    return store.write_snapshot(directory, cfg, meta, random_state(cfg, seed), tokenizer=tok)


@torch.no_grad()
def greedy_reference(model, prompt: list[int], n: int, vocab: int = VOCAB) -> list[int]:
    """Greedy decoding with the plain full forward (no cache): the whole sequence again every token."""
    ids = list(prompt)
    device = next(model.parameters()).device
    for _ in range(n):
        ids.append(int(model(torch.tensor([ids], device=device))[0, -1, :vocab].argmax()))
    return ids[len(prompt) :]
