"""API keys: every ``/v1/*`` route answers only a client that sends ``Authorization: Bearer KEY`` with
one of the server's keys; ``/health`` and ``/metrics`` stay open (no prompt or reply content, and what a
load balancer's health check and a Prometheus scrape reach without a secret).

The check is an ASGI middleware, so it runs before routing: an unknown ``/v1/...`` path gets the same 401
as a real one (a client without a key learns nothing about the routes). Keys are compared as SHA-256
digests with :func:`hmac.compare_digest`, against every key without stopping at a match, so neither the
time taken nor its variation tells how much of a guessed key was right, nor which key matched.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Callable, Mapping, Sequence

from fastapi.responses import JSONResponse

from trilm.config import ConfigError
from trilm.serve.protocol import APIError

ENV_VAR = "TRILM_API_KEY"
"""The environment variable read when no ``--api-key`` is given (several keys: separated by commas)."""


def resolve_keys(flags: Sequence[str] | None, environ: Mapping[str, str] | None = None) -> list[str]:
    """The server's keys: the ``--api-key`` flags if any, else ``TRILM_API_KEY``; empty keys refused."""
    environ = os.environ if environ is None else environ
    if flags:
        for key in flags:
            if not key.strip():
                raise ConfigError("--api-key: must not be empty")
        return list(flags)
    raw = environ.get(ENV_VAR, "")
    keys = [k.strip() for k in raw.split(",")]
    if raw.strip() and not all(keys):
        raise ConfigError(f"{ENV_VAR}: an empty key between commas in {len(keys)} keys")
    return [k for k in keys if k]


def _digest(key: str | bytes) -> bytes:
    return hashlib.sha256(key.encode() if isinstance(key, str) else key).digest()


class APIKeys:
    """The set of accepted keys, held as digests."""

    def __init__(self, keys: Sequence[str]):
        if not keys:
            raise ValueError("APIKeys: give at least one key")
        self._digests = [_digest(k) for k in keys]

    def __len__(self) -> int:
        return len(self._digests)

    def accepts(self, presented: bytes) -> bool:
        given = _digest(presented)
        ok = False
        for digest in self._digests:
            ok |= hmac.compare_digest(given, digest)
        return ok


def protected(path: str) -> bool:
    return path == "/v1" or path.startswith("/v1/")


class RequireAPIKey:
    """ASGI middleware: 401 in OpenAI's error shape for a protected path without a valid bearer key."""

    def __init__(self, app, keys: APIKeys, on_reject: Callable[[], None] | None = None):
        self.app, self.keys, self.on_reject = app, keys, on_reject

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and protected(scope["path"]):
            problem = self._problem(dict(scope["headers"]).get(b"authorization"))
            if problem is not None:
                if self.on_reject is not None:
                    self.on_reject()
                body = APIError(401, problem, code="invalid_api_key").body()
                response = JSONResponse(body, status_code=401, headers={"WWW-Authenticate": "Bearer"})
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _problem(self, header: bytes | None) -> str | None:
        if header is None:
            return "missing API key: send the header 'Authorization: Bearer KEY'"
        scheme, _, token = header.partition(b" ")
        if scheme.lower() != b"bearer" or not token.strip():
            return "malformed Authorization header: expected 'Bearer KEY'"
        if not self.keys.accepts(token.strip()):
            return "invalid API key"
        return None
