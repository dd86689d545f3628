"""The OpenAI-compatible HTTP server (FastAPI on uvicorn) over one :class:`Engine`.

The app is assembled here — lifespan (the engine's background thread), error handlers that answer in
OpenAI's error shape with a message naming the field, the API-key check (:mod:`trilm.serve.auth`), the
metrics (:mod:`trilm.serve.metrics`) and the routes of :mod:`trilm.serve.routes` — and run
by :func:`serve` (the CLI) or :class:`BackgroundServer` (a thread of this process: tests, notebooks). Each
HTTP request's engine requests are submitted, streamed and cancelled together (:mod:`trilm.serve.streaming`);
when a client disconnects, its requests leave the batch at the next step.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from trilm.serve.auth import APIKeys, RequireAPIKey
from trilm.serve.engine import Engine, RequestError
from trilm.serve.metrics import ServeMetrics
from trilm.serve.protocol import APIError
from trilm.serve.routes import Served, router
from trilm.serve.sampling import SamplingError


def create_app(
    engine: Engine, model_id: str, *, api_keys: Sequence[str] = (), manage_engine: bool = True
) -> FastAPI:
    """The app serving ``engine`` under the name ``model_id``; with ``manage_engine`` its lifespan starts
    and stops the engine's background thread. With ``api_keys``, every ``/v1/*`` route needs one of them
    as a bearer token. The engine's admission limits are its own (``Engine(limits=...)``); the app
    becomes its metrics observer."""

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
    metrics = ServeMetrics(engine)
    engine.observer = metrics
    app.state.served = Served(engine, model_id, metrics)
    if api_keys:
        on_reject = metrics.rejected.labels("unauthorized").inc
        app.add_middleware(RequireAPIKey, keys=APIKeys(api_keys), on_reject=on_reject)
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(SamplingError, _bad_request)
    app.add_exception_handler(RequestError, _bad_request)
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.include_router(router)
    return app


# -- errors -------------------------------------------------------------------------------------------
async def _api_error(request: Request, exc: APIError):
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


async def _bad_request(request: Request, exc: ValueError):
    message = str(exc)
    return JSONResponse(APIError(400, message, message.split(":", 1)[0]).body(), status_code=400)


async def _invalid(request: Request, exc: RequestValidationError):
    return JSONResponse(_validation_error(exc).body(), status_code=400)


async def _http_error(request: Request, exc: StarletteHTTPException):
    return JSONResponse(APIError(exc.status_code, str(exc.detail)).body(), status_code=exc.status_code)


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


# -- running it ---------------------------------------------------------------------------------------
def serve(
    engine: Engine,
    model_id: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    log_level: str = "info",
    api_keys: Sequence[str] = (),
) -> None:
    """Serve until interrupted (Ctrl-C / SIGTERM shut down cleanly)."""
    # deferred for start-up time: loads uvicorn only when called
    import uvicorn

    app = create_app(engine, model_id, api_keys=api_keys)
    uvicorn.run(app, host=host, port=port, log_level=log_level)


class BackgroundServer:
    """The server in a thread of this process, on loopback (tests, notebooks, benchmarks)::

    with BackgroundServer(engine, "tiny") as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
    """

    def __init__(
        self,
        engine: Engine,
        model_id: str,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        api_keys: Sequence[str] = (),
    ):
        # deferred for start-up time: loads uvicorn only when called
        import uvicorn

        app = create_app(engine, model_id, api_keys=api_keys)
        config = uvicorn.Config(app, host=host, port=port, log_level="warning")
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
