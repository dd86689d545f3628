"""Evidence for post-hoc quantization: FP, RTN, GPTQ and OmniQuant at W4g128, W3g128 and W2g128.

    python -m benchmarks.posthoc --run-dir runs/posthoc --model quickstart
    python -m benchmarks.posthoc --run-dir runs/posthoc                    # the posthoc-floatlm model

1. The FloatLM (``benchmarks/posthoc/_model.py``: trained if missing) is evaluated on its validation split.
2. Every (method, setting) goes through the same path as ``trilm quantize``: the same calibration windows
   (N × L tokens of the train split, seed 0), a QuantLM written under RUN_DIR/quantlms/, loaded back with
   ``trilm.infer.load_inference_model`` (``kernels.QuantLinear`` layers) and evaluated with the
   validation-loss path on the fixed validation sequences. Perplexity = exp(mean next-token loss).
3. GPTQ per layer against a straightforward transcription of the reference loop (written below from the
   algorithm in docs/references.md#gptq), same process, same layers (the model's own Hessians),
   alternating rounds, median time; their outputs are compared too.
4. The Hugging Face path: the FloatLM exported as a ``LlamaForCausalLM`` directory, quantized by the CLI.
5. Calibration fit (``fit``): every QuantLM already written under RUN_DIR/quantlms/<model>/ evaluated on its
   own calibration windows, next to its validation loss. A method that is worse on validation *and* on the
   windows it was fitted to under-fits its objective; one that is better on them but worse on validation
   over-fits them.

Results go to ``benchmarks/results/posthoc-<model>-<date>.json`` and a Markdown table is printed. Timings on a
shared machine are noisy; the ratios in step 3 are measured side by side in one process.
"""

from __future__ import annotations

import argparse
import math
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch

from benchmarks.common import today, write_result
from benchmarks.posthoc._model import add_compression_args, prepare_posthoc_model
from trilm.store.hf import write_hf_files
from trilm.store.snapshot import read_snapshot_config
from trilm.suite.text import table as text_table

SETTINGS = {"W4g128": (4, 128), "W3g128": (3, 128), "W2g128": (2, 128)}
METHODS = ("rtn", "gptq", "omniquant")


# -- 3. a straightforward transcription of the reference GPTQ loop (timing baseline) ------------------------
def transcribed_gptq(W, H, bits, group_size, blocksize=128, percdamp=0.01, act_order=False):
    """GPTQ as the reference describes it, line by line: per-row min/max grid, dead columns, damping,
    upper Cholesky of H⁻¹, per-column rounding with immediate in-block updates and lazy block updates,
    dynamic groups fitted at each group start. Returns the dequantized weight."""
    W = W.clone().float()
    H = H.clone()
    k = W.shape[1]
    maxq = 2**bits - 1

    def find_params(x):
        zeros = torch.zeros(x.shape[0], device=x.device)
        xmin = torch.minimum(x.min(1).values, zeros)
        xmax = torch.maximum(x.max(1).values, zeros)
        empty = (xmin == 0) & (xmax == 0)
        xmin[empty] = -1
        xmax[empty] = 1
        scale = (xmax - xmin) / maxq
        return scale.unsqueeze(1), torch.round(-xmin / scale).unsqueeze(1)

    def quantize(x, scale, zero):
        q = torch.clamp(torch.round(x / scale) + zero, 0, maxq)
        return scale * (q - zero)

    scale, zero = find_params(W)
    dead = torch.diag(H) == 0
    H[dead, dead] = 1
    W[:, dead] = 0
    if act_order:
        perm = torch.argsort(torch.diag(H), descending=True)
        W, H = W[:, perm], H[perm][:, perm]
    Q = torch.zeros_like(W)
    diag = torch.arange(k)
    H[diag, diag] += percdamp * torch.mean(torch.diag(H))
    H = torch.linalg.cholesky(H)
    H = torch.cholesky_inverse(H)
    Hinv = torch.linalg.cholesky(H, upper=True)
    for i1 in range(0, k, blocksize):
        i2 = min(i1 + blocksize, k)
        W1 = W[:, i1:i2].clone()
        Q1 = torch.zeros_like(W1)
        Err1 = torch.zeros_like(W1)
        Hinv1 = Hinv[i1:i2, i1:i2]
        for i in range(i2 - i1):
            w = W1[:, i]
            d = Hinv1[i, i]
            if group_size != -1 and (i1 + i) % group_size == 0:
                scale, zero = find_params(W[:, i1 + i : i1 + i + group_size])
            q = quantize(w.unsqueeze(1), scale, zero).flatten()
            Q1[:, i] = q
            err = (w - q) / d
            W1[:, i:] -= err.unsqueeze(1).matmul(Hinv1[i, i:].unsqueeze(0))
            Err1[:, i] = err
        Q[:, i1:i2] = Q1
        W[:, i2:] -= Err1.matmul(Hinv[i1:i2, i2:])
    if act_order:
        Q = Q[:, torch.argsort(perm)]
    return Q


def model_hessians(snapshot: Path, windows: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """(W, H) of every linear of the float model's first block and one deeper block, from calibration."""
    from trilm.infer import load_inference_model
    from trilm.infer.model import block_linears
    from trilm.model.spec import BY_NAME
    from trilm.posthoc.engine import collect_inputs, run_block, site_modules
    from trilm.posthoc.hessian import HessianAccumulator

    model = load_inference_model(snapshot)
    x = model.embed(windows)
    cos, sin = model.rope(windows.shape[1])
    out = {}
    last = len(model.layers) - 1
    for index, block in enumerate(model.layers):
        if index in (0, last):
            linears = block_linears(block)
            sites = site_modules(linears)
            acc = {s: HessianAccumulator(m.weight.shape[1]) for s, m in sites.items()}

            def feed(site, t, _acc=acc):
                _acc[site].add_batch(t)

            collect_inputs(block, x, cos, sin, 8, sites, feed, stop_early=False)
            for name, module in linears.items():
                out[f"layers.{index}.{name}"] = (module.weight.detach().clone(), acc[BY_NAME[name].site].H)
        run_block(block, x, cos, sin, 8, out=x)
    return out


def time_gptq(layers, bits: int, group: int, rounds: int, act_order: bool) -> list[dict]:
    from trilm.posthoc import quantize_layer

    rows = []
    for name, (W, H) in layers.items():
        ours, ref = [], []
        result = transcribed = None
        for _ in range(rounds):
            t = time.perf_counter()
            result = quantize_layer("gptq", W, H, bits=bits, group_size=group, act_order=act_order)
            ours.append(time.perf_counter() - t)
            t = time.perf_counter()
            transcribed = transcribed_gptq(W, H, bits, group, act_order=act_order)
            ref.append(time.perf_counter() - t)
        same = float(((result.weight - transcribed).abs() <= 1e-6).float().mean())
        rows.append(
            {
                "layer": name,
                "shape": list(W.shape),
                "ours_s": statistics.median(ours),
                "transcription_s": statistics.median(ref),
                "ratio": statistics.median(ours) / statistics.median(ref),
                "identical_fraction": same,
            }
        )
    return rows


# -- 1./2. quantize, write, load, evaluate --------------------------------------------------------------
def evaluate(path: Path, validation: Path, seq_len: int, sequences: int) -> float:
    from trilm.infer import load_inference_model
    from trilm.posthoc.evaluate import validation_loss

    model = load_inference_model(path)
    return validation_loss(model, validation, seq_len, max_sequences=sequences)


def method_config(method: str, bits: int, group: int, epochs: int | None):
    from trilm.posthoc import UniformConfig
    from trilm.posthoc.omniquant import mode_config

    if method == "omniquant":
        mode = f"W{bits}A16g{group}"
        overrides = {} if epochs is None else {"epochs": epochs}
        return mode_config(mode, **overrides)
    if method == "gptq":  # the reference README's headline setting: act-order (+ true-sequential below)
        return UniformConfig(bits=bits, group_size=group, act_order=True)
    return UniformConfig(bits=bits, group_size=group)


def quantize_one(model, method, bits, group, args, out_root: Path) -> dict:
    from trilm.posthoc.calibration import CalibrationConfig
    from trilm.posthoc.engine import EngineConfig
    from trilm.posthoc.quantlm import QuantizeJob, quantize_to_quantlm
    from trilm.posthoc.registry import MethodOptions

    out = out_root / f"{method}-w{bits}g{group}"
    if out.exists():
        shutil.rmtree(out)
    calib = CalibrationConfig(
        source=str(model.train), samples=args.samples, seq_len=model.seq_len, seed=args.calib_seed
    )
    job = QuantizeJob(
        source=model.snapshot,
        method=method,
        config=method_config(method, bits, group, args.omni_epochs),
        calib=calib,
        out=out,
        engine=EngineConfig(device=args.device, batch_size=8, progress=not args.no_progress),
        options=MethodOptions(true_sequential=method == "gptq"),
        eval_split=model.validation,
        eval_sequences=args.eval_sequences,
    )
    start = time.perf_counter()
    summary = quantize_to_quantlm(job)
    q = summary.quant
    return {
        "method": method,
        "setting": f"W{bits}g{group}",
        "val_loss": summary.val_loss,
        "ppl": math.exp(summary.val_loss),
        "quantize_s": q["seconds"]["quantize"],
        "wall_s": time.perf_counter() - start,
        "bits_paper": q["bits"]["paper"],
        "bits_stored": q["bits"]["stored"],
        "settings": q["method_settings"],
        "memory": summary.report.memory_line(),
        "quantlm": str(out),
    }


def hf_check(model, args, out_root: Path) -> dict:
    """Export the FloatLM as a Hugging Face Llama, quantize that directory with the CLI, evaluate."""
    from trilm.cli import main as trilm_main
    from trilm.store.open import open_model

    source = open_model(model.snapshot)
    hf = out_root / "hf-llama"
    if hf.exists():
        shutil.rmtree(hf)
    write_hf_files(source.config, source.weights.float_state(), hf, dtype=torch.float32)
    shutil.copy(model.tokenizer, hf / "tokenizer.model")
    out = out_root / "hf-gptq-w4g128"
    if out.exists():
        shutil.rmtree(out)
    argv = ["quantize", str(hf), "--method", "gptq", "--bits", "4", "--group-size", "128", "--act-order"]
    argv += ["--calib", str(model.train), "--samples", str(args.samples), "--seq-len", str(model.seq_len)]
    argv += ["--out", str(out), "--eval", str(model.validation), "--eval-sequences", str(args.eval_sequences)]
    argv += ["--true-sequential"] + (["--no-progress"] if args.no_progress else [])
    rc = trilm_main(argv)
    loss = evaluate(out, model.validation, model.seq_len, args.eval_sequences) if rc == 0 else None
    fp = evaluate(hf, model.validation, model.seq_len, args.eval_sequences)
    return {"rc": rc, "fp_ppl": math.exp(fp), "gptq_w4g128_ppl": None if loss is None else math.exp(loss)}


def windows_loss(path: Path, windows: torch.Tensor, batch_size: int = 8) -> float:
    """Mean next-token loss of a (Quant)LM on token windows (N, L): the windows' own next tokens."""
    from trilm.infer import load_inference_model
    from trilm.posthoc.evaluate import next_token_loss

    return next_token_loss(load_inference_model(path), windows.split(batch_size))


def calibration_fit(model, args, out_root: Path) -> list[dict]:
    from trilm.posthoc.calibration import CalibrationConfig, load_calibration

    calib = load_calibration(
        CalibrationConfig(
            source=str(model.train), samples=args.samples, seq_len=model.seq_len, seed=args.calib_seed
        )
    )
    rows = []
    candidates = [("FP32", model.snapshot)]
    candidates += [(p.name, p) for p in sorted(out_root.iterdir()) if (p / "packed.safetensors").is_file()]
    for name, path in candidates:
        row = {
            "quantlm": name,
            "calibration_loss": windows_loss(path, calib.windows),
            "val_loss": evaluate(path, model.validation, model.seq_len, args.eval_sequences),
        }
        rows.append(row)
        print(f"{name:22s} calibration loss {row['calibration_loss']:.4f}  val loss {row['val_loss']:.4f}")
    return rows


def table(fp: dict, rows: list[dict]) -> str:
    headers = [
        "method",
        "setting",
        "bits (paper)",
        "bits (stored)",
        "val loss",
        "perplexity",
        "quantize time (s)",
    ]
    cells = [["FP32", "—", "32", "32", f"{fp['val_loss']:.4f}", f"{fp['ppl']:.2f}", "—"]]
    for r in rows:
        bits = [f"{r['bits_paper']:.3f}", f"{r['bits_stored']:.3f}"]
        cells.append(
            [
                r["method"],
                r["setting"],
                *bits,
                f"{r['val_loss']:.4f}",
                f"{r['ppl']:.2f}",
                f"{r['quantize_s']:.1f}",
            ]
        )
    return text_table(headers, cells, markdown=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_compression_args(parser)
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--omni-epochs", type=int, default=None, help="default: the reference per mode")
    parser.add_argument("--timing-rounds", type=int, default=3)
    parser.add_argument("--skip", default="", help="comma list of steps to skip: quantize,timing,hf")
    parser.add_argument("--also", default="", help="extra steps: fit (calibration fit of written QuantLMs)")
    parser.add_argument("--tag", default="", help="suffix of the results file (parallel partial runs)")
    args = parser.parse_args(argv)
    args.argv = argv
    if args.threads:
        torch.set_num_threads(args.threads)
    skip = {s for s in args.skip.split(",") if s}
    model = prepare_posthoc_model(args.run_dir, progress=not args.no_progress, model=args.model)

    cfg, meta = read_snapshot_config(model.snapshot)
    out_root = Path(args.run_dir) / "quantlms" / args.model
    out_root.mkdir(parents=True, exist_ok=True)
    result: dict = {
        "machine_note": "shared with other jobs",
        "model": {
            "snapshot": str(model.snapshot),
            "config": cfg.to_dict(),
            "params": meta.params,
            "tokens": meta.tokens,
            "train_seconds": model.train_seconds,
        },
        "calibration": {"split": str(model.train), "samples": args.samples, "seq_len": model.seq_len},
        "eval": {"split": str(model.validation), "sequences": args.eval_sequences, "seq_len": model.seq_len},
    }
    fp_loss = evaluate(model.snapshot, model.validation, model.seq_len, args.eval_sequences)
    result["fp"] = {"val_loss": fp_loss, "ppl": math.exp(fp_loss)}
    print(f"FP: val loss {fp_loss:.4f}, perplexity {math.exp(fp_loss):.2f}", flush=True)
    rows = []
    if "quantize" not in skip:
        for setting in [s for s in args.settings.split(",") if s]:
            bits, group = SETTINGS[setting]
            for method in [m for m in args.methods.split(",") if m]:
                row = quantize_one(model, method, bits, group, args, out_root)
                rows.append(row)
                print(f"{method} {setting}: ppl {row['ppl']:.2f} in {row['quantize_s']:.1f} s", flush=True)
                result["rows"] = rows
                _save(result, args, rows and table(result["fp"], rows))
    if "timing" not in skip:
        from trilm.posthoc.calibration import CalibrationConfig, load_calibration

        calib = load_calibration(
            CalibrationConfig(source=str(model.train), samples=args.samples, seq_len=model.seq_len)
        )
        layers = model_hessians(model.snapshot, calib.windows)
        result["gptq_timing"] = {
            "setting": "W4g128 act-order, dynamic groups, blocksize 128",
            "rows": time_gptq(layers, 4, 128, args.timing_rounds, act_order=True),
        }
        ratios = [r["ratio"] for r in result["gptq_timing"]["rows"]]
        result["gptq_timing"]["median_ratio"] = statistics.median(ratios)
        median = statistics.median(ratios)
        print(f"GPTQ ours/transcription time: median {median:.2f} over {len(ratios)} layers", flush=True)
        _save(result, args, rows and table(result["fp"], rows))
    if "fit" in args.also.split(","):
        result["calibration_fit"] = calibration_fit(model, args, out_root)
        _save(result, args, rows and table(result["fp"], rows))
    if "hf" not in skip:
        result["hf"] = hf_check(model, args, out_root)
        print(f"HF Llama directory: {result['hf']}")
    path = _save(result, args, rows and table(result["fp"], rows))
    if rows:
        print(table(result["fp"], rows))
    print(f"results: {path}")
    return 0


def _save(result: dict, args, markdown) -> Path:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = f"-{args.tag}" if args.tag else ""
    path = out / f"posthoc-{args.model}{tag}-{today()}.json"
    write_result(path, {**result, "table": markdown or None}, module=__spec__.name, argv=args.argv, indent=2)
    return path


if __name__ == "__main__":
    sys.exit(main())
