"""`python -m benchmarks.serve` end to end at a toy scale writes its JSON (timings are not checked)."""

import importlib
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_serve_benchmark_smoke(tmp_path, capsys):
    bench = importlib.import_module("benchmarks.serve.speed")
    args = ["--size", "nano", "--ttft", "8", "16", "--depths", "8", "--batches", "1", "2"]
    args += ["--steps", "2", "--rounds", "1", "--no-peak", "--out", str(tmp_path), "--label", "smoke"]
    assert bench.main(args) == 0
    (path,) = tmp_path.glob("serve-smoke-*.json")
    report = json.loads(path.read_text())
    names = {"floatlm", "trilm", "quantlm-int4", "hf-generate"}
    assert set(report["ttft_ms"]) == names and set(report["decode_tokens_per_s"]) == names
    assert set(report["decode_tokens_per_s"]["trilm"]) == {"depth8-batch1", "depth8-batch2"}
    assert report["memory"]["trilm"]["model_mb"] < report["memory"]["floatlm"]["model_mb"]
    assert "not measured" in report["targets"]["trilm_over_floatlm_decode"]
    assert "engine/hf-generate decode tokens/s" in report["ratios"]
    assert "wrote" in capsys.readouterr().out
    assert report["command"] == "python -m benchmarks.serve.speed " + " ".join(args)
    assert set(report["device"]) >= {"cpu", "cpu_capability", "cpus", "torch_threads", "load_average"}


def test_cpu_serve_benchmark_smoke(tmp_path):
    """benchmarks/serve/cpu.py end to end with its eager trilm contenders (no compile, no llama.cpp): one
    process per thread count, rows and targets in the JSON."""
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "benchmarks.serve.cpu", "--models", "tiny", "--threads", "1"]
    cmd += ["--rounds", "1", "--steps", "2", "--prompt", "8", "--only", "eager", "--no-llama"]
    cmd += ["--workdir", str(tmp_path / "work"), "--out", str(tmp_path), "--conditions", "smoke test"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    (path,) = tmp_path.glob("cpu-serve-*.json")
    report = json.loads(path.read_text())
    names = {r["contender"] for r in report["rows"]}
    assert names == {
        "trilm floatlm fp32 eager",
        "trilm floatlm bf16 eager plain-linears",
        "trilm floatlm bf16 eager",
        "trilm trilm dequantized fp32 eager",
        "trilm trilm packed bf16 eager",
    }
    assert all(r["decode_tok_s"] > 0 and r["prefill_tok_s"] > 0 and r["threads"] == 1 for r in report["rows"])
    assert all(t["ratio"] is None for t in report["targets"])  # llama.cpp and compiled rows not run
    assert report["conditions"] == "smoke test"


def test_cpu_kernels_benchmark_smoke(tmp_path, capsys):
    bench = importlib.import_module("benchmarks.kernels.cpu")
    args = ["--model", "trilm-nano", "--threads", "1", "--batches", "1", "--rounds", "1", "--reps", "1"]
    assert bench.main([*args, "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("cpu-kernels-trilm-nano-*.json")
    rows = json.loads(path.read_text())["rows"]
    assert {r["kernel"] for r in rows} >= {
        "dense_fp32",
        "dense_bf16",
        "int4_bf16",
        "int8_bf16",
        "unpack_fp32",
    }
    assert all(r["us"] > 0 for r in rows)
