"""Shared fixtures: every test starts without leftover process groups or megatron parallel state."""

from __future__ import annotations

import os
import sys

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _clean_parallel_state():
    yield
    parallel = sys.modules.get("trilm.parallel")
    if parallel is not None:
        parallel.shutdown_parallel()
