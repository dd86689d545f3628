"""CUDA graphs of the decode step, one per (batch bucket, attention-span bucket).

A decode step of a small model is hundreds of tiny kernels; launched from Python each costs more than its
work (one FloatLM-1.1B token measured 14.5 ms eager vs 1.94 ms as a graph). A graph replays
all of them with one launch. Graphs need fixed shapes and addresses, so:

- inputs go through static buffers (token ids, RoPE positions, cache write positions);
- a batch of ``n`` running sequences replays the graph of the smallest bucket ≥ n (1, 2, 4, 8, 16, 32, …);
  its ``bucket − n`` padding rows read token 0 and write their keys to the cache's scratch position, so
  live positions are never touched (the running sequences occupy slots 0..n−1, see ``trilm.serve.cache``);
- attention reads the first ``span`` cached positions, with ``span`` a power-of-two bucket ≥ 128 (capped
  at the cache length), so a short context does not pay for attention over the whole cache.

Graphs are captured lazily on first use (a warm-up run first, so kernels pick their launch plans outside
the capture) and share one memory pool. Capture writes only to the scratch position, so it is safe while
other sequences are running.
"""

from __future__ import annotations

import torch

from trilm.infer.model import InferenceModel
from trilm.serve.cache import KVCache

MIN_SPAN = 128


def buckets(limit: int, start: int = 1) -> list[int]:
    """Powers of two from ``start`` below ``limit``, then ``limit`` itself."""
    out, b = [], start
    while b < limit:
        out.append(b)
        b *= 2
    return [*out, limit]


class DecodeGraphs:
    """Replays captured decode steps; the same logits as the eager decode of the same batch."""

    def __init__(self, model: InferenceModel, cache: KVCache, *, capture: bool = True):
        """``capture=False`` runs the same bucketed static-buffer step eagerly instead of replaying a
        graph: how the bucketing, padding rows and scratch writes are tested without a GPU."""
        self.model, self.cache, self.capture = model, cache, capture
        device = cache._rows.device
        if capture and device.type != "cuda":
            raise RuntimeError(f"CUDA graphs need the model and cache on CUDA, not {device}")
        self.batch_buckets = buckets(cache.slots)
        self.span_buckets = buckets(cache.max_len, start=min(MIN_SPAN, cache.max_len))
        self.tokens = torch.zeros(cache.slots, 1, dtype=torch.long, device=device)
        self.rope_positions = torch.zeros(cache.slots, 1, dtype=torch.long, device=device)
        self.write_positions = torch.full((cache.slots,), cache.scratch, dtype=torch.long, device=device)
        self._staging = torch.zeros(2, cache.slots, dtype=torch.long, pin_memory=capture)
        self._graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph | None, torch.Tensor | None]] = {}
        self._pool = None

    def bucket(self, n: int, span: int) -> tuple[int, int]:
        return (
            next(b for b in self.batch_buckets if b >= n),
            next(s for s in self.span_buckets if s >= span),
        )

    @torch.no_grad()
    def run(self, tokens: list[int], positions: list[int]) -> torch.Tensor:
        """Logits [n, padded_vocab] of one decode step of slots 0..n−1."""
        n = len(tokens)
        key = self.bucket(n, max(positions) + 1)
        b = key[0]
        if key not in self._graphs:
            self._graphs[key] = self._capture(*key)
        self._stage(tokens, positions, b)
        if not self.capture:
            return self._step(*key)[:n]
        graph, logits = self._graphs[key]
        assert graph is not None and logits is not None  # captured: self.capture is set
        graph.replay()
        return logits[:n]

    def _stage(self, tokens: list[int], positions: list[int], b: int) -> None:
        """Inputs of this step into the static buffers; rows n..b−1 are padding (token 0 → scratch)."""
        n = len(tokens)
        staging = self._staging
        staging[0, :n] = torch.tensor(tokens)
        staging[1, :n] = torch.tensor(positions)
        staging[:, n:b] = 0
        self.tokens[:b, 0].copy_(staging[0, :b], non_blocking=True)
        self.rope_positions[:b, 0].copy_(staging[1, :b], non_blocking=True)
        self.write_positions[:n].copy_(staging[1, :n], non_blocking=True)
        self.write_positions[n:b].fill_(self.cache.scratch)

    def _step(self, batch: int, span: int) -> torch.Tensor:
        step = self.cache.decode(batch, span, self.write_positions[:batch])
        out = self.model.forward_cached(self.tokens[:batch], self.rope_positions[:batch], step)
        return out[:, 0]

    def _capture(self, batch: int, span: int) -> tuple[torch.cuda.CUDAGraph | None, torch.Tensor | None]:
        """Warm up and capture on scratch inputs (live sequences may be running in slots < batch)."""
        self.tokens[:batch].zero_()
        self.rope_positions[:batch].zero_()
        self.write_positions[:batch].fill_(self.cache.scratch)
        if not self.capture:  # the same runs, eagerly (what the CPU tests check)
            for _ in range(3):
                self._step(batch, span)
            return None, None
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self._step(batch, span)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            logits = self._step(batch, span)
        self._pool = graph.pool()
        return graph, logits

    @torch.no_grad()
    def capture_all(self) -> int:
        """Capture every bucket now (server start-up), instead of on first use; returns the count."""
        for b in self.batch_buckets:
            for s in self.span_buckets:
                if (b, s) not in self._graphs:
                    self._graphs[(b, s)] = self._capture(b, s)
        return len(self._graphs)
