"""benchmarks/serve.py runs end to end at a toy scale and writes its JSON (timings are not checked)."""

import importlib.util
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_serve_benchmark_smoke(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("bench_serve", REPO / "benchmarks" / "serve.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
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
