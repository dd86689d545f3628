"""Clean exit: entry points and test sessions destroy their process groups and terminate by themselves.

A live NCCL process group at interpreter exit hangs the process in its destructor. trilm's entry points
destroy theirs; ``trilm.parallel`` registers an exit hook that destroys a leftover group and says so on
stderr ("still initialised at exit"), so a leak is visible on CPU too.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import tiny_config

ROOT = Path(__file__).resolve().parents[2]
LEAK = "still initialised at exit"
pytestmark = pytest.mark.slow


def _run(args: list[str], timeout: int = 420) -> tuple[int, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout
    )
    return proc.returncode, proc.stdout + proc.stderr


def test_gpu_marked_pytest_run_terminates():
    """``pytest -m gpu`` plus tests that hold process groups (in-process engine, spawned gloo ranks): the
    pytest process must exit by itself within the timeout (subprocess.TimeoutExpired otherwise)."""
    code, out = _run(
        [
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/train/test_gpu.py",
            "tests/train/exit_probe.py",
        ]
    )
    assert code == 0, out[-3000:]
    assert "2 passed" in out and LEAK not in out, out[-3000:]


def test_training_entry_point_destroys_its_process_group(prepared, tmp_path):
    config = tmp_path / "run.yaml"
    tiny_config(prepared, tmp_path / "run", tokens=1024 * 2).to_yaml(config)
    for extra in ([], ["--dry-run"]):
        code, out = _run(["train/pretrain.py", "--config", str(config), *extra])
        assert code == 0 and LEAK not in out, out[-3000:]
    (tmp_path / "run/resolved_config.yaml").unlink()  # an error after the group exists: still destroyed
    code, out = _run(["-m", "trilm.cli", "train", "--config", str(config)])
    assert code == 2 and "holds checkpoints but no resolved_config.yaml" in out, out[-3000:]
    assert LEAK not in out


def test_the_exit_hook_reports_and_destroys_a_leaked_group():
    code, out = _run(["-c", "from trilm.parallel import init_parallel; init_parallel()"], timeout=180)
    assert code == 0 and LEAK in out, out[-3000:]
