"""The inference engine: prefill, decode over a static KV cache, continuous batching, streaming.

::

    from trilm.serve import Engine, SamplingParams
    engine = Engine.load("runs/quickstart/trilm-tiny/snapshots/step-120")
    [out] = engine.generate(["In the beginning"], SamplingParams(max_tokens=40, temperature=0))
    for delta in engine.stream("The Python interpreter", SamplingParams(max_tokens=40)):
        print(delta.text, end="", flush=True)

Each :meth:`Engine.step` first admits waiting requests into free slots (one prefill each, which also
samples their first token), then runs **one decode step for every running sequence at once**: one token
per sequence, each at its own position, attending over its own cached keys. Finished and cancelled
sequences leave between steps and new ones join, so the batch changes from step to step (continuous
batching) while the cache keeps fixed shapes. On CUDA the decode step replays a captured CUDA graph per
batch bucket (:mod:`trilm.serve.graphs`); on CPU it runs eagerly. With ``compile=True``
(:mod:`trilm.serve.compiled`) the steps are ``torch.compile``d first, on CUDA then captured as the graphs.

The engine is driven either by the caller (``generate``/``stream`` step it in the calling thread) or by
its own background thread (:meth:`Engine.start`, used by the server); ``submit`` is thread-safe.
Admission control (:mod:`trilm.serve.admission`: how many requests may wait, their prompt tokens, each
request's deadline) is decided at submission and enforced between steps; an ``observer`` (the server's
:class:`trilm.serve.metrics.ServeMetrics`) hears of every token, step, finish and refusal.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from trilm.config import ConfigError
from trilm.data.tokenizer import Tokenizer
from trilm.infer.model import InferenceModel
from trilm.serve import loading
from trilm.serve.admission import Limits, Occupancy, Rejected
from trilm.serve.cache import KVCache
from trilm.serve.graphs import DecodeGraphs
from trilm.serve.sampling import SamplingError, SamplingParams, make_generator, sample
from trilm.serve.text import TextStream
from trilm.store.open import open_model

if TYPE_CHECKING:
    from trilm.serve.metrics import ServeMetrics

log = logging.getLogger(__name__)


class RequestError(ValueError):
    """A request the engine cannot run (empty prompt, too long for the context, ...)."""


@dataclasses.dataclass
class Delta:
    """What one step added to a request: new text, new token ids, and the finish reason once done
    (``"stop"``: EOS, a stop id or a stop string; ``"length"``: max_tokens; ``"cancelled"``; ``"timeout"``:
    the request's deadline passed; ``"error"``: the engine failed)."""

    text: str
    token_ids: list[int]
    finish_reason: str | None = None


@dataclasses.dataclass
class Completion:
    text: str
    token_ids: list[int]
    finish_reason: str
    prompt_tokens: int

    @property
    def completion_tokens(self) -> int:
        return len(self.token_ids)


_DONE = object()


class RequestHandle:
    """A submitted request: iterate it for :class:`Delta` s, or wait for its :class:`Completion`."""

    def __init__(self, rid: int, prompt_ids: list[int], params: SamplingParams, engine: Engine, on_delta):
        self.id = rid
        self.prompt_ids = prompt_ids
        self.params = params
        self.token_ids: list[int] = []
        self.text_parts: list[str] = []
        self.finish_reason: str | None = None
        self.cancelled = False
        self.error: str | None = None
        self.submitted_at = time.perf_counter()
        self.deadline: float | None = None
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self._engine = engine
        self._on_delta = on_delta
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._done = threading.Event()

    @property
    def finished(self) -> bool:
        return self._done.is_set()

    def cancel(self) -> None:
        """Stop generating; the sequence leaves the batch (and frees its slot) before the next step."""
        if not self.finished:
            self.cancelled = True
            self._engine._wake()

    def expired(self, now: float) -> bool:
        return self.deadline is not None and now >= self.deadline

    def __iter__(self) -> Iterator[Delta]:
        while True:
            while self._engine._caller_drives() and self._queue.empty() and not self.finished:
                self._engine.step()
            item = self._queue.get()
            if item is _DONE:
                return
            yield item

    def result(self, timeout: float | None = None) -> Completion:
        """Wait for the end of the request (stepping the engine when no background thread runs)."""
        while self._engine._caller_drives() and not self.finished:
            self._engine.step()
        if not self._done.wait(timeout):
            raise TimeoutError(f"request {self.id} did not finish within {timeout} s")
        if self.error is not None:
            raise RuntimeError(f"request {self.id}: the engine failed: {self.error}")
        return Completion(
            "".join(self.text_parts), list(self.token_ids), self.finish_reason or "", len(self.prompt_ids)
        )

    def _publish(self, delta: Delta) -> None:
        self.text_parts.append(delta.text)
        if delta.finish_reason is not None:
            self.finish_reason = delta.finish_reason
            self._done.set()
        if self._on_delta is not None:
            self._on_delta(delta)
        self._queue.put(delta)
        if delta.finish_reason is not None:
            self._queue.put(_DONE)


class _Sequence:
    """Engine-side state of one running request."""

    def __init__(self, handle: RequestHandle, stops: frozenset[int], text: TextStream | None):
        self.handle = handle
        self.params = handle.params
        self.generator = make_generator(handle.params.seed)
        self.stop_ids = stops
        self.text = text
        self.slot = -1
        self.position = 0  # cache positions filled = position of the next token fed
        self.last_token = -1


class Engine:
    """Serves one :class:`InferenceModel` to many concurrent requests.

    ``max_batch`` sequences run at once (the cache's slots; more requests wait); ``max_seq_len`` bounds
    prompt plus generated tokens (default: the model context). ``cuda_graphs`` (default: on for CUDA)
    captures the decode step per batch bucket; ``compile`` runs compiled prefill and decode steps
    (:mod:`trilm.serve.compiled`) instead of eager ones, on CUDA captured as the graphs. ``limits`` bound
    the waiting requests and each request's time (default: unbounded, as a library caller batching its
    own prompts expects).
    """

    def __init__(
        self,
        model: InferenceModel,
        tokenizer: Tokenizer | None = None,
        *,
        max_batch: int = 32,
        max_seq_len: int | None = None,
        cuda_graphs: bool | None = None,
        compile: bool = False,
        limits: Limits | None = None,
    ):
        self.model = model.eval()
        self.cfg = model.cfg
        self.tokenizer = tokenizer
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.max_seq_len = max_seq_len or self.cfg.context
        if not 2 <= self.max_seq_len <= self.cfg.context:
            raise ConfigError(
                f"max_seq_len: must be in [2, {self.cfg.context}] (the model context), got {max_seq_len}"
            )
        if max_batch < 1:
            raise ConfigError(f"max_batch: must be >= 1, got {max_batch}")
        self.max_batch = max_batch
        self.limits = limits or Limits()
        self.occupancy = Occupancy(max_batch, self.limits)
        self.observer: ServeMetrics | None = None
        """Told of every token, decode step, finish and refusal (duck-typed; see ``ServeMetrics``)."""
        self.vocab_size = tokenizer.vocab_size if tokenizer is not None else self.cfg.vocab_size
        if self.vocab_size > self.cfg.padded_vocab:
            raise ConfigError(
                f"tokenizer vocabulary {self.vocab_size} exceeds the model's embedding "
                f"{self.cfg.padded_vocab}"
            )
        self.cache = KVCache(self.cfg, max_batch, self.max_seq_len, device=self.device, dtype=self.dtype)
        if cuda_graphs is None:
            cuda_graphs = self.device.type == "cuda"
        self.graphs = None
        self.compiled = None
        if cuda_graphs and self.device.type != "cuda":
            raise ConfigError(f"cuda_graphs: CUDA graphs need the model on CUDA, not on {self.device}")
        if compile and self.device.type not in ("cpu", "cuda"):
            raise ConfigError(f"compile: the compiled steps run on CPU or CUDA, not on {self.device}")
        if compile:
            # deferred for start-up time: loads torch._dynamo (and triton) only when compiling
            from trilm.serve.compiled import CompiledSteps

            self.compiled = CompiledSteps(model, self.cache, capture=cuda_graphs)
        elif cuda_graphs:
            self.graphs = DecodeGraphs(model, self.cache)
        self.notes: list[str] = []
        """What loading decided that a user should hear (``Engine.load``)."""
        self.waiting: deque[_Sequence] = deque()
        self.running: list[_Sequence] = []
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._ids = itertools.count()
        self._step_lock = threading.Lock()
        self._wakeup = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.finished: dict[str, int] = dict.fromkeys(("stop", "length", "cancelled", "timeout", "error"), 0)
        """Requests ended so far, by finish reason."""

    # -- construction ---------------------------------------------------------------------------------
    @classmethod
    def load(
        cls,
        path: str | Path,
        *,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        packed: bool = False,
        backend: str = "auto",
        prepack: bool = True,
        fuse: bool = True,
        tokenizer: Tokenizer | str | Path | None = None,
        **engine_kwargs,
    ) -> Engine:
        """An engine over any model directory :func:`trilm.store.open_model` opens, and its tokenizer.

        Defaults (device, dtype, tokenizer) and what ``packed``, ``fuse`` and ``prepack`` do are decided in
        :mod:`trilm.serve.loading`; its notes for the user are kept in :attr:`notes`. The model directory
        is opened once, by the store (:func:`trilm.store.open_model`): weights verified, the tokenizer the
        model's own unless one is given (a path is checked against the model's recorded hash too).
        """

        resolved = loading.resolve_device(device)
        dtype = loading.resolve_dtype(resolved, dtype, packed, backend)
        opened = open_model(path, tokenizer=None if isinstance(tokenizer, Tokenizer) else tokenizer)
        tokenizer = loading.resolve_tokenizer(opened, tokenizer)
        model, notes = loading.load_model(
            opened, device=resolved, dtype=dtype, packed=packed, backend=backend, prepack=prepack, fuse=fuse
        )
        opened.weights.release()
        engine = cls(model, tokenizer, **engine_kwargs)
        engine.notes = notes
        return engine

    # -- requests -------------------------------------------------------------------------------------
    def encode(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise RequestError("prompt: text needs a tokenizer (this engine has none); pass token ids")
            return self.tokenizer.encode(prompt)
        ids = [int(t) for t in prompt]
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise RequestError(f"prompt: token ids {bad[:3]} outside the vocabulary [0, {self.vocab_size})")
        return ids

    def check(self, prompt_ids: list[int], params: SamplingParams) -> None:
        """Raise :class:`RequestError` when the request cannot run (named field, limits stated)."""
        if not prompt_ids:
            raise RequestError("prompt: must not be empty")
        n = len(prompt_ids)
        if n >= self.max_seq_len:
            raise RequestError(
                f"prompt: {n} tokens leave no room to generate within the context of "
                f"{self.max_seq_len} tokens"
            )
        if n + params.max_tokens > self.max_seq_len:
            raise RequestError(
                f"max_tokens: prompt ({n} tokens) + max_tokens ({params.max_tokens}) exceeds the context of "
                f"{self.max_seq_len} tokens (at most {self.max_seq_len - n} new tokens fit)"
            )
        if params.stop and self.tokenizer is None:
            raise RequestError("stop: stop strings need a tokenizer (this engine has none)")

    def submit(
        self,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        *,
        on_delta: Callable[[Delta], None] | None = None,
    ) -> RequestHandle:
        """Queue a request (text or token ids); it joins the running batch at the next step.

        ``on_delta`` is called from the stepping thread for every delta (the server uses it to hand
        deltas to its event loop). Raises :class:`~trilm.serve.admission.Rejected` when the limits
        refuse it."""
        [handle] = self.submit_all([(prompt, params)], on_deltas=None if on_delta is None else [on_delta])
        return handle

    def submit_all(
        self,
        jobs: Sequence[tuple[str | list[int], SamplingParams | None]],
        *,
        on_deltas: list[Callable[[Delta], None]] | None = None,
    ) -> list[RequestHandle]:
        """Queue several requests (one HTTP request's choices) together: every one is checked first, and
        admission takes all of them or refuses all (:class:`~trilm.serve.admission.Rejected`)."""
        prepared = []
        for prompt, params in jobs:
            params = params or SamplingParams()
            if not isinstance(params, SamplingParams):
                raise SamplingError(f"params: expected SamplingParams, got {type(params).__name__}")
            ids = self.encode(prompt)
            self.check(ids, params)
            prepared.append((ids, params))
        callbacks: Sequence[Callable[[Delta], None] | None] = on_deltas or [None] * len(prepared)
        handles = [
            RequestHandle(next(self._ids), ids, params, self, callback)
            for (ids, params), callback in zip(prepared, callbacks)
        ]
        try:
            if self._stopping:
                raise self.occupancy.refuse_shutdown()
            self.occupancy.admit([(h.id, len(h.prompt_ids)) for h in handles])
        except Rejected as exc:
            if self.observer is not None:
                self.observer.on_rejected(exc.reason)
            raise
        timeout = self.limits.request_timeout
        for handle in handles:
            if timeout is not None:
                handle.deadline = handle.submitted_at + timeout
            self._inbox.put(handle)
        self._wake()
        return handles

    def generate(
        self, prompts: list[str | list[int]] | str, params: SamplingParams | None = None
    ) -> list[Completion]:
        """Completions of ``prompts`` (all batched together); one prompt may be given as a string."""
        if isinstance(prompts, str):
            prompts = [prompts]
        handles = self.submit_all([(p, params) for p in prompts])
        return [h.result() for h in handles]

    def stream(self, prompt: str | list[int], params: SamplingParams | None = None) -> Iterator[Delta]:
        """The deltas of one request as they are produced."""
        handle = self.submit(prompt, params)
        try:
            yield from handle
        finally:
            handle.cancel()

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting) + self._inbox.qsize()

    # -- the scheduler --------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self) -> bool:
        """Admit waiting requests, then decode one token for every running sequence.
        Returns whether requests remain (running or waiting)."""
        with self._step_lock:
            self._take_inbox()
            self._drop_ended()
            while self.waiting and len(self.running) < self.max_batch:
                seq = self.waiting.popleft()
                ended = self._ended(seq, time.perf_counter())
                if ended is not None:
                    self._finish(seq, ended)
                    continue
                self._prefill(seq)
            if self.running:
                self._decode()
            return bool(self.running or self.waiting)

    def _take_inbox(self) -> None:
        while True:
            try:
                handle = self._inbox.get_nowait()
            except queue.Empty:
                return
            stops = set(handle.params.stop_token_ids)
            text = None
            if self.tokenizer is not None:
                if not handle.params.ignore_eos:
                    stops.add(self.tokenizer.eos_id)
                text = TextStream(self.tokenizer, handle.prompt_ids, handle.params.stop)
            self.waiting.append(_Sequence(handle, frozenset(stops), text))

    @staticmethod
    def _ended(seq: _Sequence, now: float) -> str | None:
        """Why a request must leave before its next token: its client cancelled it, or its deadline passed."""
        if seq.handle.cancelled:
            return "cancelled"
        return "timeout" if seq.handle.expired(now) else None

    def _drop_ended(self) -> None:
        now = time.perf_counter()
        for seq, reason in [(s, r) for s in self.waiting if (r := self._ended(s, now)) is not None]:
            self.waiting.remove(seq)
            self._finish(seq, reason)
        gone = [(s, r) for s in self.running if (r := self._ended(s, now)) is not None]
        for seq, reason in gone:
            self._finish(seq, reason)
        if gone:
            self._compact()

    def _prefill(self, seq: _Sequence) -> None:
        ids = seq.handle.prompt_ids
        slot = len(self.running)
        self.occupancy.started(seq.handle.id)
        if self.observer is not None:
            self.observer.on_start(seq.handle, time.perf_counter())
        if self.compiled is not None:
            logits = self.compiled.prefill(ids, slot)
        else:
            tokens = torch.tensor([ids], device=self.device)
            logits = self.model.forward_cached(
                tokens, len(ids), self.cache.prefill(slot, len(ids)), last_only=True
            )
        seq.slot, seq.position = slot, len(ids)
        [token] = sample(logits[:, -1], [seq.params], [seq.generator], self.vocab_size)
        now = time.perf_counter()
        seq.handle.first_token_at = now
        if not self._advance(seq, token, now):
            self.running.append(seq)

    def _decode(self) -> None:
        seqs = self.running
        tokens = [s.last_token for s in seqs]
        positions = [s.position for s in seqs]
        if self.graphs is not None:
            logits = self.graphs.run(tokens, positions)
        elif self.compiled is not None:
            logits = self.compiled.run(tokens, positions)
        else:
            logits = self._decode_eager(tokens, positions)
        picked = sample(logits, [s.params for s in seqs], [s.generator for s in seqs], self.vocab_size)
        now = time.perf_counter()
        if self.observer is not None:
            self.observer.on_decode(len(seqs))
        done = False
        for seq, token in zip(seqs, picked):
            seq.position += 1
            done |= self._advance(seq, token, now)
        if done:
            self._compact()

    def _decode_eager(self, tokens: list[int], positions: list[int]) -> torch.Tensor:
        n = len(tokens)
        pos = torch.tensor(positions, device=self.device)
        span = max(positions) + 1
        step = self.cache.decode(n, span, pos, masked=min(positions) != span - 1)
        ids = torch.tensor(tokens, device=self.device).unsqueeze(1)
        return self.model.forward_cached(ids, pos.unsqueeze(1), step)[:, 0]

    def _advance(self, seq: _Sequence, token: int, now: float) -> bool:
        """Record a sampled token; returns True when the sequence has finished."""
        handle = seq.handle
        if self.observer is not None:
            self.observer.on_token(handle, now)
        handle.last_token_at = now
        handle.token_ids.append(token)
        seq.last_token = token
        text, reason = "", None
        if token in seq.stop_ids:
            reason = "stop"
        elif seq.text is not None:
            text = seq.text.push(token)
            if seq.text.stopped:
                reason = "stop"
        if reason is None and len(handle.token_ids) >= seq.params.max_tokens:
            reason = "length"
        if reason is not None:
            if seq.text is not None:
                text += seq.text.finish()
            self._close(seq, reason)
        handle._publish(Delta(text, [token], reason))
        return reason is not None

    def _finish(self, seq: _Sequence, reason: str) -> None:
        if seq.handle.finished:  # ended within a step that then failed: already closed once
            return
        self._close(seq, reason)
        text = seq.text.finish() if seq.text is not None and reason != "cancelled" else ""
        seq.handle._publish(Delta(text, [], reason))

    def _close(self, seq: _Sequence, reason: str) -> None:
        """The one place a request ends: its slot, its place in admission's count, the tallies."""
        seq.slot = -1
        self.finished[reason] += 1
        self.occupancy.closed(seq.handle.id)
        if self.observer is not None:
            self.observer.on_finish(seq.handle, reason)

    def _compact(self) -> None:
        """Drop finished sequences and move the last running ones into the freed slots."""
        keep = [s for s in self.running if s.slot >= 0]
        n = len(keep)
        taken = {s.slot for s in keep if s.slot < n}
        holes = [i for i in range(n) if i not in taken]
        movers = [s for s in keep if s.slot >= n]
        for hole, seq in zip(holes, movers):
            self.cache.move(seq.slot, hole, seq.position)
            seq.slot = hole
        self.running = sorted(keep, key=lambda s: s.slot)

    # -- background loop ------------------------------------------------------------------------------
    def start(self) -> Engine:
        """Run the scheduler in a background thread until :meth:`stop`."""
        if self._thread is None:
            self._stopping = False
            self._thread = threading.Thread(target=self._loop, name="trilm-engine", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the background thread; requests still open are cancelled."""
        if self._thread is None:
            return
        self._stopping = True
        self._wake()
        self._thread.join(timeout)
        stuck = self._thread.is_alive()
        self._thread = None
        with self._step_lock:
            self._take_inbox()
            for seq in [*self.waiting, *self.running]:
                self._finish(seq, "cancelled")
            self.waiting.clear()
            self.running = []
        self._stopping = stuck  # a stopped engine may be driven by its caller again

    def _loop(self) -> None:
        while not self._stopping:
            try:
                busy = self.step()
            except Exception as exc:  # a failed step must not leave its clients waiting forever
                log.exception("engine step failed; failing the open requests")
                self._fail_all(exc)
                busy = False
            if not busy:
                self._wakeup.wait(0.5)
                self._wakeup.clear()

    def _fail_all(self, exc: Exception) -> None:
        with self._step_lock:
            self._take_inbox()
            for seq in [*self.waiting, *self.running]:
                seq.handle.error = f"{type(exc).__name__}: {exc}"
                self._finish(seq, "error")
            self.waiting.clear()
            self.running = []

    def _wake(self) -> None:
        self._wakeup.set()

    def _caller_drives(self) -> bool:
        return self._thread is None
