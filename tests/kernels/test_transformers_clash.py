"""Our top-level ``kernels`` package next to transformers, which probes for Hugging Face's ``kernels``."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

SCRIPT = """
import {first}, {second}
import kernels, transformers
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.utils.import_utils import is_kernels_available
import torch

assert kernels.__file__.startswith({repo!r}), kernels.__file__
assert not is_kernels_available(), "transformers mistook trilm's kernels for Hugging Face's"
from trilm.kernels import QuantLinear
from benchmarks.kernel_tools.samples import random_packed

cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=16)
model = LlamaForCausalLM(cfg).eval()
layer = model.model.layers[0].mlp
layer.down_proj = QuantLinear(random_packed("ternary", 32, 64), backend="torch")
with torch.no_grad():
    logits = model(torch.randint(0, 64, (1, 5))).logits
assert logits.shape == (1, 5, 64) and torch.isfinite(logits).all()
print("ok")
"""


@pytest.mark.parametrize("order", [("transformers", "kernels"), ("kernels", "transformers")])
def test_kernels_importable_alongside_transformers(order):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("TRITON_INTERPRET", None)
    code = SCRIPT.format(first=order[0], second=order[1], repo=str(REPO))
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("ok")
