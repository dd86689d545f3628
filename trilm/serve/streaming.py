"""One HTTP request's engine requests: submitted together, their deltas handed to the event loop, cancelled
together when the client goes away, and the server-sent events they become.

The engine steps in its own thread; :class:`EngineRun` receives each delta through
``loop.call_soon_threadsafe`` into an asyncio queue, so a slow client never blocks the batch.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request

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

    async def __aenter__(self) -> EngineRun:
        loop = asyncio.get_running_loop()
        for index, (ids, params) in enumerate(self.jobs):

            def on_delta(delta: Delta, index=index) -> None:
                loop.call_soon_threadsafe(self.queue.put_nowait, (index, delta))

            try:
                self.handles.append(self.engine.submit(ids, params, on_delta=on_delta))
            except (RequestError, SamplingError) as exc:
                self._cancel()
                raise APIError(400, str(exc)) from None
        return self

    async def __aexit__(self, *exc) -> None:
        self._cancel()

    def _cancel(self) -> None:
        for h in self.handles:
            h.cancel()

    async def deltas(self) -> AsyncIterator[tuple[int, Delta]]:
        open_ = len(self.handles)
        while open_:
            index, delta = await self.queue.get()
            if delta.finish_reason == "error":
                raise APIError(500, f"the engine failed: {self.handles[index].error}")
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
            self._cancel()
            raise APIError(499, "client disconnected")
        done_task.result()

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


async def disconnected(request: Request) -> None:
    """Return once the client of ``request`` has disconnected."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
