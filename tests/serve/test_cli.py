"""``trilm generate`` in process and ``trilm serve`` as the real command in a subprocess."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx2 as httpx
import openai

from tests.serve.conftest import greedy_reference, nano, write_snapshot
from trilm.cli import main
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
    path = write_snapshot(tmp_path / "snap", nano("floatlm"), tokenizer, seed=3)
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
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
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
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
