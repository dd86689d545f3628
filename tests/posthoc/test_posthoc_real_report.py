"""The real-model evidence report (``experiments/posthoc_real/report.py``, run as its command): its verdicts
come from the rows, so a claim that a row contradicts reads *fails*, and one without its rows reads *not
measured*. The report is rendered by ``python -m experiments.posthoc_real.report`` in a subprocess: tests
import no experiment."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLAIM = re.compile(r"^\| (.+?) \| \*\*(.+?)\*\* \| (.*) \|$")


def render(payload: dict) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.posthoc_real.report", "-"],
        input=json.dumps(payload),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def verdicts(rows: dict) -> list[tuple[str, str, str]]:
    """(claim, verdict, numbers) of the report's claims table."""
    text = render(_payload(rows))
    table = text.split("## The seeds' claims on this model", 1)[1].split("\n## ", 1)[0]
    return [m.groups() for line in table.splitlines() if (m := CLAIM.match(line))]


def _row(ppl: float, paper: float | None = None, **extra) -> dict:
    return {"ppl": ppl, "bits": {"stored": paper, "paper": paper}, "seconds": 1.0, "eval_s": 1.0, **extra}


def _payload(rows: dict, **extra) -> dict:
    settings = {"eval_tokens": 8, "seq_len": 4, "calib_samples": 2, "calib_seq_len": 4, "omni_epochs": 5}
    settings |= {"pg_steps": 1, "threads": 1}
    return {"model": "m.gguf", "settings": settings, "device": {"cpus": 2}, "rows": rows, **extra}


def _verdict(claims: list[tuple[str, str, str]], claim_start: str) -> str:
    return next(v for claim, v, _ in claims if claim.startswith(claim_start))


def test_verdicts_follow_the_numbers():
    rows = {
        "rtn-w3": _row(40.0),
        "gptq-w3": _row(30.0),
        "rtn-w2": _row(100.0),
        "gptq-w2": _row(120.0),
        "omniquant-w3": _row(30.0),
        "naive-1bit": _row(1000.0),
        "pbllm": _row(600.0),
        "billm": _row(300.0, 1.06),
        "stbllm-6:8": _row(400.0, 0.8),
        "magnitude-keep0.9": _row(20.0, params={"before": 10, "after": 9}),
        "pg-keep0.9": _row(25.0, params={"before": 10, "after": 9}),
    }
    claims = verdicts(rows)
    assert _verdict(claims, "GPTQ < RTN at W3") == "holds"
    assert _verdict(claims, "GPTQ < RTN at W2") == "fails"
    assert _verdict(claims, "OmniQuant ≤ GPTQ at W3") == "holds"  # equal counts as ≤
    assert _verdict(claims, "OmniQuant ≤ GPTQ at W2") == "not measured"
    assert _verdict(claims, "PB-LLM far below") == "fails"  # 600 is not under half of 1000
    assert _verdict(claims, "BiLLM far below") == "holds"
    assert _verdict(claims, "STBLLM 6:8 near BiLLM") == "holds"  # 400 <= 1.5 x 300, 0.8 < 1.06 bits
    assert _verdict(claims, "policy-gradient ≤ magnitude pruning at keep 0.9") == "fails"
    rows["stbllm-6:8"] = _row(400.0, 1.2)
    rows["gptq-w3"]["device"] = {"cpu": "AMD EPYC", "cpu_capability": "AVX2"}
    claims = verdicts(rows)
    numbers = next(n for c, _, n in claims if c.startswith("GPTQ < RTN at W3"))
    assert numbers == "gptq-w3 30.000 vs rtn-w3 40.000 (measured on two CPUs: see **CPUs** above)"
    text = render(_payload(rows))
    assert "**CPUs**" in text and "AMD EPYC (AVX2): gptq-w3" in text
    assert _verdict(claims, "STBLLM 6:8 near BiLLM") == "fails"  # more bits than BiLLM
    assert _verdict(claims, "STBLLM 4:8 < BiLLM + magnitude 4:8") == "not measured"
    rows["stbllm-4:8"], rows["billm-magnitude-4:8"] = _row(900.0, 0.53), _row(800.0, 0.53)
    assert _verdict(verdicts(rows), "STBLLM 4:8 < BiLLM + magnitude 4:8") == "fails"


def test_report_shows_the_export_in_llama_cpp_and_the_served_chat():
    payload = {
        "model": "m.gguf",
        "settings": {
            "eval_tokens": 8192,
            "seq_len": 1024,
            "calib_samples": 32,
            "calib_seq_len": 512,
            "omni_epochs": 5,
            "pg_steps": 60,
            "threads": 1,
        },
        "device": {"cpus": 2},
        "rows": {"float": _row(13.2, 32.0), "gptq-w4": _row(16.3, 4.3)},
        "missing": ["rtn-w4"],
        "llama_cpp": {
            "command": "python -m experiments.posthoc_real.llama_cpp --model M",
            "model": "gptq-w4",
            "gguf": {"type": "f16"},
            "llama_cpp_python": "0.3.36",
            "tokens_compared": 513,
            "logits": {"max_abs_delta": 0.0123, "max_abs_logit": 30.0, "top1_agreement": 0.998},
            "mean_nll": {"trilm": 2.81, "llama.cpp": 2.8101},
            "tokenization": {"all_equal": True},
            "chat": {"trilm": "Paris.", "llama.cpp": "Paris.", "same_tokens": True},
        },
        "serve_chat": {
            "server": "trilm serve --model M",
            "exchanges": [
                {
                    "request": {"messages": [{"role": "user", "content": "Capital of France?"}]},
                    "reply": {"choices": [{"message": {"content": "Paris."}, "finish_reason": "stop"}]},
                    "seconds": 1.5,
                }
            ],
        },
    }
    text = render(payload)
    assert "max |Δ| 0.0123" in text and "top-1 agreement 99.80%" in text
    assert "'Capital of France?' → 'Paris.' (stop, 1.5 s)" in text
    assert "`rtn-w4`" in text and "| gptq-w4 | 16.300 | 1.23 |" in text


def test_report_locates_the_massive_activation_and_splits_each_error():
    def block(i: int, mse: float, share: float, peak: float) -> dict:
        return {"block": i, "mse": mse, "share_first_position": share, "float_max_abs": peak}

    payload = _payload(
        {"float": _row(13.2, 32.0), "gptq-w3": _row(28.8, 3.3)},
        blocks={
            "windows": "calib.pt[:2]",
            "rows": {
                "gptq-w3": [block(0, 1.0, 0.1, 30), block(1, 10.0, 0.5, 2e4), block(2, 20.0, 0.25, 9e3)],
                "omniquant-w3": [block(0, 2.0, 0.1, 30), block(1, 200, 0.99, 2e4), block(2, 50, 0.5, 9e3)],
            },
            "pinned_first_position": [
                {"row": "float", "ppl_pinned": 13.1},
                {"row": "gptq-w3", "ppl": 29.0, "ppl_pinned": 29.5},
            ],
            "calibration_nll": {"windows": "calib.pt (all 2)", "float": 2.5, "gptq-w3": 3.0, "other": 1.0},
            "hybrids": [
                {"spec": "omniquant-w3:gptq-w3:", "swapped": [], "ppl": 29.5},
                {"spec": "omniquant-w3:gptq-w3:layers.1.", "swapped": ["a", "b"], "ppl": 27.0},
            ],
        },
    )
    text = render(payload)
    assert "jumps from 30 to 20,000 at block 1" in text
    assert "| gptq-w3 | 0.1 / 0.9 | 5 / 5 | 5 / 15 |" in text
    assert "| omniquant-w3 with `layers.1.*` from gptq-w3 | 2 | 27.000 |" in text
    assert "| omniquant-w3 | 0 | 29.500 |" in text
    assert "| float | 13.200 | 13.100 |" in text  # an older blocks.json: the table's perplexity beside it
    assert "| gptq-w3 | 29.000 | 29.500 |" in text  # measured beside the pinned one, not the table's 28.8
    assert "(calib.pt (all 2))" in text
    assert "| float | 2.5000 | 2.5802 |" in text  # ln 13.2
    assert "| gptq-w3 | 3.0000 | 3.3604 |" in text
    assert "| other |" not in text  # a row of blocks.json without a row in the table


def test_side_by_side_with_llmcompressor_says_whether_the_times_compare():
    rows = {
        "gptq-w3": _row(28.8, 3.3, device={"cpu": "AMD EPYC"}),
        "llmcompressor-gptq-w3": _row(29.9, 3.3, device={"cpu": "AMD EPYC"}),
        "gptq-w4": _row(16.3, 4.3, device={"cpu": "AMD EPYC"}),
        "llmcompressor-gptq-w4": _row(16.5, 4.3, device={"cpu": "Xeon"}),
    }
    text = render(_payload(rows))
    assert "| W3 g64 | — | 29.900 | 1 | 1 | yes | 28.800 |" in text
    assert "| W4 g64 | — | 16.500 | 1 | 1 | no (AMD EPYC; Xeon) | 16.300 |" in text
    rows["gptq-w4-static"] = _row(16.2, 4.3, device={"cpu": "Xeon"})
    assert "| W4 g64 | 16.200 | 16.500 | 1 | 1 | yes | 16.300 |" in render(_payload(rows))
