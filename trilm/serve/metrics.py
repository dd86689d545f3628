"""``/metrics``: the server's state and history in Prometheus' text format, through ``prometheus_client``.

The engine tells a :class:`ServeMetrics` (its ``observer``) of every start, token, decode step, finish
and refusal, from its own thread; counters and histograms take them as they come (``prometheus_client``'s
metrics are thread-safe). What is a *state* — requests running and waiting, the KV cache's slots in use —
is read from the engine when Prometheus scrapes, so it can never drift from what ``/health`` shows.

Each app has its own registry (several servers in one process, as in the tests, do not mix). Names
follow Prometheus' conventions (``_total`` counters, ``_seconds`` histograms) under the ``trilm_`` prefix.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

from trilm.serve.admission import REASONS

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

FINISH_REASONS = ("stop", "length", "cancelled", "timeout", "error")
REJECT_REASONS = (*REASONS, "unauthorized")

TTFT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 60, 120)
"""Time to first token, seconds: a tiny CPU model's few milliseconds up to a long queue's minutes."""
ITL_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.15, 0.3, 0.6, 1.2, 2.5, 5)
"""Between two tokens of one request, seconds (one decode step, plus a prefill that lands between)."""
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640)
"""Submission to last token, and submission to start (queue time), seconds."""


class ServeMetrics:
    """The metrics of one served engine; :meth:`render` is the ``/metrics`` body."""

    def __init__(self, engine):
        self.engine = engine
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.finished = Counter(
            "trilm_requests_finished", "Requests ended, by reason", ["reason"], registry=r
        )
        self.rejected = Counter(
            "trilm_requests_rejected",
            "Requests refused before running: queue_full, queue_tokens_full (admission limits), "
            "shutting_down, unauthorized (missing or wrong API key)",
            ["reason"],
            registry=r,
        )
        for reason in FINISH_REASONS:
            self.finished.labels(reason)
        for reason in REJECT_REASONS:
            self.rejected.labels(reason)
        self.prompt_tokens = Counter("trilm_prompt_tokens", "Prompt tokens prefilled", registry=r)
        self.generation_tokens = Counter("trilm_generation_tokens", "Tokens generated", registry=r)
        self.decode_steps = Counter("trilm_engine_decode_steps", "Decode steps of the batch", registry=r)
        self.ttft = Histogram(
            "trilm_time_to_first_token_seconds",
            "Submission to first generated token (queue time and prefill)",
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "trilm_inter_token_latency_seconds",
            "Time between consecutive tokens of one request",
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.latency = Histogram(
            "trilm_request_latency_seconds",
            "Submission to end of a request that finished (stop or length)",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_time = Histogram(
            "trilm_request_queue_seconds",
            "Submission to the start of its prefill (time spent waiting for a slot)",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch = Histogram(
            "trilm_engine_batch_size_per_step",
            "Sequences decoded together, per decode step",
            buckets=_powers_of_two(engine.max_batch),
            registry=r,
        )
        self._last_batch = 0
        r.register(_EngineState(self))

    def render(self) -> bytes:
        return generate_latest(self.registry)

    # -- the engine's observer hooks (called from the stepping thread) ----------------------------------
    def on_start(self, handle, now: float) -> None:
        self.queue_time.observe(now - handle.submitted_at)
        self.prompt_tokens.inc(len(handle.prompt_ids))

    def on_token(self, handle, now: float) -> None:
        self.generation_tokens.inc()
        if handle.last_token_at is None:
            self.ttft.observe(now - handle.submitted_at)
        else:
            self.itl.observe(now - handle.last_token_at)

    def on_decode(self, batch: int) -> None:
        self.decode_steps.inc()
        self.batch.observe(batch)
        self._last_batch = batch

    def on_finish(self, handle, reason: str) -> None:
        self.finished.labels(reason).inc()
        if reason in ("stop", "length") and handle.last_token_at is not None:
            self.latency.observe(handle.last_token_at - handle.submitted_at)

    def on_rejected(self, reason: str) -> None:
        self.rejected.labels(reason).inc()


class _EngineState:
    """Gauges read from the engine at scrape time."""

    def __init__(self, metrics: ServeMetrics):
        self.metrics = metrics

    def describe(self):
        return []

    def collect(self):
        m = self.metrics
        engine = m.engine
        running = list(engine.running)
        _, waiting, waiting_tokens = engine.occupancy.counts()
        limits = engine.limits
        cache_positions = engine.max_batch * engine.max_seq_len
        yield _gauge(
            "trilm_requests_running", "Requests in the batch (holding a KV-cache slot)", len(running)
        )
        yield _gauge("trilm_requests_waiting", "Admitted requests that found no free slot yet", waiting)
        yield _gauge(
            "trilm_requests_waiting_prompt_tokens", "Prompt tokens of the waiting requests", waiting_tokens
        )
        yield _gauge(
            "trilm_requests_waiting_limit",
            "max_waiting (-1: unbounded)",
            -1 if limits.max_waiting is None else limits.max_waiting,
        )
        yield _gauge(
            "trilm_kv_cache_blocks_in_use",
            "KV-cache blocks held by running sequences; the static cache has one block (slot) of "
            "max_seq_len positions per sequence",
            len(running),
        )
        yield _gauge("trilm_kv_cache_blocks_total", "KV-cache blocks (slots, = max_batch)", engine.max_batch)
        yield _gauge(
            "trilm_kv_cache_usage_ratio",
            "Cached positions filled by running sequences over all positions of the cache",
            sum(max(s.position, 0) for s in running) / cache_positions,
        )
        yield _gauge("trilm_engine_batch_size", "Sequences in the last decode step", m._last_batch)
        yield _gauge(
            "trilm_engine_max_batch", "Sequences decoded together at most (max_batch)", engine.max_batch
        )


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


def _powers_of_two(limit: int) -> tuple[float, ...]:
    buckets, b = [], 1
    while b < limit:
        buckets.append(b)
        b *= 2
    return (*buckets, limit)
