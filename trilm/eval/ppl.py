"""Perplexity over a text source with rolling windows: loss, perplexity, bits per token and per byte.

The source is anything :func:`trilm.data.text_source.token_stream` reads (a prepared split, a SlimPajama
folder, a ``.jsonl`` or ``.txt`` file): one token stream, documents separated by EOS as in training. The
stream is preceded by the model's prefix token (EOS for a model trained without BOS), so the first token
is scored in the same situation as every other document's first token.

Windows: every token is predicted exactly once. A window ends ``stride`` tokens after the previous one and
sees at most ``seq_len`` tokens; the ``stride`` newest positions are scored, the older ones are context.
``stride = seq_len`` (the default) gives disjoint windows, as lm-eval's rolling log-likelihood does; a
smaller stride gives each prediction more context at proportionally more compute.

Bits per byte divide the total loss (in bits) by the UTF-8 bytes of the text the tokens decode to, each
EOS-separated document decoded on its own (exact for trilm's tokenizers: decode(encode(text)) == text), so
it compares models with different tokenizers.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from tqdm import tqdm

from trilm.config import ConfigError
from trilm.data.text_source import token_stream
from trilm.eval.model import EvalModel, load_eval_model


@dataclasses.dataclass
class PerplexityResult:
    model: str
    data: str
    tokens: int
    """Tokens scored (every token of the stream)."""
    windows: int
    seq_len: int
    stride: int
    nll: float
    """Total negative log-likelihood in nats."""
    bytes: int | None

    @property
    def loss(self) -> float:
        return self.nll / self.tokens

    @property
    def ppl(self) -> float:
        return math.exp(self.loss)

    @property
    def bits_per_token(self) -> float:
        return self.loss / math.log(2)

    @property
    def bits_per_byte(self) -> float | None:
        return None if not self.bytes else self.nll / math.log(2) / self.bytes

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out.update(
            loss=self.loss, ppl=self.ppl, bits_per_token=self.bits_per_token, bits_per_byte=self.bits_per_byte
        )
        return out

    def summary(self) -> str:
        bpb = "—" if self.bits_per_byte is None else f"{self.bits_per_byte:.4f}"
        return (
            f"{self.model} on {self.data}: loss {self.loss:.4f} nats/token, perplexity {self.ppl:.3f}, "
            f"{self.bits_per_token:.4f} bits/token, {bpb} bits/byte ({self.tokens:,} tokens, "
            f"{self.windows} windows of ≤ {self.seq_len}, stride {self.stride})"
        )


def window_plan(n: int, seq_len: int, stride: int) -> list[tuple[int, int]]:
    """(input start, end) over a stream of ``n + 1`` tokens (prefix first) whose targets are positions
    1..n; a window scores positions (end − new, end], new = the tokens since the previous window."""
    if seq_len < 1 or not 1 <= stride <= seq_len:
        raise ConfigError(f"need 1 ≤ stride ≤ seq_len, got stride {stride}, seq_len {seq_len}")
    plan, done = [], 0
    while done < n:
        end = min(done + stride, n)
        plan.append((max(0, end - seq_len), end))
        done = end
    return plan


@torch.no_grad()
def stream_nll(
    em: EvalModel,
    tokens: torch.Tensor,
    *,
    seq_len: int | None = None,
    stride: int | None = None,
    batch_size: int = 8,
    progress: bool = False,
) -> tuple[float, int, int]:
    """(total nats, tokens scored, windows) of a 1-D token stream under the model."""
    seq_len = min(seq_len or em.context, em.context)
    stride = stride or seq_len
    prefix = em.prefix_token_id
    stream = tokens.long().flatten()
    if stream.numel() == 0:
        raise ConfigError("no tokens to evaluate")
    if int(stream[0]) != prefix:
        stream = torch.cat([torch.tensor([prefix]), stream])
    n = stream.numel() - 1
    if n == 0:
        raise ConfigError("no tokens to evaluate (the data holds a single token)")
    if batch_size < 1:
        raise ConfigError(f"--batch-size: must be >= 1, got {batch_size}")
    plan = window_plan(n, seq_len, stride)
    total, scored, previous = 0.0, 0, 0
    bar = None
    if progress:
        bar = tqdm(total=n, unit="tok", desc="perplexity")
    for first in range(0, len(plan), batch_size):
        batch = plan[first : first + batch_size]
        width = max(end - start for start, end in batch)
        ids = torch.full((len(batch), width), prefix, dtype=torch.long)
        for row, (start, end) in enumerate(batch):
            ids[row, : end - start] = stream[start:end]
        logprobs = F.log_softmax(em.logits(ids), dim=-1)
        for row, (start, end) in enumerate(batch):
            new = end - previous
            positions = torch.arange(end - new, end) - start  # logits at p predict token p + 1
            targets = stream[end - new + 1 : end + 1].to(logprobs.device)
            total -= float(logprobs[row, positions].gather(-1, targets[:, None]).double().sum())
            scored += new
            previous = end
            if bar is not None:
                bar.update(new)
    if bar is not None:
        bar.close()
    return total, scored, len(plan)


def text_bytes(em: EvalModel, tokens: torch.Tensor) -> int | None:
    """UTF-8 bytes of the documents the tokens decode to (EOS, BOS excluded); None without a tokenizer."""
    tok = em.tokenizer
    if tok is None:
        return None
    ids = tokens.tolist()
    total, doc = 0, list[int]()
    for t in [*ids, tok.eos_id]:
        if t == tok.eos_id:
            total += len(tok.decode([i for i in doc if i != tok.bos_id]).encode("utf-8"))
            doc = []
        else:
            doc.append(t)
    return total


def evaluate_perplexity(
    model: str | Path | EvalModel,
    data: str | Path,
    *,
    seq_len: int | None = None,
    stride: int | None = None,
    max_tokens: int | None = None,
    batch_size: int = 8,
    split: str = "validation",
    device: str = "cpu",
    progress: bool = False,
) -> PerplexityResult:
    """Perplexity of ``model`` (path or opened model) on ``data`` (see the module docstring)."""

    em = model if isinstance(model, EvalModel) else load_eval_model(model, device=device)
    tokens = token_stream(data, em.tokenizer, split=split, max_tokens=max_tokens)
    if tokens.numel() and int(tokens.max()) >= em.cfg.padded_vocab:
        raise ConfigError(
            f"{data}: token id {int(tokens.max())} is outside the model's vocabulary ({em.cfg.padded_vocab})"
        )
    if seq_len is not None and seq_len > em.context:
        raise ConfigError(f"--seq-len: {seq_len} exceeds the model's context of {em.context} tokens")
    seq_len = min(seq_len or em.context, em.context)
    stride = stride or seq_len
    nll, scored, windows = stream_nll(
        em, tokens, seq_len=seq_len, stride=stride, batch_size=batch_size, progress=progress
    )
    return PerplexityResult(
        model=str(em.path),
        data=str(data),
        tokens=scored,
        windows=windows,
        seq_len=seq_len,
        stride=stride,
        nll=nll,
        bytes=text_bytes(em, tokens),
    )
