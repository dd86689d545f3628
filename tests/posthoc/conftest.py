"""Shared fixtures of the post-hoc tests: the original code's reference outputs and a one-thread context."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.reference import QUANTIZER_TABLE, check_quantizer_fixtures


@pytest.fixture(scope="session")
def ref_fixtures():
    """(arrays, case table) of tests/reference/quantizers: outputs of the original GPTQ/PB-LLM/BiLLM code."""
    arrays = {k: torch.from_numpy(v) for k, v in np.load(check_quantizer_fixtures()).items()}
    return arrays, json.loads(QUANTIZER_TABLE.read_text())["cases"]


@pytest.fixture
def one_thread():
    """The fixtures were produced with one thread; BLAS summation order changes with the thread count."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def correlated_hessian(k: int, tokens: int = 512, seed: int = 0, outliers: int = 4) -> torch.Tensor:
    """2/N·XᵀX of correlated Gaussian features with a few outlier channels (like the fixtures' X)."""
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn(tokens, k, generator=gen)
    x = z @ (torch.randn(k, k, generator=gen) / k**0.5) + 0.3 * z
    x[:, :outliers] *= 10
    return 2.0 * x.t() @ x / tokens


TINY = dict(vocab_size=2048, hidden=128, ffn=256, heads=4, kv_heads=2, layers=2, context=128)


def tiny_model(seed: int = 0, **overrides):
    """A random GQA FloatLM InferenceModel (hidden 128, ffn 256: 128-column groups fit)."""
    from trilm.infer import InferenceModel
    from trilm.model.config import preset

    cfg = preset("floatlm-nano", **{**TINY, **overrides})
    gen = torch.Generator().manual_seed(seed)
    model = InferenceModel(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
            else:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
    return model.requires_grad_(False).eval()


def write_snapshot(model, directory: Path, tokenizer: Path | None = None, family: str | None = None) -> Path:
    """A standalone snapshot (config.json, model.safetensors [+ tokenizer], COMPLETE) of an InferenceModel."""
    from trilm.model.snapshot import SnapshotMeta
    from trilm.store import snapshot as store

    cfg = model.cfg if family is None else model.cfg.replace(family=family)
    meta = SnapshotMeta(family=cfg.family, size="nano", step=10)
    return store.write_snapshot(directory, cfg, meta, model.state_dict(), tokenizer=tokenizer)


@pytest.fixture(scope="session")
def embedded_data(tmp_path_factory) -> dict[str, Path]:
    """Tokenizer (vocab 2048) and prepared train/validation splits of the embedded corpus."""
    from trilm.data.pipeline import prepare_embedded

    return prepare_embedded(tmp_path_factory.mktemp("data"), vocab_size=2048, workers=2, progress=False)


@pytest.fixture(scope="session")
def float_snapshot(tmp_path_factory, embedded_data) -> Path:
    directory = tmp_path_factory.mktemp("floatlm") / "snap"
    return write_snapshot(tiny_model(), directory, embedded_data["tokenizer"])
