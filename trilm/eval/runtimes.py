"""Perplexity in runtimes other than trilm's, scored by trilm's own window loop.

:class:`Logits` gives :func:`trilm.eval.ppl.stream_nll` what it needs of a model from any function that
returns one window's logits, so llama.cpp (llama-cpp-python, the ``bench`` extra) on a GGUF file and
transformers on a compressed-tensors directory are scored on the same windows, targets and softmax width
as ``trilm eval ppl``. Both runtimes are imported only when asked for.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from trilm.eval.ppl import stream_nll


@dataclasses.dataclass
class Logits:
    """What :func:`trilm.eval.ppl.stream_nll` needs of a model, for a runtime that is not trilm's: fp32
    logits of one window, cut to the ``vocab`` columns trilm scores, so every runtime is scored on the
    same windows, targets and softmax width."""

    fn: Callable[[list[int]], torch.Tensor]
    context: int
    prefix_token_id: int
    vocab: int

    def logits(self, ids: torch.Tensor) -> torch.Tensor:
        if ids.shape[0] != 1:
            raise ValueError("Logits scores one window at a time (stream_nll(..., batch_size=1))")
        out = self.fn(ids[0].tolist()).float()
        if out.shape[-1] < self.vocab:
            raise ValueError(f"the runtime gives {out.shape[-1]} logits per token, trilm scores {self.vocab}")
        return out[None, :, : self.vocab]


def runtime_ppl(model: Logits, tokens: torch.Tensor, seq_len: int) -> dict:
    """Perplexity of ``tokens`` (the held-out stream, no prefix) under ``model`` in ``trilm eval ppl``'s
    disjoint windows of ``seq_len``."""

    start = time.perf_counter()
    nll, scored, windows = stream_nll(model, tokens, seq_len=seq_len, batch_size=1)
    return {
        "ppl": math.exp(nll / scored),
        "tokens": scored,
        "windows": windows,
        "nll": nll,
        "eval_s": time.perf_counter() - start,
    }


def llama_cpp_logits(
    gguf: Path, seq_len: int, threads: int, prefix: int, vocab: int
) -> tuple[Logits, object]:
    """llama.cpp (llama-cpp-python) on ``gguf``: the logits of every position of one window."""
    import llama_cpp  # optional dependency: llama-cpp-python (the bench extra)

    llm = llama_cpp.Llama(
        model_path=str(gguf),
        n_ctx=seq_len,
        n_batch=seq_len,
        logits_all=True,
        verbose=False,
        n_threads=threads,
        n_threads_batch=threads,
    )

    def fn(ids: list[int]) -> torch.Tensor:
        llm.reset()
        llm.eval(ids)
        return torch.from_numpy(np.array(llm.scores[: len(ids)], dtype=np.float32))

    return Logits(fn, seq_len, prefix, vocab), llm


def transformers_logits(directory: Path, seq_len: int, prefix: int, vocab: int) -> Logits:
    """transformers on a compressed-tensors directory, fp32 on CPU (as tests/export/test_ctensors.py)."""
    from transformers import (
        AutoModelForCausalLM,  # deferred for start-up time: loads transformers only when called
    )

    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()

    def fn(ids: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return model(torch.tensor([ids])).logits[0]

    return Logits(fn, seq_len, prefix, vocab)
