"""The OpenAI request bodies the server accepts, validated into engine calls.

Fields follow the OpenAI API (``/v1/completions``, ``/v1/chat/completions``); ``top_k`` and
``ignore_eos`` are the common extensions (vLLM spells them the same). Fields of the API this server cannot
honour (log-probabilities, penalties, logit bias, tools, ``best_of``, ``suffix``) are refused with a
message naming them rather than silently ignored; unknown fields are refused too.
"""

from __future__ import annotations

from typing import Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field

from trilm.serve.sampling import SamplingParams

MAX_STOP = 4
MAX_N = 16


class APIError(Exception):
    """An error answered as ``{"error": {...}}`` with an HTTP status (and headers: ``Retry-After``).
    ``kind`` is the body's ``type``: by default ``invalid_request_error`` below 500, ``server_error``
    from it."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        *,
        kind: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.kind = kind or ("invalid_request_error" if status < 500 else "server_error")
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Strict):
    include_usage: bool = False


class _Sampling(_Strict):
    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)
    n: int = Field(1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=-(2**63), lt=2**64)
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    ignore_eos: bool = False

    def refuse_unsupported(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                raise APIError(400, f"{name}: not supported by this server (use 0 or omit it)", name)
        if self.logit_bias:
            raise APIError(400, "logit_bias: not supported by this server", "logit_bias")

    def stop_strings(self) -> tuple[str, ...]:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stop) > MAX_STOP:
            raise APIError(400, f"stop: at most {MAX_STOP} stop strings, got {len(stop)}", "stop")
        for i, s in enumerate(stop):
            if not s:
                raise APIError(400, f"stop[{i}]: must not be empty", "stop")
        return tuple(stop)

    def sampling(self, max_tokens: int, extra_stop: tuple[str, ...] = (), index: int = 0) -> SamplingParams:
        """The engine parameters of choice ``index`` (seeded choices get ``seed + index``)."""
        seed = None if self.seed is None else self.seed + index
        top_k = self.top_k if self.top_k and self.top_k > 0 else 0
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_k=top_k,
            top_p=1.0 if self.top_p is None else self.top_p,
            seed=seed,
            stop=self.stop_strings() + extra_stop,
            ignore_eos=self.ignore_eos,
        )


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.logprobs is not None:
            raise APIError(400, "logprobs: not supported by this server", "logprobs")
        if self.best_of not in (None, 1):
            raise APIError(400, "best_of: only 1 is supported", "best_of")
        if self.suffix:
            raise APIError(400, "suffix: not supported by this server", "suffix")

    def prompts(self) -> list[str | list[int]]:
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            raise APIError(400, "prompt: must not be empty", "prompt")
        if all(isinstance(x, int) for x in p):
            return [cast("list[int]", list(p))]  # one prompt given as token ids
        return [*cast("list[str] | list[list[int]]", p)]


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.text for part in self.content)


class ChatRequest(_Sampling):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.logprobs or self.top_logprobs:
            raise APIError(400, "logprobs: not supported by this server", "logprobs")
        if self.tools or self.tool_choice not in (None, "none"):
            raise APIError(400, "tools: not supported by this server (base language models)", "tools")
        if self.response_format and self.response_format.get("type") != "text":
            raise APIError(400, "response_format: only {'type': 'text'} is supported", "response_format")
        if not self.messages:
            raise APIError(400, "messages: must not be empty", "messages")
        if self.max_tokens is not None and self.max_completion_tokens is not None:
            raise APIError(
                400, "max_tokens and max_completion_tokens: give one of them", "max_completion_tokens"
            )

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
