"""The OpenAI-compatible server through the real ``openai`` client, on loopback, in this process."""

import asyncio
import json
import re
import time

import httpx2 as httpx
import openai
import pytest
import torch

from tests.serve.conftest import greedy_reference, nano, write_snapshot
from trilm.serve import Engine
from trilm.serve.chat import render_chat
from trilm.serve.server import BackgroundServer

MODEL = "nano-test"


@pytest.fixture(scope="module")
def served(tmp_path_factory, tokenizer):
    torch.set_num_threads(1)
    path = write_snapshot(tmp_path_factory.mktemp("served") / "snap", nano("floatlm"), tokenizer, seed=6)
    engine = Engine.load(path, device="cpu", max_batch=8)
    server = BackgroundServer(engine, MODEL).start()
    yield engine, server
    server.stop()


@pytest.fixture
def client(served):
    return openai.OpenAI(base_url=served[1].url + "/v1", api_key="unused", max_retries=0, timeout=60)


def _expected(engine, prompt: str, n: int) -> str:
    ids = engine.tokenizer.encode(prompt)
    return engine.tokenizer.decode(ids + greedy_reference(engine.model, ids, n))[len(prompt) :]


def test_server_binds_loopback_models_and_health(served, client):
    _, server = served
    assert server.host == "127.0.0.1"
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert client.models.retrieve(MODEL).owned_by == "trilm"
    health = httpx.get(server.url + "/health").json()
    assert health["status"] == "ok" and health["max_batch"] == 8 and health["running"] == 0


def test_completion_and_its_stream_equal_greedy_decoding(served, client):
    engine, _ = served
    prompt = "In the beginning"
    args = dict(model=MODEL, prompt=prompt, max_tokens=20, temperature=0, extra_body={"ignore_eos": True})
    out = client.completions.create(**args)
    assert out.choices[0].text == _expected(engine, prompt, 20)
    assert out.choices[0].finish_reason == "length"
    assert out.usage.prompt_tokens == len(engine.tokenizer.encode(prompt))
    assert out.usage.completion_tokens == 20
    chunks = list(client.completions.create(**args, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == out.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 20
    echoed = client.completions.create(**args, echo=True)
    assert echoed.choices[0].text == prompt + out.choices[0].text


def test_chat_uses_the_documented_plain_text_format(served, client):
    engine, _ = served
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
    args = dict(model=MODEL, messages=messages, max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
    out = client.chat.completions.create(**args)
    prompt = render_chat([("system", "Be brief."), ("user", "Hello there")])
    assert prompt == "System: Be brief.\n\nUser: Hello there\n\nAssistant:"
    assert out.usage.prompt_tokens == len(engine.tokenizer.encode(prompt))
    full = _expected(engine, prompt, 12)
    for stop in ("\nUser:", "\nSystem:", "\nAssistant:"):
        full = full.split(stop)[0]
    assert out.choices[0].message.content == full.lstrip()
    assert out.choices[0].message.role == "assistant"
    stream = list(client.chat.completions.create(**args, stream=True))
    assert stream[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in stream) == out.choices[0].message.content


def test_sampling_options_seed_stop_and_n(served, client):
    engine, _ = served
    args = dict(model=MODEL, prompt="The Python", max_tokens=16, temperature=0.9, top_p=0.9, seed=5)
    args["extra_body"] = {"top_k": 40, "ignore_eos": True}
    a = client.completions.create(**args)
    b = client.completions.create(**args)
    assert a.choices[0].text == b.choices[0].text
    two = client.completions.create(**args, n=2)
    assert [c.index for c in two.choices] == [0, 1] and two.choices[0].text == a.choices[0].text
    greedy = _expected(engine, "The Python", 16)
    stop = greedy[6:9]
    cut = client.completions.create(
        model=MODEL, prompt="The Python", max_tokens=16, temperature=0, stop=[stop, "\x00never"]
    )
    assert cut.choices[0].text == greedy[: greedy.index(stop)] and cut.choices[0].finish_reason == "stop"
    batch = client.completions.create(
        model=MODEL, prompt=["The Python", "In the"], max_tokens=5, temperature=0
    )
    assert len(batch.choices) == 2 and batch.usage.completion_tokens <= 10


BAD_REQUESTS = [
    # (path, body, status, message fragment)
    ("/v1/completions", b"{not json", 400, "malformed JSON body"),
    ("/v1/completions", [1, 2], 400, "body: must be a JSON object"),
    ("/v1/completions", {"model": MODEL, "prompt": 5}, 400, "prompt: must be a string, a list of strings"),
    ("/v1/completions", {"model": MODEL, "prompt": ["a", "word " * 200]}, 400,
     r"prompt\[1\]: \d+ tokens leave no room"),
    ("/v1/completions", {"model": "other", "prompt": "x"}, 404, "model 'other' not found"),
    ("/v1/completions", {"model": MODEL}, 400, "prompt: required"),
    ("/v1/completions", {"model": MODEL, "prompt": ""}, 400, "prompt: must not be empty"),
    ("/v1/completions", {"model": MODEL, "prompt": []}, 400, "prompt: must not be empty"),
    ("/v1/completions", {"model": MODEL, "prompt": "word " * 200}, 400, "leave no room to generate"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": -1}, 400, "max_tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 10**12}, 400, "exceeds the context"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": "9"}, 400, "max_tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "temperature": -0.5}, 400, "temperature"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "temperature": 7}, 400, "temperature"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "top_p": 0}, 400, "top_p"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "top_p": 1.5}, 400, "top_p"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "top_k": -5}, 400, "top_k"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "n": 0}, 400, "n:"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "seed": 1.5}, 400, "seed"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "stop": ""}, 400, r"stop\[0\]: must not be empty"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "stop": list("abcde")}, 400, "at most 4"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "stream": "yes"}, 400, "stream"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "logprobs": 2}, 400, "logprobs: not supported"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "frequency_penalty": 1}, 400, "not supported"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "surprise": 1}, 400, "surprise: unknown field"),
    ("/v1/completions", {"model": MODEL, "prompt": [5, 9999]}, 400, "outside the vocabulary"),
    ("/v1/chat/completions", {"model": MODEL, "messages": []}, 400, "messages: must not be empty"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "robot", "content": "x"}]}, 400,
     "messages.0.role"),
    ("/v1/chat/completions", {"model": "other", "messages": [{"role": "user", "content": "x"}]}, 404,
     "not found"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x" * 600}]}, 400,
     r"messages: \d+ tokens leave no room"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                              "tools": [{"type": "function"}]}, 400, "tools: not supported"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": 3}]}, 400,
     "messages.0.content: must be a string or a list of text parts"),
    ("/v1/models/other", None, 404, "not found"),
    ("/v1/nothing-here", None, 404, "Not Found"),
]  # fmt: skip


def test_bad_requests_get_4xx_with_a_clear_message(served):
    _, server = served
    for path, body, status, fragment in BAD_REQUESTS:
        if body is None:
            r = httpx.get(server.url + path)
        elif isinstance(body, bytes):
            r = httpx.post(server.url + path, content=body, headers={"content-type": "application/json"})
        else:
            r = httpx.post(server.url + path, json=body)
        assert r.status_code == status, (path, body, r.text)
        assert re.search(fragment, r.json()["error"]["message"]), (path, body, r.text)
    assert httpx.get(server.url + "/health").json()["status"] == "ok"  # still up


def test_openai_client_raises_the_matching_errors(client):
    with pytest.raises(openai.NotFoundError, match="not found"):
        client.completions.create(model="gpt-4", prompt="x")
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.completions.create(model=MODEL, prompt="x", max_tokens=-3)


def _slow_steps(engine, monkeypatch, seconds=0.02):
    step = engine.step

    def slow():
        time.sleep(seconds)
        return step()

    monkeypatch.setattr(engine, "step", slow)


def _wait_idle(server, timeout=10.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        health = httpx.get(server.url + "/health").json()
        if health["running"] == 0 and health["waiting"] == 0:
            return health
        time.sleep(0.05)
    raise AssertionError(f"the batch did not empty: {health}")


def test_client_disconnect_frees_its_slot(served, monkeypatch):
    engine, server = served
    _slow_steps(engine, monkeypatch)
    before = engine.finished["cancelled"]
    body = {"model": MODEL, "prompt": "In", "max_tokens": 100, "stream": True, "ignore_eos": True}
    with (
        httpx.Client(timeout=30) as http,
        http.stream("POST", server.url + "/v1/completions", json=body) as r,
    ):
        lines = r.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))
        assert httpx.get(server.url + "/health").json()["running"] == 1
    _wait_idle(server)
    assert engine.finished["cancelled"] == before + 1
    body["stream"] = False  # a non-streaming client that gives up waiting
    with pytest.raises(httpx.TimeoutException):
        httpx.post(server.url + "/v1/completions", json=body, timeout=0.5)
    _wait_idle(server)
    assert engine.finished["cancelled"] == before + 2


def test_fifty_concurrent_requests_then_clean_shutdown(tmp_path, tokenizer):
    """50 simultaneous clients (half streaming) through 8 slots: every answer is the greedy text."""
    path = write_snapshot(tmp_path / "snap", nano("floatlm"), tokenizer, seed=8)
    engine = Engine.load(path, device="cpu", max_batch=8)
    words = ["In the", "The", "And God", "Python", "import", "SELECT", "a", "When"]
    prompts = [f"{words[i % 8]} {i}" for i in range(50)]
    lengths = [4 + i % 13 for i in range(50)]
    expected = [_expected(engine, p, n) for p, n in zip(prompts, lengths)]
    server = BackgroundServer(engine, MODEL).start()
    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)

    async def one(i: int) -> str:
        args = dict(model=MODEL, prompt=prompts[i], max_tokens=lengths[i], temperature=0)
        args["extra_body"] = {"ignore_eos": True}
        if i % 2:
            stream = await client.completions.create(**args, stream=True)
            return "".join([c.choices[0].text async for c in stream])
        return (await client.completions.create(**args)).choices[0].text

    async def everyone():
        try:
            return await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(50))), 120)
        finally:
            await client.close()

    try:
        answers = asyncio.run(everyone())
    finally:
        server.stop()
    assert answers == expected
    assert engine.finished["length"] == 50 and engine.num_running == 0
    assert not server.thread.is_alive() and engine._thread is None
    with pytest.raises(httpx.ConnectError):
        httpx.get(server.url + "/health", timeout=2)


def test_sse_wire_format(served):
    _, server = served
    body = {"model": MODEL, "prompt": "In", "max_tokens": 3, "temperature": 0, "stream": True}
    r = httpx.post(server.url + "/v1/completions", json=body)
    assert r.headers["content-type"].startswith("text/event-stream")
    events = [e for e in r.text.split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    first = json.loads(events[0].removeprefix("data: "))
    assert first["object"] == "text_completion" and first["model"] == MODEL


def test_engine_failure_fails_its_requests_not_the_server(served, client, monkeypatch):
    engine, _ = served

    def broken_decode():
        raise RuntimeError("injected decode failure")

    monkeypatch.setattr(engine, "_decode", broken_decode)
    args = dict(model=MODEL, prompt="In", max_tokens=5, temperature=0, extra_body={"ignore_eos": True})
    with pytest.raises(openai.InternalServerError, match="injected decode failure"):
        client.completions.create(**args)
    with pytest.raises(openai.APIError, match="injected decode failure"):
        list(client.completions.create(**args, stream=True))
    monkeypatch.undo()
    assert client.completions.create(**args).choices[0].finish_reason == "length"
    assert engine.finished["error"] == 2
