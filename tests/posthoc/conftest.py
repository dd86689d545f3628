"""Shared fixtures of the post-hoc tests: the reference outputs in ../shared and a one-thread context."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

FIXTURES = Path(__file__).resolve().parents[2] / ".." / "shared" / "reference" / "fixtures"
FIXTURE_SHA256 = "37a58c0549bdb4b31aadbb5352b9e353e8406c0bf98d24adc2f6a413b7ba9185"


@pytest.fixture(scope="session")
def ref_fixtures():
    """(arrays, case table) of ../shared/reference/fixtures (outputs of the original GPTQ code)."""
    npz, table = FIXTURES / "ref_fixtures.npz", FIXTURES / "ref_fixtures.json"
    if not npz.is_file():
        pytest.skip(f"reference fixtures not found at {npz} (CI checks ../shared out beside the clone)")
    assert hashlib.sha256(npz.read_bytes()).hexdigest() == FIXTURE_SHA256, "fixture file changed"
    arrays = {k: torch.from_numpy(v) for k, v in np.load(npz).items()}
    return arrays, json.loads(table.read_text())["cases"]


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
