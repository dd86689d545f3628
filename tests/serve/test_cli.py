"""``trilm generate`` in process and ``trilm serve`` as the real command in a subprocess."""

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx2 as httpx
import openai
import pytest

from tests.serve.conftest import greedy_reference, nano, write_snapshot
from trilm.cli import main
from trilm.config import ConfigError
from trilm.infer import load_inference_model

REPO = Path(__file__).resolve().parents[2]


def test_generate_prints_the_greedy_continuation(tmp_path, tokenizer, capsys):
    path = write_snapshot(tmp_path / "snap", nano("trilm"), tokenizer, seed=2)
    prompt = "In the beginning"
    ids = tokenizer.encode(prompt)
    expected = tokenizer.decode(ids + greedy_reference(load_inference_model(path), ids, 12))
    common = ["--model", str(path), "--temperature", "0", "--max-tokens", "12", "--ignore-eos"]
    assert main(["generate", *common, "--threads", "1", "--prompt", prompt]) == 0
    assert capsys.readouterr().out == expected + "\n"
    assert main(["generate", *common, "--no-stream", "--prompt", prompt, "--prompt", "The"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(expected + "\n\nThe")


def test_generate_errors_name_the_problem(tmp_path, tokenizer, capsys):
    bare = write_snapshot(tmp_path / "bare", nano("floatlm"))
    assert main(["generate", "--model", str(bare), "--prompt", "x"]) == 2
    assert "no tokenizer found" in capsys.readouterr().err
    path = write_snapshot(tmp_path / "snap", nano("floatlm"), tokenizer)
    assert main(["generate", "--model", str(path), "--prompt", "x", "--top-p", "2"]) == 2
    assert "--top-p: must be in (0, 1]" in capsys.readouterr().err
    assert main(["generate", "--model", str(path), "--prompt", "x", "--max-tokens", "500"]) == 2
    assert "max_tokens: prompt" in capsys.readouterr().err
    assert main(["generate", "--model", str(tmp_path / "missing"), "--prompt", "x"]) == 2
    assert "not a directory" in capsys.readouterr().err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_command_answers_the_openai_client_and_stops_on_sigint(tmp_path, tokenizer):
    """The real command, its key from TRILM_API_KEY: 401 without it, answers with it."""
    path = write_snapshot(tmp_path / "snap", nano("floatlm"), tokenizer, seed=3)
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "TRILM_API_KEY": "cli-key"}
    cmd = [sys.executable, "-m", "trilm.cli", "serve", "--model", str(path), "--port", str(port)]
    proc = subprocess.Popen(
        [*cmd, "--threads", "1", "--log-level", "warning"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.communicate()[1]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "server did not come up"
            time.sleep(0.2)
        assert httpx.get(f"http://127.0.0.1:{port}/v1/models").status_code == 401
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="cli-key", max_retries=0)
        reply = client.chat.completions.create(
            model="snap", messages=[{"role": "user", "content": "Hi"}], max_tokens=5, temperature=0
        )
        assert reply.choices[0].finish_reason in ("stop", "length")
        assert reply.usage.completion_tokens <= 5
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert f"serving 'snap' on http://127.0.0.1:{port}/v1" in err
    assert "32 slots, 64 waiting, request timeout 600 s; 1 API key(s) required on /v1" in err


def test_serve_refuses_a_public_address_without_a_key(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("TRILM_API_KEY", raising=False)
    missing = str(tmp_path / "never-loaded")  # each refusal comes before the model is opened
    assert main(["serve", "--model", missing, "--host", "0.0.0.0", "--port", "8100"]) == 2
    err = capsys.readouterr().err
    assert "--host 0.0.0.0: 0.0.0.0:8100 is reachable beyond this machine and no API key is set" in err
    assert "--allow-unauthenticated" in err
    for flags, message in (
        (["--api-key", " "], "--api-key: must not be empty"),
        (["--max-waiting", "-1"], "--max-waiting: must be >= 0"),
        (["--max-waiting-tokens", "0"], "--max-waiting-tokens: must be >= 1"),
        (["--request-timeout", "-5"], "--request-timeout: must be >= 0 seconds"),
    ):
        assert main(["serve", "--model", missing, *flags]) == 2
        assert message in capsys.readouterr().err


def test_public_address_warns_by_name_when_allowed_and_keys_resolve(capsys):
    from trilm.serve.auth import resolve_keys
    from trilm.serve.cli import _check_exposure

    _check_exposure(argparse.Namespace(host="0.0.0.0", port=9000, allow_unauthenticated=True), [])
    assert "warning: serving 0.0.0.0:9000 without authentication" in capsys.readouterr().err
    _check_exposure(argparse.Namespace(host="0.0.0.0", port=9000, allow_unauthenticated=False), ["k"])
    assert "plain HTTP" in capsys.readouterr().err
    _check_exposure(argparse.Namespace(host="localhost", port=9000, allow_unauthenticated=False), [])
    assert capsys.readouterr().err == ""
    assert resolve_keys([], {"TRILM_API_KEY": "a, b"}) == ["a", "b"]
    assert resolve_keys(["c"], {"TRILM_API_KEY": "a"}) == ["c"]  # flags win over the environment
    assert resolve_keys([], {}) == []
    with pytest.raises(ConfigError, match="TRILM_API_KEY: an empty key"):
        resolve_keys([], {"TRILM_API_KEY": "a,,b"})
