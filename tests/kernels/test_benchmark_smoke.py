"""`python -m benchmarks.kernels` end to end (CPU smoke: interpreter kernels, tiny shape) writes JSON; it runs
:mod:`benchmarks.kernels.gpu`, the name its result records."""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_benchmark_script_cpu_smoke(tmp_path):
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    cmd = [sys.executable, "-m", "benchmarks.kernels", "--cpu-smoke", "--out", str(tmp_path)]
    cmd += ["--formats", "ternary", "int3", "pbllm", "--compare-gemv", "2"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    (path,) = tmp_path.glob("kernels-cpu-smoke-*.json")
    report = json.loads(path.read_text())
    rows = [r for r in report["results"] if r["format"] != "fp16"]
    assert {r["format"] for r in rows} == {"ternary", "int3", "pbllm"}
    assert {r["batch"] for r in rows} == {1, 2, 16}
    paths = {(r["format"], r["batch"], r["path"]) for r in rows if r["format"] != "pbllm"}
    assert paths == {(f, m, p) for f in ("ternary", "int3") for m, p in
                     ((1, "gemv"), (2, "gemm"), (2, "gemv"), (16, "gemm"))}  # fmt: skip
    assert all(r["max_rel_err"] < 1e-5 and r["bits_per_weight"] < 16 for r in rows)
    assert "targets" in report and "wrote" in out.stdout
    assert report["command"].startswith("python -m benchmarks.kernels.gpu --cpu-smoke")
    assert report["device"]["cpus"] >= 1 and report["date"]
