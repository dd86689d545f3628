"""One HTTP request's engine requests: submitted together, their deltas handed to the event loop, cancelled
together when the client goes away, and the server-sent events they become.

The engine steps in its own thread; :class:`EngineRun` receives each delta through
``loop.call_soon_threadsafe`` into an asyncio queue, so a slow client never blocks the batch. A run is
submitted (and so admitted or refused, :mod:`trilm.serve.admission`) *before* a streaming response
starts, so a refusal is a plain 429/503 with ``Retry-After`` rather than an error inside a 200 stream.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from trilm.serve.admission import Rejected
from trilm.serve.engine import Delta, Engine, RequestError, RequestHandle
from trilm.serve.protocol import APIError
from trilm.serve.sampling import SamplingError


def sse(payload: dict) -> str:
    """One server-sent event carrying ``payload`` as compact JSON."""
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


SSE_DONE = "data: [DONE]\n\n"


async def guarded(events: AsyncIterator[str]) -> AsyncIterator[str]:
    """An error after the response has started goes to the client as an SSE error event."""
    try:
        async for event in events:
            yield event
    except APIError as exc:
        yield sse(exc.body())
        yield SSE_DONE


def finish_reason(delta: Delta) -> str | None:
    """OpenAI's finish reason for a delta: ``length``, ``stop`` (EOS, stop ids or strings), or None."""
    return None if delta.finish_reason is None else ("length" if delta.finish_reason == "length" else "stop")


class EngineRun:
    """The engine requests of one HTTP request (``jobs``: prompt ids and sampling parameters per choice);
    cancelled if the request ends early (disconnect)."""

    def __init__(self, engine: Engine, jobs: list[tuple[list[int], Any]]):
        self.engine, self.jobs = engine, jobs
        self.handles: list[RequestHandle] = []
        self.queue: asyncio.Queue = asyncio.Queue()
        self.texts: list[list[str]] = [[] for _ in jobs]
        self.reasons: list[str | None] = [None for _ in jobs]

    async def start(self) -> None:
        """Submit every choice, admitted together or refused together (429/503 with ``Retry-After``)."""
        loop = asyncio.get_running_loop()

        def forward(index: int):
            def on_delta(delta: Delta) -> None:
                loop.call_soon_threadsafe(self.queue.put_nowait, (index, delta))

            return on_delta

        try:
            self.handles = self.engine.submit_all(
                self.jobs, on_deltas=[forward(i) for i in range(len(self.jobs))]
            )
        except (RequestError, SamplingError) as exc:
            raise APIError(400, str(exc)) from None
        except Rejected as exc:
            raise refusal(exc) from None

    async def __aenter__(self) -> EngineRun:
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Cancel whatever has not finished (a no-op once every choice has)."""
        for h in self.handles:
            h.cancel()

    async def deltas(self) -> AsyncIterator[tuple[int, Delta]]:
        open_ = len(self.handles)
        while open_:
            index, delta = await self.queue.get()
            if delta.finish_reason == "error":
                raise APIError(500, f"the engine failed: {self.handles[index].error}")
            if delta.finish_reason == "timeout":
                raise self._timed_out(self.handles[index])
            self.texts[index].append(delta.text)
            if delta.finish_reason is not None:
                self.reasons[index] = delta.finish_reason
                open_ -= 1
            yield index, delta

    async def wait(self, request: Request) -> None:
        """Until every choice has finished, or the client went away (then the choices are cancelled)."""

        async def drain() -> None:
            async for _ in self.deltas():
                pass

        done_task = asyncio.ensure_future(drain())
        gone_task = asyncio.ensure_future(disconnected(request))
        try:
            await asyncio.wait({done_task, gone_task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone_task.cancel()
        if not done_task.done():
            done_task.cancel()
            self.close()
            raise APIError(499, "client disconnected")
        done_task.result()

    def _timed_out(self, handle: RequestHandle) -> APIError:
        seconds = f"{self.engine.limits.request_timeout:g}"
        if handle.first_token_at is None:
            retry = self.engine.occupancy.retry_after()
            return APIError(
                503,
                f"the request waited its whole request_timeout ({seconds} s) for a slot: the server is "
                f"overloaded; retry after {retry} s",
                code="request_timeout",
                headers={"Retry-After": str(retry)},
            )
        return APIError(
            504,
            f"the request did not finish within request_timeout ({seconds} s) after "
            f"{len(handle.token_ids)} tokens; its slot went to the next request",
            code="request_timeout",
        )

    def text(self, index: int) -> str:
        return "".join(self.texts[index])

    def finish(self, index: int) -> str:
        return "length" if self.reasons[index] == "length" else "stop"

    def usage(self, prompt_tokens: int) -> dict[str, int]:
        completion = sum(len(h.token_ids) for h in self.handles)
        return {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion,
        }


def refusal(exc: Rejected) -> APIError:
    """Admission's refusal as the HTTP answer: 429 (busy) or 503 (shutting down), with ``Retry-After``."""
    kind = "rate_limit_error" if exc.status == 429 else "server_error"
    headers = {"Retry-After": str(exc.retry_after)}
    return APIError(exc.status, exc.message, code=exc.reason, kind=kind, headers=headers)


class RunStream(StreamingResponse):
    """The server-sent events of one run; the run is cancelled however the response ends (finished,
    client gone — while queued as well as while generating — or failed before its first event)."""

    def __init__(self, run: EngineRun, events: AsyncIterator[str]):
        super().__init__(guarded(events), media_type="text/event-stream")
        self.run = run

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.run.close()


async def disconnected(request: Request) -> None:
    """Return once the client of ``request`` has disconnected."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
