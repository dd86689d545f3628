"""Shared fixtures: every test starts without leftover process groups or megatron parallel state.

``TRILM_TEST_THREADS=N`` runs the suite with N torch threads (``make test-portability`` uses 1 and 2, with
``ATEN_CPU_CAPABILITY`` and the MKL/oneDNN instruction-set caps, to check that no verdict depends on one
CPU's summation order); the header of the run says which capability and thread count were in force.
Under pytest-xdist (``make test``) each worker takes its share of the cores unless ``TRILM_TEST_THREADS``
says otherwise.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

from tests.support.xdist_groups import mark_groups

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

if os.environ.get("TRILM_TEST_THREADS"):
    torch.set_num_threads(int(os.environ["TRILM_TEST_THREADS"]))
elif os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    _threads = max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    torch.set_num_threads(_threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(_threads))


def pytest_report_header(config):
    names = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")
    caps = {k: os.environ[k] for k in names if os.environ.get(k)}
    return (
        f"torch CPU capability {torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} torch "
        f"thread(s)" + (f" ({', '.join(f'{k}={v}' for k, v in caps.items())})" if caps else "")
    )


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups into the test ids
def pytest_collection_modifyitems(config, items):
    mark_groups(items)
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


@pytest.fixture(scope="session")
def trilm_wheel(tmp_path_factory):
    """trilm's wheel, built once per session from this checkout (tests/venvs.py installs it)."""
    from tests.venvs import build_wheel

    return build_wheel(tmp_path_factory.mktemp("trilm-wheel"))
