"""Hugging Face's ``kernels`` distribution and trilm in one environment, both working.

trilm's kernels install as ``trilm.kernels`` (the top-level folder ``kernels/`` is mapped through
pyproject's ``package-dir``): its wheel holds no top-level ``kernels`` package, so ``pip install kernels``
beside it overwrites nothing, transformers' probe for Hugging Face's package finds Hugging Face's package
and its real version, and ``trilm.kernels.QuantLinear`` still serves a layer of a transformers Llama.

The real distribution comes from the package index into a throw-away venv layered over this environment
(tests/venvs.py) with trilm's wheel; without the index the test skips and says so. Run from an empty
directory, so neither the checkout's ``kernels/`` folder nor its ``trilm/`` can be what gets imported.
"""

from __future__ import annotations

import json
import zipfile

import pytest

from tests.venvs import layered_venv

SCRIPT = """
import importlib.metadata as md, json, sys
import {first}, {second}
import kernels, torch, trilm
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.utils import import_utils

found, version = import_utils._is_package_available("kernels", return_version=True)
from trilm.formats import TernaryWeight
from trilm.kernels import QuantLinear

cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=16)
model = LlamaForCausalLM(cfg).eval()
mlp = model.model.layers[0].mlp
codes = torch.randint(-1, 2, (32, 64), generator=torch.Generator().manual_seed(0), dtype=torch.int8)
packed = TernaryWeight.pack(codes, torch.full((1, 32), 0.02))
mlp.down_proj = QuantLinear(packed, backend="torch")
ids = torch.randint(0, 64, (1, 5))
with torch.no_grad():
    logits = model(ids).logits
    x = torch.randn(3, 64)
    err = (mlp.down_proj(x) - x @ packed.dequantize(torch.float32).T).abs().max().item()
print(json.dumps({{
    "kernels_file": kernels.__file__, "kernels_version": getattr(kernels, "__version__", None),
    "kernels_dist": md.version("kernels"), "has_get_kernel": hasattr(kernels, "get_kernel"),
    "probe": [found, version], "available": import_utils.is_kernels_available(),
    "window": [import_utils.KERNELS_MIN_VERSION, import_utils.KERNELS_MAX_VERSION],
    "trilm_file": trilm.__file__, "logits": list(logits.shape), "finite": bool(torch.isfinite(logits).all()),
    "quant_err": err,
}}))
"""


def test_the_wheel_has_no_top_level_kernels(trilm_wheel):
    tops = {name.split("/", 1)[0] for name in zipfile.ZipFile(trilm_wheel).namelist()}
    assert "kernels" not in tops and "trilm" in tops
    assert {t for t in tops if not t.endswith(".dist-info")} == {"trilm"}


@pytest.mark.slow
@pytest.mark.timeout(1200)  # pip resolves and installs kernels with its dependencies from the index
def test_hugging_face_kernels_installed_beside_trilm(trilm_wheel, tmp_path):
    from packaging.version import Version

    env = layered_venv(tmp_path / "venv", trilm_wheel)
    probe = env.pip("download", "-q", "--no-deps", "-d", str(tmp_path / "dl"), "kernels", cwd=tmp_path)
    if probe.returncode != 0:
        pytest.skip(f"the package index is unreachable (pip download kernels): {probe.stderr.strip()[-300:]}")
    done = env.pip("install", "-q", "kernels", cwd=tmp_path)  # with its dependencies, as a user gets it
    assert done.returncode == 0, done.stderr[-3000:]
    here = tmp_path / "empty"
    here.mkdir()
    for order in (("transformers", "kernels"), ("kernels", "transformers")):
        out = env.run([env.python, "-c", SCRIPT.format(first=order[0], second=order[1])], here, timeout=300)
        seen = json.loads(out.strip().splitlines()[-1])
        venv_root = str(env.root)
        # Hugging Face's package, from this venv, with its own version and API
        assert seen["kernels_file"].startswith(venv_root) and seen["has_get_kernel"], seen
        assert seen["kernels_version"] == seen["kernels_dist"], seen
        # transformers' probe sees that package and its version; whether it then uses it is its own version
        # window (transformers 5.24 takes kernels >= 0.18.2, < 0.19), not a clash
        assert seen["probe"] == [True, seen["kernels_dist"]], seen
        low, high = (Version(v) for v in seen["window"])
        assert seen["available"] == (low <= Version(seen["kernels_dist"]) < high), seen
        # trilm, from its wheel, serving a transformers Llama layer through QuantLinear
        assert seen["trilm_file"].startswith(venv_root), seen
        assert seen["logits"] == [1, 5, 64] and seen["finite"], seen
        assert seen["quant_err"] < 1e-5, seen
