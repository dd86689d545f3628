"""The OpenAI-compatible HTTP server (FastAPI on uvicorn) over one :class:`Engine`.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions`` (both with SSE streaming), ``GET /v1/models``,
``GET /v1/models/{id}``, ``GET /health``. The engine runs in its own thread; each HTTP request submits its
choices and receives their deltas on the event loop through ``call_soon_threadsafe``, so a slow client
never blocks the batch. When a client disconnects, its requests are cancelled and leave the batch at the
next step. Bad requests get a 4xx answer in OpenAI's error shape, with a message naming the field.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from trilm.serve.chat import CHAT_STOP, ReplyText, render_chat
from trilm.serve.engine import Delta, Engine, RequestError, RequestHandle
from trilm.serve.protocol import APIError, ChatRequest, CompletionRequest
from trilm.serve.sampling import SamplingError

DEFAULT_COMPLETION_TOKENS = 16
"""``max_tokens`` of a completion that gives none (OpenAI's default), capped by the context left."""


def create_app(engine: Engine, model_id: str, *, manage_engine: bool = True) -> FastAPI:
    """The app serving ``engine`` under the name ``model_id``; with ``manage_engine`` its lifespan starts
    and stops the engine's background thread."""
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if manage_engine:
            engine.start()
        try:
            yield
        finally:
            if manage_engine:
                engine.stop()

    app = FastAPI(title="trilm", lifespan=lifespan)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(SamplingError)
    @app.exception_handler(RequestError)
    async def _bad_request(request: Request, exc: ValueError):
        message = str(exc)
        return JSONResponse(APIError(400, message, message.split(":", 1)[0]).body(), status_code=400)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        return JSONResponse(_validation_error(exc).body(), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        return JSONResponse(APIError(exc.status_code, str(exc.detail)).body(), status_code=exc.status_code)

    def model_card() -> dict[str, Any]:
        return {"id": model_id, "object": "model", "created": created, "owned_by": "trilm"}

    @app.get("/health")
    async def health():
        return {
            "status": "ok",
            "model": model_id,
            "running": engine.num_running,
            "waiting": engine.num_waiting,
            "max_batch": engine.max_batch,
            "max_seq_len": engine.max_seq_len,
            "finished": dict(engine.finished),
        }

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{name:path}")
    async def model(name: str):
        _check_model(name, model_id)
        return model_card()

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        _check_model(body.model, model_id)
        body.refuse_unsupported()
        given = body.prompts()
        fields = [f"prompt[{i}]" if len(given) > 1 else "prompt" for i in range(len(given))]
        prompts = [_encode(engine, p, field) for p, field in zip(given, fields)]
        jobs = []
        for ids, field in zip(prompts, fields):
            max_tokens = _max_tokens(engine, ids, body.max_tokens, DEFAULT_COMPLETION_TOKENS)
            for j in range(body.n):
                params = body.sampling(max_tokens, index=j)
                _check(engine, ids, params, field)
                jobs.append((ids, params))
        echo = [engine.tokenizer.decode(ids) if body.echo and engine.tokenizer else "" for ids, _ in jobs]
        rid, now = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        prompt_tokens = sum(len(ids) for ids in prompts)

        def chunk(index: int, text: str, finish: str | None) -> dict:
            choice = {"index": index, "text": text, "logprobs": None, "finish_reason": finish}
            return {
                "id": rid,
                "object": "text_completion",
                "created": now,
                "model": model_id,
                "choices": [choice],
            }

        run = _Run(engine, jobs)
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)

            async def events() -> AsyncIterator[str]:
                async with run:
                    for i, text in enumerate(echo):
                        if text:
                            yield _sse(chunk(i, text, None))
                    async for index, delta in run.deltas():
                        if delta.text or delta.finish_reason:
                            yield _sse(chunk(index, delta.text, _finish(delta)))
                    if include_usage:
                        yield _sse(
                            {
                                "id": rid,
                                "object": "text_completion",
                                "created": now,
                                "model": model_id,
                                "choices": [],
                                "usage": run.usage(prompt_tokens),
                            }
                        )
                    yield "data: [DONE]\n\n"

            return StreamingResponse(_guarded(events()), media_type="text/event-stream")
        async with run:
            await run.wait(request)
        choices = [
            {"index": i, "text": echo[i] + run.text(i), "logprobs": None, "finish_reason": run.finish(i)}
            for i in range(len(jobs))
        ]
        return {
            "id": rid,
            "object": "text_completion",
            "created": now,
            "model": model_id,
            "choices": choices,
            "usage": run.usage(prompt_tokens),
        }

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatRequest, request: Request):
        _check_model(body.model, model_id)
        body.refuse_unsupported()
        if engine.tokenizer is None:
            raise APIError(400, "messages: this model has no tokenizer, chat needs one", "messages")
        try:
            prompt = render_chat([(m.role, m.text()) for m in body.messages])
        except ValueError as exc:
            raise APIError(400, str(exc), "messages") from None
        ids = _encode(engine, prompt, "messages")
        max_tokens = _max_tokens(engine, ids, body.requested_max_tokens, None)
        jobs = [(ids, body.sampling(max_tokens, CHAT_STOP, index=j)) for j in range(body.n)]
        for job in jobs:
            _check(engine, *job, prompt_field="messages")
        rid, now = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())

        def chunk(index: int, delta: dict, finish: str | None) -> dict:
            return {
                "id": rid,
                "object": "chat.completion.chunk",
                "created": now,
                "model": model_id,
                "choices": [{"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}],
            }

        run = _Run(engine, jobs)
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)

            async def events() -> AsyncIterator[str]:
                async with run:
                    replies = [ReplyText() for _ in jobs]
                    for i in range(len(jobs)):
                        yield _sse(chunk(i, {"role": "assistant", "content": ""}, None))
                    async for index, delta in run.deltas():
                        text = replies[index](delta.text)
                        if text:
                            yield _sse(chunk(index, {"content": text}, None))
                        if delta.finish_reason:
                            yield _sse(chunk(index, {}, _finish(delta)))
                    if include_usage:
                        yield _sse(
                            {
                                "id": rid,
                                "object": "chat.completion.chunk",
                                "created": now,
                                "model": model_id,
                                "choices": [],
                                "usage": run.usage(len(ids)),
                            }
                        )
                    yield "data: [DONE]\n\n"

            return StreamingResponse(_guarded(events()), media_type="text/event-stream")
        async with run:
            await run.wait(request)
        choices = [
            {
                "index": i,
                "message": {"role": "assistant", "content": ReplyText()(run.text(i))},
                "logprobs": None,
                "finish_reason": run.finish(i),
            }
            for i in range(len(jobs))
        ]
        return {
            "id": rid,
            "object": "chat.completion",
            "created": now,
            "model": model_id,
            "choices": choices,
            "usage": run.usage(len(ids)),
        }

    return app


# -- helpers ------------------------------------------------------------------------------------------
def _check_model(name: str, model_id: str) -> None:
    if name != model_id:
        raise APIError(
            404, f"model {name!r} not found; this server serves {model_id!r}", "model", "model_not_found"
        )


def _encode(engine: Engine, prompt: str | list[int], field: str) -> list[int]:
    try:
        ids = engine.encode(prompt)
    except RequestError as exc:
        raise APIError(400, str(exc).replace("prompt:", f"{field}:", 1), field) from None
    if not ids:
        raise APIError(400, f"{field}: must not be empty", field)
    return ids


def _max_tokens(engine: Engine, ids: list[int], requested: int | None, default: int | None) -> int:
    if requested is not None:
        return requested
    room = max(engine.max_seq_len - len(ids), 1)
    return room if default is None else min(default, room)


def _check(engine: Engine, ids: list[int], params, prompt_field: str = "prompt") -> None:
    try:
        engine.check(ids, params)
    except RequestError as exc:
        field, _, detail = str(exc).partition(":")
        if field == "prompt":
            field = prompt_field
        raise APIError(400, f"{field}:{detail}", field) from None


def _finish(delta: Delta) -> str | None:
    return None if delta.finish_reason is None else ("length" if delta.finish_reason == "length" else "stop")


async def _guarded(events: AsyncIterator[str]) -> AsyncIterator[str]:
    """An error after the response has started goes to the client as an SSE error event."""
    try:
        async for event in events:
            yield event
    except APIError as exc:
        yield _sse(exc.body())
        yield "data: [DONE]\n\n"


def _sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


UNION_FIELDS = {
    "prompt": "a string, a list of strings, a list of token ids or a list of token-id lists",
    "stop": "a string or a list of strings",
    "content": "a string or a list of text parts",
}


def _validation_error(exc: RequestValidationError) -> APIError:
    errors = exc.errors()
    if not errors:
        return APIError(400, "invalid request")
    first = errors[0]
    if first.get("type") == "json_invalid":
        detail = (first.get("ctx") or {}).get("error", "")
        return APIError(400, f"malformed JSON body: {detail}".rstrip(": "))
    loc = [str(x) for x in first.get("loc", ()) if x != "body"]
    if not loc:
        return APIError(400, "body: must be a JSON object")
    for i, part in enumerate(loc):
        if part in UNION_FIELDS and i + 1 < len(loc) and not loc[i + 1].isdigit():
            field = ".".join(loc[: i + 1])
            return APIError(400, f"{field}: must be {UNION_FIELDS[part]}", loc[0])
    field = ".".join(loc)
    if first.get("type") == "extra_forbidden":
        return APIError(400, f"{field}: unknown field", field)
    if first.get("type") == "missing":
        return APIError(400, f"{field}: required", field)
    return APIError(400, f"{field}: {first.get('msg', 'invalid value')}", loc[0])


class _Run:
    """The engine requests of one HTTP request; cancelled if the request ends early (disconnect)."""

    def __init__(self, engine: Engine, jobs: list[tuple[list[int], Any]]):
        self.engine, self.jobs = engine, jobs
        self.handles: list[RequestHandle] = []
        self.queue: asyncio.Queue = asyncio.Queue()
        self.texts: list[list[str]] = [[] for _ in jobs]
        self.reasons: list[str | None] = [None for _ in jobs]

    async def __aenter__(self) -> _Run:
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
        gone_task = asyncio.ensure_future(_disconnected(request))
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


async def _disconnected(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


# -- running it ---------------------------------------------------------------------------------------
def serve(
    engine: Engine, model_id: str, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info"
) -> None:
    """Serve until interrupted (Ctrl-C / SIGTERM shut down cleanly)."""
    import uvicorn

    uvicorn.run(create_app(engine, model_id), host=host, port=port, log_level=log_level)


class BackgroundServer:
    """The server in a thread of this process, on loopback (tests, notebooks, benchmarks)::

    with BackgroundServer(engine, "tiny") as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
    """

    def __init__(self, engine: Engine, model_id: str, host: str = "127.0.0.1", port: int = 0):
        import uvicorn

        config = uvicorn.Config(create_app(engine, model_id), host=host, port=port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="trilm-server", daemon=True)
        self.host = host
        self.port = port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 60.0) -> BackgroundServer:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start on {self.host}:{self.port}")
            time.sleep(0.02)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise RuntimeError("the server did not shut down in time")

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
