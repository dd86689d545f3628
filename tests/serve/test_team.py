"""The server as a team runs it, through HTTP on loopback: API keys, a full queue answered 429 with
``Retry-After`` while the admitted requests finish, deadlines that free slots, disconnects that cancel
queued requests, and ``/metrics`` read back with prometheus_client's own parser."""

import json
import threading
import time

import httpx2 as httpx
import openai
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from tests.serve.conftest import greedy_reference, nano, write_snapshot
from trilm.serve import Engine
from trilm.serve.admission import Limits
from trilm.serve.server import BackgroundServer

MODEL = "nano-team"
KEYS = ["team-key-1", "second key"]


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory, tokenizer):
    torch.set_num_threads(1)
    return write_snapshot(tmp_path_factory.mktemp("team") / "snap", nano("floatlm"), tokenizer, seed=6)


def _server(snapshot, max_batch=2, api_keys=(), **limits) -> tuple[Engine, BackgroundServer]:
    engine = Engine.load(snapshot, device="cpu", max_batch=max_batch, limits=Limits(**limits))
    return engine, BackgroundServer(engine, MODEL, api_keys=api_keys).start()


def _slow_steps(engine, monkeypatch, seconds=0.02):
    step = engine.step

    def slow():
        time.sleep(seconds)
        return step()

    monkeypatch.setattr(engine, "step", slow)


def _health(server) -> dict:
    return httpx.get(server.url + "/health").json()


def _until(server, condition, timeout=20.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        health = _health(server)
        if condition(health):
            return health
        time.sleep(0.02)
    raise AssertionError(f"not reached within {timeout} s: {health}")


def _expected(engine, prompt: str, n: int) -> str:
    ids = engine.tokenizer.encode(prompt)
    return engine.tokenizer.decode(ids + greedy_reference(engine.model, ids, n))[len(prompt) :]


def _body(prompt="In the", max_tokens=8, **extra) -> dict:
    return {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, **extra}  # fmt: skip


def test_api_keys_guard_every_v1_route_and_leave_health_open(snapshot):
    engine, server = _server(snapshot, api_keys=KEYS)
    url = server.url
    try:
        for path in ("/v1/models", "/v1/models/x", "/v1/nothing-here"):
            r = httpx.get(url + path)
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", path
            assert r.json()["error"] == {
                "message": "missing API key: send the header 'Authorization: Bearer KEY'",
                "type": "invalid_request_error",
                "param": None,
                "code": "invalid_api_key",
            }
        for header in ("Bearer team-key-2", "Bearer team-key-1x", "Bearer", "team-key-1", "Basic dGVhbQ=="):
            r = httpx.post(url + "/v1/completions", json=_body(), headers={"Authorization": header})
            assert r.status_code == 401, header
            assert r.json()["error"]["code"] == "invalid_api_key"
        wrong = openai.OpenAI(base_url=url + "/v1", api_key="guess", max_retries=0)
        with pytest.raises(openai.AuthenticationError, match="invalid API key"):
            wrong.completions.create(model=MODEL, prompt="In", max_tokens=2)
        for key in KEYS:
            client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)
            out = client.completions.create(model=MODEL, prompt="In the", max_tokens=5, temperature=0,
                                            extra_body={"ignore_eos": True})  # fmt: skip
            assert out.choices[0].text == _expected(engine, "In the", 5)
        headers = {"Authorization": f"Bearer {KEYS[0]}"}
        assert httpx.get(url + "/v1/nothing-here", headers=headers).status_code == 404
        assert httpx.get(url + "/health").status_code == 200  # open: no key needed
        metrics = _scrape(server)
        assert metrics[("trilm_requests_rejected_total", (("reason", "unauthorized"),))] == 9
    finally:
        server.stop()


def test_full_queue_answers_429_while_admitted_requests_finish(snapshot, monkeypatch):
    """2 slots, 2 waiting: 4 streams are admitted; a 5th request, streaming or not, gets 429 with
    Retry-After — and every admitted stream still runs to its last greedy token."""
    engine, server = _server(snapshot, max_batch=2, max_waiting=2)
    _slow_steps(engine, monkeypatch)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    prompts = ["In the", "The Python", "And God", "SELECT"]
    texts: dict[int, str] = {}

    def stream(i: int) -> None:
        with httpx.stream("POST", server.url + "/v1/completions", timeout=60,
                          json=_body(prompts[i], 30, stream=True)) as r:  # fmt: skip
            assert r.status_code == 200
            chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
            texts[i] = "".join(c["choices"][0]["text"] for c in chunks)

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(4)]
    try:
        for t in threads:
            t.start()
        _until(server, lambda h: h["running"] == 2 and h["waiting"] == 2)
        with engine._step_lock:  # held between two steps, so the queue cannot move during the checks
            assert _health(server)["waiting"] == 2
            with pytest.raises(openai.RateLimitError, match="at capacity"):
                client.completions.create(model=MODEL, prompt="In", max_tokens=2)
            for extra in (_body(), _body(stream=True), _body(n=2)):
                r = httpx.post(server.url + "/v1/completions", json=extra)
                assert r.status_code == 429, r.text
                assert int(r.headers["retry-after"]) >= 1
                error = r.json()["error"]
                assert error["code"] == "queue_full" and "max_waiting 2" in error["message"]
        for t in threads:
            t.join(60)
        assert texts == {i: _expected(engine, prompts[i], 30) for i in range(4)}  # nothing cut short
        health = _until(server, lambda h: h["running"] == 0 and h["waiting"] == 0)
        assert health["rejected"]["queue_full"] == 4 and health["finished"]["length"] == 4
        assert health["limits"]["max_waiting"] == 2
        assert httpx.post(server.url + "/v1/completions", json=_body()).status_code == 200  # room again
    finally:
        server.stop()


def test_a_timed_out_request_frees_its_slot(snapshot, monkeypatch):
    engine, server = _server(snapshot, max_batch=1, request_timeout=0.4)
    _slow_steps(engine, monkeypatch)
    try:
        r = httpx.post(server.url + "/v1/completions", json=_body(max_tokens=100), timeout=30)
        assert r.status_code == 504 and r.json()["error"]["code"] == "request_timeout"
        assert "did not finish within request_timeout (0.4 s)" in r.json()["error"]["message"]
        health = _until(server, lambda h: h["running"] == 0)
        assert health["finished"]["timeout"] == 1
        with httpx.stream("POST", server.url + "/v1/completions", timeout=30,
                          json=_body(max_tokens=100, stream=True)) as s:  # fmt: skip
            events = [line for line in s.iter_lines() if line.startswith("data:")]
        assert '"code":"request_timeout"' in events[-2] and events[-1] == "data: [DONE]"
        assert any('"text"' in e for e in events[:-2])  # what had streamed stays streamed
        # the freed slot serves the next request in full
        r = httpx.post(server.url + "/v1/completions", json=_body(max_tokens=5), timeout=30)
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == _expected(engine, "In the", 5)
        # a request that waits out its deadline without starting: 503 with Retry-After
        with engine._step_lock:  # the engine is held between steps
            answer = {}
            waiter = threading.Thread(
                target=lambda: answer.update(r=httpx.post(server.url + "/v1/completions", json=_body()))
            )
            waiter.start()
            deadline = time.monotonic() + 20
            while engine.num_waiting == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.5)  # its deadline passes while it is still queued
        waiter.join(30)
        assert answer["r"].status_code == 503 and int(answer["r"].headers["retry-after"]) >= 1
        assert "waited its whole request_timeout" in answer["r"].json()["error"]["message"]
        assert _until(server, lambda h: h["running"] == 0)["finished"]["timeout"] == 3
    finally:
        server.stop()


def test_disconnect_cancels_a_queued_request(snapshot, monkeypatch):
    engine, server = _server(snapshot, max_batch=1, max_waiting=4)
    _slow_steps(engine, monkeypatch, 0.05)  # the running request holds the one slot for 5 s
    try:
        runner = threading.Thread(
            target=lambda: httpx.post(server.url + "/v1/completions", json=_body(max_tokens=100), timeout=60)
        )
        runner.start()
        _until(server, lambda h: h["running"] == 1)
        with (
            httpx.Client(timeout=30) as http,
            http.stream("POST", server.url + "/v1/completions", json=_body(stream=True)),
        ):
            _until(server, lambda h: h["waiting"] == 1)  # queued: no token, so nothing streamed yet
        health = _until(server, lambda h: h["waiting"] == 0)
        assert health["running"] == 1 and health["finished"]["cancelled"] == 1  # cancelled while queued
        with pytest.raises(httpx.TimeoutException):  # a non-streaming client that gives up while queued
            httpx.post(server.url + "/v1/completions", json=_body(), timeout=0.5)
        health = _until(server, lambda h: h["waiting"] == 0)
        assert health["running"] == 1 and health["finished"]["cancelled"] == 2
        runner.join(60)
        assert _health(server)["finished"]["length"] == 1
    finally:
        server.stop()


def _scrape(server) -> dict:
    """Every sample of /metrics, keyed by (name, sorted labels), parsed by prometheus_client."""
    r = httpx.get(server.url + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def test_metrics_parse_and_move_as_requests_are_served(snapshot, monkeypatch):
    engine, server = _server(snapshot, max_batch=4, max_waiting=8)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    try:
        before = _scrape(server)
        assert before[("trilm_kv_cache_blocks_total", ())] == 4
        assert before[("trilm_requests_running", ())] == 0
        assert before[("trilm_requests_waiting_limit", ())] == 8
        prompts, lengths = ["In the", "The Python interpreter", "And"], [6, 9, 4]
        for prompt, n in zip(prompts, lengths):
            client.completions.create(model=MODEL, prompt=prompt, max_tokens=n, temperature=0,
                                      extra_body={"ignore_eos": True})  # fmt: skip
        after = _scrape(server)

        def moved(name, labels=()):
            return after[(name, labels)] - before.get((name, labels), 0.0)

        prompt_tokens = sum(len(engine.tokenizer.encode(p)) for p in prompts)
        assert moved("trilm_requests_finished_total", (("reason", "length"),)) == 3
        assert moved("trilm_prompt_tokens_total") == prompt_tokens
        assert moved("trilm_generation_tokens_total") == sum(lengths)
        assert moved("trilm_time_to_first_token_seconds_count") == 3
        assert moved("trilm_inter_token_latency_seconds_count") == sum(n - 1 for n in lengths)
        assert moved("trilm_request_latency_seconds_count") == 3
        assert moved("trilm_request_queue_seconds_count") == 3
        assert moved("trilm_engine_decode_steps_total") == sum(n - 1 for n in lengths)  # one at a time
        assert moved("trilm_time_to_first_token_seconds_sum") > 0
        assert after[("trilm_engine_batch_size", ())] == 1
        assert after[("trilm_time_to_first_token_seconds_bucket", (("le", "+Inf"),))] >= 3

        _slow_steps(engine, monkeypatch)  # while two requests run: the gauges show them
        workers = [
            threading.Thread(target=lambda: httpx.post(server.url + "/v1/completions",
                                                       json=_body(max_tokens=40), timeout=60))
            for _ in range(2)
        ]  # fmt: skip
        for w in workers:
            w.start()
        _until(server, lambda h: h["running"] == 2)
        during = _scrape(server)
        assert during[("trilm_requests_running", ())] == 2
        assert during[("trilm_kv_cache_blocks_in_use", ())] == 2
        assert 0 < during[("trilm_kv_cache_usage_ratio", ())] < 1
        for w in workers:
            w.join(60)
        assert (
            _scrape(server)[("trilm_engine_batch_size_per_step_count", ())]
            > during[("trilm_engine_batch_size_per_step_count", ())]
        )
    finally:
        server.stop()
