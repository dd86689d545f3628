"""Exact resume: a run SIGKILLed at an arbitrary step and restarted equals an uninterrupted one bitwise."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from .conftest import tiny_config

ROOT = Path(__file__).resolve().parents[2]


def _launch(config: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, str(ROOT / "train/pretrain.py"), "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=ROOT,
    )


def _steps_logged(run: Path) -> int:
    path = run / "logs/metrics.jsonl"
    if not path.exists():
        return 0
    complete = path.read_text().rpartition("\n")[0]  # the trainer may be writing the last line right now
    steps = [json.loads(x)["step"] for x in complete.splitlines() if '"loss"' in x]
    return max(steps, default=0)


@pytest.mark.slow
def test_sigkill_and_resume_is_bitwise_identical(prepared, tmp_path):
    overrides = {"tokens": 1024 * 40, "log.every": 1, "checkpoint.state_every": 5}
    for name in ("straight", "killed"):
        tiny_config(prepared, tmp_path / name, **overrides).to_yaml(tmp_path / f"{name}.yaml")

    straight = _launch(tmp_path / "straight.yaml")
    out, _ = straight.communicate(timeout=600)
    assert straight.returncode == 0, out.decode()[-3000:]

    killed = _launch(tmp_path / "killed.yaml")
    deadline = time.time() + 300
    while _steps_logged(tmp_path / "killed") < 13 and killed.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    killed.send_signal(signal.SIGKILL)
    killed.communicate(timeout=60)
    assert killed.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    reached = _steps_logged(tmp_path / "killed")
    assert 13 <= reached < 40

    resumed = _launch(tmp_path / "killed.yaml")
    out, _ = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, out.decode()[-3000:]
    assert "resumed from step 10" in out.decode() or "resumed from step 15" in out.decode()

    a = load_file(str(tmp_path / "straight/snapshots/step-40/model.safetensors"))
    b = load_file(str(tmp_path / "killed/snapshots/step-40/model.safetensors"))
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
