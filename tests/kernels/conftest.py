"""Kernel tests run in Triton's CPU interpreter unless marked ``gpu``; GPU tests run compiled on CUDA.

``TRITON_INTERPRET`` is set per test (and restored after), and
:func:`trilm.kernels.triton_runtime.kernel_module` re-imports the kernel modules when the setting changes, so
interpreter and GPU tests can share one session.
"""

import pytest
import torch


@pytest.fixture(autouse=True)
def _triton_mode(request, monkeypatch, tmp_path):
    if request.node.get_closest_marker("gpu") is not None:
        if not torch.cuda.is_available():
            pytest.skip("needs a CUDA GPU")
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
        monkeypatch.setenv("TRILM_KERNEL_CACHE", str(tmp_path / "kernel_tuning.json"))  # never the user's
    else:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
