"""The OpenAI-compatible routes: ``/v1/completions``, ``/v1/chat/completions`` (both with SSE streaming),
``/v1/models``, ``/v1/models/{id}``; and ``/health``, ``/metrics`` (Prometheus).

Handlers are plain module functions on one :data:`router`; what they serve (the engine and the model id)
is the app's :class:`Served`, set by :func:`trilm.serve.server.create_app`. Each request checks its fields
against the engine before anything is submitted, so a bad request is answered 400 naming the field and
never reaches the batch.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from trilm.serve.chat import ReplyText, chat_prompt
from trilm.serve.engine import Engine, RequestError
from trilm.serve.metrics import CONTENT_TYPE, ServeMetrics
from trilm.serve.protocol import APIError, ChatRequest, CompletionRequest
from trilm.serve.streaming import SSE_DONE, EngineRun, RunStream, finish_reason, sse

DEFAULT_COMPLETION_TOKENS = 16
"""``max_tokens`` of a completion that gives none (OpenAI's default), capped by the context left."""

router = APIRouter()


@dataclasses.dataclass
class Served:
    """What an app serves: one engine under one model id, and its metrics."""

    engine: Engine
    model_id: str
    metrics: ServeMetrics
    created: int = dataclasses.field(default_factory=lambda: int(time.time()))

    def card(self) -> dict[str, Any]:
        return {"id": self.model_id, "object": "model", "created": self.created, "owned_by": "trilm"}

    def check_model(self, name: str) -> None:
        if name != self.model_id:
            raise APIError(
                404,
                f"model {name!r} not found; this server serves {self.model_id!r}",
                "model",
                "model_not_found",
            )


def served(request: Request) -> Served:
    return request.app.state.served


@router.get("/health")
async def health(request: Request):
    s = served(request)
    engine = s.engine
    _, waiting, waiting_tokens = engine.occupancy.counts()
    return {
        "status": "ok",
        "model": s.model_id,
        "running": engine.num_running,
        "waiting": waiting,
        "waiting_prompt_tokens": waiting_tokens,
        "max_batch": engine.max_batch,
        "max_seq_len": engine.max_seq_len,
        "limits": dataclasses.asdict(engine.limits),
        "finished": dict(engine.finished),
        "rejected": dict(engine.occupancy.rejected),
    }


@router.get("/metrics")
async def metrics(request: Request):
    return Response(served(request).metrics.render(), media_type=CONTENT_TYPE)


@router.get("/v1/models")
async def models(request: Request):
    return {"object": "list", "data": [served(request).card()]}


@router.get("/v1/models/{name:path}")
async def model(name: str, request: Request):
    s = served(request)
    s.check_model(name)
    return s.card()


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request):
    s = served(request)
    engine = s.engine
    s.check_model(body.model)
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
    reply = _Reply(s, "cmpl", "text_completion", sum(len(ids) for ids in prompts))

    def chunk(index: int, text: str, finish: str | None) -> dict:
        return reply.envelope([{"index": index, "text": text, "logprobs": None, "finish_reason": finish}])

    run = EngineRun(engine, jobs)
    if body.stream:
        await run.start()  # refused before the stream starts: a plain 429/503

        async def events() -> AsyncIterator[str]:
            for i, text in enumerate(echo):
                if text:
                    yield sse(chunk(i, text, None))
            async for index, delta in run.deltas():
                if delta.text or delta.finish_reason:
                    yield sse(chunk(index, delta.text, finish_reason(delta)))
            async for event in reply.closing(run, body.stream_options):
                yield event

        return RunStream(run, events())
    async with run:
        await run.wait(request)
    choices = [
        {"index": i, "text": echo[i] + run.text(i), "logprobs": None, "finish_reason": run.finish(i)}
        for i in range(len(jobs))
    ]
    return reply.envelope(choices, usage=run.usage(reply.prompt_tokens))


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatRequest, request: Request):
    s = served(request)
    engine = s.engine
    s.check_model(body.model)
    body.refuse_unsupported()
    if engine.tokenizer is None:
        raise APIError(400, "messages: this model has no tokenizer, chat needs one", "messages")
    try:
        prompt, stop = chat_prompt(engine.tokenizer, [(m.role, m.text()) for m in body.messages])
    except ValueError as exc:
        raise APIError(400, str(exc), "messages") from None
    ids = _encode(engine, prompt, "messages")
    max_tokens = _max_tokens(engine, ids, body.requested_max_tokens, None)
    jobs = [(ids, body.sampling(max_tokens, stop, index=j)) for j in range(body.n)]
    for job in jobs:
        _check(engine, *job, prompt_field="messages")
    reply = _Reply(s, "chatcmpl", "chat.completion", len(ids))

    def chunk(index: int, delta: dict, finish: str | None) -> dict:
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
        return reply.envelope([choice], object_name="chat.completion.chunk")

    run = EngineRun(engine, jobs)
    if body.stream:
        await run.start()

        async def events() -> AsyncIterator[str]:
            replies = [ReplyText() for _ in jobs]
            for i in range(len(jobs)):
                yield sse(chunk(i, {"role": "assistant", "content": ""}, None))
            async for index, delta in run.deltas():
                text = replies[index](delta.text)
                if text:
                    yield sse(chunk(index, {"content": text}, None))
                if delta.finish_reason:
                    yield sse(chunk(index, {}, finish_reason(delta)))
            async for event in reply.closing(run, body.stream_options, "chat.completion.chunk"):
                yield event

        return RunStream(run, events())
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
    return reply.envelope(choices, usage=run.usage(reply.prompt_tokens))


# -- helpers ------------------------------------------------------------------------------------------
class _Reply:
    """The envelope every answer (and stream chunk) of one request shares: id, object, created, model."""

    def __init__(self, s: Served, prefix: str, object_name: str, prompt_tokens: int):
        self.id, self.created = f"{prefix}-{uuid.uuid4().hex}", int(time.time())
        self.model_id, self.object_name, self.prompt_tokens = s.model_id, object_name, prompt_tokens

    def envelope(self, choices: list[dict], *, object_name: str | None = None, **extra) -> dict:
        return {
            "id": self.id,
            "object": object_name or self.object_name,
            "created": self.created,
            "model": self.model_id,
            "choices": choices,
            **extra,
        }

    async def closing(self, run: EngineRun, options, object_name: str | None = None) -> AsyncIterator[str]:
        """The end of a stream: the usage chunk when ``stream_options.include_usage`` asks, then [DONE]."""
        if options is not None and options.include_usage:
            yield sse(self.envelope([], object_name=object_name, usage=run.usage(self.prompt_tokens)))
        yield SSE_DONE


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
