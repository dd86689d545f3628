"""Admission control: how many requests may wait for a slot, how many prompt tokens they may hold, and how
long any request may take.

A server without these grows its queue — and every queued client's latency — without limit under
overload. With them, a request that would wait beyond the limits is refused at once (the HTTP layer
answers 429 with ``Retry-After``) and an admitted one either finishes or is ended at its deadline, which
frees its slot (its rows of the static KV cache) for the next. Admission only ever refuses *new*
requests: nothing admitted is preempted or cut short to make room, so a stream that has started is never
ended by an admission decision (only by its own deadline, its client, or the end of its generation).

"Waiting" counts the requests that would find no free slot: with ``B`` slots, ``r`` of them running and
``q`` requests submitted but not yet started, ``max(q − (B − r), 0)`` are waiting. So
``max_waiting = 0`` admits exactly as many requests as there are slots and refuses the rest.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections import deque

from trilm.config import ConfigError

REASONS = ("queue_full", "queue_tokens_full", "shutting_down")
"""Why a request was refused (``Rejected.reason``)."""


@dataclasses.dataclass(frozen=True)
class Limits:
    """``max_waiting``: requests that may wait for a slot (None: unbounded); ``max_waiting_tokens``: prompt
    tokens the waiting requests may hold together (None: unbounded; one waiting prompt is always allowed,
    so a prompt that fits the context is never refused for its length alone); ``request_timeout``: seconds
    from submission after which a request is ended, waiting or running (None: never)."""

    max_waiting: int | None = None
    max_waiting_tokens: int | None = None
    request_timeout: float | None = None

    def __post_init__(self):
        if self.max_waiting is not None and self.max_waiting < 0:
            raise ConfigError(f"max_waiting: must be >= 0 (0: no request waits), got {self.max_waiting}")
        if self.max_waiting_tokens is not None and self.max_waiting_tokens < 1:
            raise ConfigError(f"max_waiting_tokens: must be >= 1, got {self.max_waiting_tokens}")
        if self.request_timeout is not None and not self.request_timeout > 0:
            raise ConfigError(f"request_timeout: must be > 0 seconds, got {self.request_timeout}")


class Rejected(Exception):
    """A request refused by admission control; ``retry_after`` is a whole number of seconds (≥ 1)."""

    def __init__(self, reason: str, message: str, retry_after: int):
        super().__init__(message)
        self.reason, self.message, self.retry_after = reason, message, retry_after

    @property
    def status(self) -> int:
        """429 while the server is busy (come back soon), 503 while it shuts down."""
        return 503 if self.reason == "shutting_down" else 429


class Occupancy:
    """The engine's open requests as admission sees them: how many, and which have not started yet
    (with their prompt lengths, in arrival order). Submitting threads and the engine's thread share it
    under one short lock, so a decision never sees a request half-way between the queue and a slot."""

    def __init__(self, max_batch: int, limits: Limits):
        self.max_batch, self.limits = max_batch, limits
        self._lock = threading.Lock()
        self._open: set[int] = set()
        self._unstarted: dict[int, int] = {}  # request id -> prompt tokens, in arrival order
        self._started_at: dict[int, float] = {}
        self._service: deque[float] = deque(maxlen=64)  # seconds from start to end of recent requests
        self.rejected: dict[str, int] = dict.fromkeys(REASONS, 0)
        """Requests refused so far, by reason."""

    def admit(self, requests: list[tuple[int, int]]) -> None:
        """Admit all of ``requests`` (id, prompt tokens) or none: raises :class:`Rejected` when any would
        wait beyond the limits."""
        with self._lock:
            running = len(self._open) - len(self._unstarted)
            free = max(self.max_batch - running, 0)
            queue = [*self._unstarted.values(), *(n for _, n in requests)]
            waiting = queue[free:]
            limits = self.limits
            if limits.max_waiting is not None and len(waiting) > limits.max_waiting:
                raise self._refuse(
                    "queue_full",
                    f"the server is at capacity: {len(self._open)} requests hold its {self.max_batch} slots "
                    f"and its queue (max_waiting {limits.max_waiting}), no room for {len(requests)} more",
                    len(waiting) - limits.max_waiting,
                )
            if (
                limits.max_waiting_tokens is not None
                and len(waiting) > 1
                and sum(waiting) > limits.max_waiting_tokens
            ):
                raise self._refuse(
                    "queue_tokens_full",
                    f"the waiting prompts would hold {sum(waiting)} tokens, over the server's budget of "
                    f"{limits.max_waiting_tokens} (max_waiting_tokens)",
                    1,
                )
            self._open.update(rid for rid, _ in requests)
            self._unstarted.update(requests)

    def refuse_shutdown(self) -> Rejected:
        with self._lock:
            return self._refuse("shutting_down", "the server is shutting down", 1)

    def _refuse(self, reason: str, message: str, over: int) -> Rejected:
        self.rejected[reason] += 1
        retry = self.retry_after(over)
        return Rejected(reason, f"{message}; retry after {retry} s", retry)

    def retry_after(self, over: int = 1) -> int:
        """Seconds until ``over`` places free up: the slots turn over at ``max_batch`` requests per mean
        service time of recent requests (1 s before any has finished)."""
        mean = sum(self._service) / len(self._service) if self._service else 1.0
        return max(1, min(600, math.ceil(mean * over / self.max_batch)))

    def started(self, rid: int) -> None:
        with self._lock:
            self._unstarted.pop(rid, None)
            self._started_at[rid] = time.perf_counter()

    def closed(self, rid: int) -> None:
        with self._lock:
            self._open.discard(rid)
            self._unstarted.pop(rid, None)
            began = self._started_at.pop(rid, None)
            if began is not None:
                self._service.append(time.perf_counter() - began)

    def counts(self) -> tuple[int, int, int]:
        """(running, waiting for a slot, prompt tokens of the waiting) as admission counts them."""
        with self._lock:
            running = len(self._open) - len(self._unstarted)
            waiting = list(self._unstarted.values())[max(self.max_batch - running, 0) :]
            return running, len(waiting), sum(waiting)
