"""The driver on CUDA computes what it computes on the CPU (skipped without a GPU)."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.posthoc.conftest import tiny_model
from trilm.posthoc import UniformConfig
from trilm.posthoc.engine import EngineConfig, quantize_blockwise
from trilm.posthoc.layerwise import LayerwiseMethod
from trilm.posthoc.omniquant import OmniQuantMethod, mode_config


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["gptq", pytest.param("omniquant", marks=pytest.mark.slow)])
def test_cuda_matches_cpu(method):
    torch.backends.cuda.matmul.allow_tf32 = False
    ids = torch.randint(0, 2048, (4, 32), generator=torch.Generator().manual_seed(0))
    results = {}
    for device in ("cpu", "cuda"):
        model = copy.deepcopy(tiny_model())
        if method == "gptq":
            block_method = LayerwiseMethod("gptq", UniformConfig(bits=4, group_size=64, act_order=True))
        else:
            block_method = OmniQuantMethod(mode_config("W3A16g64", epochs=1))
        report = quantize_blockwise(model, ids, block_method, EngineConfig(device=device, progress=False))
        assert report.memory["device"] == device
        if device == "cuda":
            assert report.memory["device_peak_bytes"] > 0
        results[device] = {k: r.packed.dequantize() for k, r in report.layers.items()}
    for name, w in results["cpu"].items():
        same = (results["cuda"][name] - w).abs() <= 1e-6
        assert float(same.float().mean()) > 0.99, name
