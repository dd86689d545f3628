"""benchmarks/serve/load.py end to end at a toy scale, run as the docs run it (timings are not checked):
it starts ``trilm serve``, ramps clients past a capacity of two, stops by itself and writes its JSON."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_serve_load_benchmark_smoke(tmp_path):
    cmd = [sys.executable, "-m", "benchmarks.serve.load", "--size", "nano", "--max-batch", "1"]
    cmd += ["--max-waiting", "1", "--levels", "1,3", "--level-seconds", "1.5", "--prompts", "3"]
    cmd += ["--max-tokens", "6", "--rounds", "1", "--no-unbounded", "--max-seconds", "300"]
    cmd += ["--out", str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    (path,) = tmp_path.glob("serve-load-cpu-*.json")
    report = json.loads(path.read_text())
    [run] = report["runs"]
    assert run["server"] == "limited" and run["exit_code"] == 0 and run["lone_equals_reference"]
    assert [lv["clients"] for lv in run["levels"]] == [1, 3]
    for level in run["levels"]:
        assert level["accepted"] > 0 and level["wrong"] == 0 and level["errors"] == 0
        assert level["accepted"] + level["refused"] == level["attempts"]
        assert level["server"]["finished_length"] == level["accepted"]
        assert level["server"]["rejected_queue_full"] == level["refused_by_status"]["429"]
        assert level["most_waiting_seen"] <= 1
    verdicts = report["verdicts"]
    assert verdicts["capacity_requests"] == 2 and verdicts["levels_past_capacity"] == [3]
    assert verdicts["wrong_accepted_requests"] == 0 and verdicts["clean_exits"]
    assert report["device"]["kind"] == "cpu" and report["settings"]["max_waiting"] == 1
    assert report["command"].startswith("python -m benchmarks.serve.load --size nano")
