"""benchmarks/gpu_suite.sh checked on a CPU, as CI can: its dry run (every stage's real command line with
``--dry-run``, pytest with ``--collect-only``), the 7-minute budget, and that a stage past its budget is cut
while the stages after it still run (a stand-in interpreter plays the GPU machine's python). The script is
run as a subprocess: no GPU-only module is imported here."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "benchmarks" / "gpu_suite.sh"
STAGES = ["install", "kernels", "decode", "tests", "train", "serve"]
LIMIT_S = 420


def run_suite(*args: str, timeout: float, **env: str) -> subprocess.CompletedProcess:
    environ = {**os.environ, "PYTHON": sys.executable, **env}
    for key in ("INSTALL_LIMIT", "KERNEL_LIMIT", "DECODE_LIMIT", "TEST_LIMIT", "TRAIN_LIMIT", "SERVE_LIMIT"):
        if key not in env:
            environ.pop(key, None)
    return subprocess.run(
        ["bash", str(SUITE), *args], capture_output=True, text=True, env=environ, cwd=ROOT, timeout=timeout
    )


MODULES = {
    "kernels": "benchmarks.kernels",
    "decode": "benchmarks.serve.decode",
    "train": "benchmarks.train",
    "serve": "benchmarks.serve",
}
"""The benchmark each measuring stage runs (the areas' packages run their main benchmark)."""


def test_dry_run_checks_every_stage_and_the_budgets(tmp_path):
    done = run_suite("--dry-run", str(tmp_path), timeout=240)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    suite = json.loads((tmp_path / "suite.json").read_text())
    assert suite["mode"] == "dry-run" and suite["tests"] == "fast"
    assert suite["device"] and suite["date"].startswith("20")
    stages = {s["name"]: s for s in suite["stages"]}
    assert list(stages) == STAGES
    assert sum(s["budget_s"] for s in stages.values()) == suite["budget_total_s"] <= LIMIT_S
    assert re.search(rf"total\s+{suite['budget_total_s']} \(limit {LIMIT_S}\)", done.stdout)
    has_decode = (ROOT / "benchmarks" / "serve" / "decode.py").exists()
    for name, stage in stages.items():
        if name == "decode" and not has_decode:
            assert stage["status"] == "skipped" and "does not exist" in stage["note"]
            continue
        assert (stage["status"], stage["exit"]) == ("ok", 0), (name, (tmp_path / f"{name}.log").read_text())
        if name in MODULES:
            assert stage["command"].endswith("--dry-run") and f"-m {MODULES[name]} " in stage["command"]
            assert "dry run:" in (tmp_path / f"{name}.log").read_text()
    tests = stages["tests"]
    assert "--collect-only" in tests["command"] and "-p benchmarks.gpu_pytest" in tests["command"]
    collected = (tmp_path / "tests.log").read_text()
    assert "tests/kernels/test_gpu.py::" in collected and "deselected" in collected  # slow ones left out
    assert "::test_every_gpu_config" not in collected


def test_budgets_over_seven_minutes_are_refused(tmp_path):
    done = run_suite("--dry-run", str(tmp_path), timeout=60, TRAIN_LIMIT="300")
    assert done.returncode == 1 and f"over {LIMIT_S} s" in done.stderr
    assert not (tmp_path / "suite.json").exists()


FAKE_PYTHON = """#!/usr/bin/env bash
case "$1:$2" in
    -:*|"-c:import json"*) exec {python} "$@" ;;  # the suite's own bookkeeping
    -m:benchmarks.kernels) sleep 60 ;;
    -m:*) echo "stand-in: $*" ;;
    -c:*) echo "stand-in import check" ;;
    *) exec {python} "$@" ;;
esac
"""


def test_a_stage_past_its_budget_is_cut_and_the_rest_still_run(tmp_path):
    python = tmp_path / "python"
    python.write_text(FAKE_PYTHON.format(python=sys.executable))
    python.chmod(0o755)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "trilm-0-py3-none-any.whl").write_text("")
    out = tmp_path / "out"
    env = {"PYTHON": str(python), "SITE": str(tmp_path / "site"), "WHEELS": str(wheels), "KERNEL_LIMIT": "6"}
    done = run_suite(str(out), timeout=120, **env)
    assert done.returncode == 1 and "stages not ok: kernels" in done.stderr, done.stdout[-3000:]
    stages = {s["name"]: s for s in json.loads((out / "suite.json").read_text())["stages"]}
    assert list(stages) == STAGES
    kernels = stages.pop("kernels")
    assert kernels["status"] == "timeout" and kernels["exit"] in (124, 137) and kernels["elapsed_s"] < 6
    assert {name: s["status"] for name, s in stages.items()} == {name: "ok" for name in stages}
    assert "--dry-run" not in stages["train"]["command"]
    assert "--collect-only" not in stages["tests"]["command"]
