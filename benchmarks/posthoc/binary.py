"""Evidence for the binary post-hoc methods: plain binarization, PB-LLM (PTQ and QAT), BiLLM, STBLLM.

    python -m benchmarks.posthoc.binary --run-dir runs/posthoc --model quickstart
    python -m benchmarks.posthoc.binary --run-dir runs/posthoc          # the posthoc-floatlm model

The same FloatLM, data and evaluation as ``benchmarks/posthoc/quantize.py`` (``posthoc/_model.py``): every
row goes through ``trilm quantize``'s path (:func:`trilm.posthoc.quantlm.quantize_to_quantlm`: calibration
windows of the train split, seed 0, a QuantLM written and loaded back through ``kernels.QuantLinear``,
validation loss on the fixed validation sequences). Per row: perplexity, the paper's value bits, the
information-theoretic minimum of the output and the stored bits (per weight of the block linears), and time.

Rows: plain binarization (α·sign(W) per row, α = mean |W|: XNOR-Net's scale, no calibration), PB-LLM at 10 %
and 20 % salient (Hessian saliency; PTQ and QAT; 10 % with magnitude saliency and with the reference
statistics), BiLLM (Hessian, magnitude, reference mode), BiLLM + magnitude N:M (the STBLLM paper's baseline:
N:M by |W|, BiLLM's two-group split, uniform N) and STBLLM at 4:8 and 6:8 (standardized importance,
trisection, adaptive per-layer N). The papers' directions are checked and printed: PB-LLM ≪ plain
binarization; Hessian saliency ≤ magnitude; STBLLM < BiLLM + magnitude N:M at equal value bits.

Results: ``benchmarks/results/posthoc-binary-<model>-<date>.json`` and a Markdown table. Timings come from a
shared machine (noisy); compare them within one run only.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
from pathlib import Path

import torch

from benchmarks.common import CHECKOUT, today, write_result
from benchmarks.posthoc._model import add_compression_args, prepare_posthoc_model
from benchmarks.posthoc.quantize import evaluate
from trilm.store.hf import write_hf_files
from trilm.store.snapshot import read_snapshot_config, write_snapshot
from trilm.suite.text import table as text_table

ROWS = {
    # name: (method, settings)
    "pbllm-10": ("pbllm", {"low_frac": 0.9}),
    "pbllm-10-magnitude": ("pbllm", {"low_frac": 0.9, "salient_metric": "magnitude"}),
    "pbllm-10-reference": ("pbllm", {"low_frac": 0.9, "reference_mode": True}),
    "pbllm-20": ("pbllm", {"low_frac": 0.8}),
    "pbllm-10-qat": ("pbllm", {"low_frac": 0.9, "qat_steps": -1}),
    "pbllm-20-qat": ("pbllm", {"low_frac": 0.8, "qat_steps": -1}),
    "billm": ("billm", {}),
    "billm-magnitude": ("billm", {"salient_metric": "magnitude"}),
    "billm-reference": ("billm", {"reference_mode": True}),
    "billm-magnitude-4:8": (
        "stbllm",
        {"n": 4, "prune_metric": "magnitude", "groups": 2, "adaptive_n": False},
    ),
    "stbllm-4:8": ("stbllm", {"n": 4}),
    "billm-magnitude-6:8": (
        "stbllm",
        {"n": 6, "prune_metric": "magnitude", "groups": 2, "adaptive_n": False},
    ),
    "stbllm-6:8": ("stbllm", {"n": 6}),
    # STBLLM's three changes to the BiLLM + magnitude N:M baseline, one at a time (4:8)
    "ablation-4:8-si": ("stbllm", {"n": 4, "groups": 2, "adaptive_n": False}),
    "ablation-4:8-trisection": ("stbllm", {"n": 4, "prune_metric": "magnitude", "adaptive_n": False}),
    "ablation-4:8-adaptive": ("stbllm", {"n": 4, "prune_metric": "magnitude", "groups": 2}),
    "ablation-4:8-uniform": ("stbllm", {"n": 4, "adaptive_n": False}),
    "ablation-4:8-per-linear-n": ("stbllm", {"n": 4, "adaptive_unit": "linear"}),
}
"""``qat_steps: -1`` takes ``--qat-steps``."""


def plain_binary(model, out: Path) -> dict:
    """α·sign(W) per row for every block linear (BinaryWeight, fp16 α), written as a packed snapshot."""
    from trilm.formats import BinaryWeight
    from trilm.infer import load_with_meta

    start = time.perf_counter()
    cfg, meta = read_snapshot_config(model.snapshot)
    net, _ = load_with_meta(model.snapshot)
    packed = {}
    for name, module in net.linear_modules().items():
        w = module.weight.detach().float()
        alpha = w.abs().mean(1).to(torch.float16)
        signs = torch.where(w >= 0, 1, -1).to(torch.int8)
        packed[name.removesuffix(".weight")] = BinaryWeight.pack(signs, alpha.unsqueeze(0))
    state = {k: v for k, v in net.state_dict().items() if k.removesuffix(".weight") not in packed}
    if out.exists():
        shutil.rmtree(out)
    write_snapshot(out, cfg, meta, state, packed, tokenizer=model.tokenizer)
    seconds = time.perf_counter() - start
    weights = sum(p.out_features * p.in_features for p in packed.values())
    stored = sum(p.storage_bits() for p in packed.values()) / weights
    return {"quantize_s": seconds, "bits_paper": 1.0, "bits_minimum": None, "bits_stored": stored}


def quantize_row(model, name: str, args, out_root: Path) -> dict:
    from trilm.posthoc.calibration import CalibrationConfig
    from trilm.posthoc.engine import EngineConfig
    from trilm.posthoc.quantlm import QuantizeJob, quantize_to_quantlm
    from trilm.posthoc.registry import MethodOptions, get_method

    method, settings = ROWS[name]
    settings = dict(settings)
    if settings.get("qat_steps") == -1:
        settings.update(qat_steps=args.qat_steps, qat_lr=args.qat_lr, qat_batch=args.qat_batch)
    out = out_root / name.replace(":", "-")
    if out.exists():
        shutil.rmtree(out)
    calib = CalibrationConfig(
        source=str(model.train), samples=args.samples, seq_len=model.seq_len, seed=args.calib_seed
    )
    job = QuantizeJob(
        source=model.snapshot,
        method=method,
        config=get_method(method).config(**settings),
        calib=calib,
        out=out,
        engine=EngineConfig(device=args.device, batch_size=8, progress=not args.no_progress),
        options=MethodOptions(),
        eval_split=model.validation,
        eval_sequences=args.eval_sequences,
    )
    summary = quantize_to_quantlm(job)
    q = summary.quant
    row = {
        "val_loss": summary.val_loss,
        "quantize_s": q["seconds"]["quantize"],
        "bits_paper": q["bits"]["paper"],
        "bits_minimum": q["bits"]["minimum"],
        "bits_stored": q["bits"]["stored"],
        "settings": q["method_settings"],
        "quantlm": str(out),
    }
    if method == "stbllm":
        layer_n = q["method_settings"].get("layer_n")
        row["layer_n"] = sorted(set(layer_n.values())) if layer_n else [settings["n"]]
    return row


HF_ROWS = {
    "pbllm-10": ("pbllm", ["--low-frac", "0.9"]),
    "billm": ("billm", []),
    "stbllm-4:8": ("stbllm", ["--n", "4", "--m", "8"]),
}


def hf_rows(model, args, out_root: Path) -> dict:
    """The FloatLM exported as a Hugging Face Llama directory, quantized by ``trilm quantize`` with each
    method and evaluated (the same validation sequences)."""
    from trilm.cli import main as trilm_main
    from trilm.store.open import open_model

    source = open_model(model.snapshot)
    hf = out_root / "hf-llama"
    if hf.exists():
        shutil.rmtree(hf)
    write_hf_files(source.config, source.weights.float_state(), hf, dtype=torch.float32)
    shutil.copy(model.tokenizer, hf / "tokenizer.model")
    fp = evaluate(hf, model.validation, model.seq_len, args.eval_sequences)
    out: dict = {"fp_ppl": math.exp(fp)}
    for name, (method, extra) in HF_ROWS.items():
        target = out_root / f"hf-{name.replace(':', '-')}"
        if target.exists():
            shutil.rmtree(target)
        argv = ["quantize", str(hf), "--method", method, *extra, "--calib", str(model.train)]
        argv += ["--samples", str(args.samples), "--seq-len", str(model.seq_len), "--out", str(target)]
        argv += [
            "--eval",
            str(model.validation),
            "--eval-sequences",
            str(args.eval_sequences),
            "--no-progress",
        ]
        rc = trilm_main(argv)
        loss = evaluate(target, model.validation, model.seq_len, args.eval_sequences) if rc == 0 else None
        out[name] = {"rc": rc, "ppl": None if loss is None else math.exp(loss)}
    return out


FIXTURES = CHECKOUT / "tests" / "reference" / "quantizers" / "ref_fixtures.npz"


def fixture_comparison() -> dict:
    """Reference mode against the corrected defaults on the fixture layer (64×256, one thread): proxy
    losses (the reference mode reproduces the stored outputs), and PB-LLM's α with and without the salient
    zeros in its statistics."""
    import numpy as np

    from trilm.posthoc import quantize_layer
    from trilm.posthoc.pbllm import binarized_mask, binary_statistics

    arrays = {k: torch.from_numpy(v) for k, v in np.load(FIXTURES).items()}
    W, H = arrays["W0"], arrays["H"]
    out: dict = {"layer": "tests/reference/quantizers W0 (64×256), H"}
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for method, cases in (
            ("pbllm", [(lf, m) for lf in (0.9, 0.5) for m in ("hessian", "magnitude")]),
            ("billm", [(None, m) for m in ("hessian", "magnitude")]),
        ):
            for low_frac, metric in cases:
                kw = {"salient_metric": metric} | ({"low_frac": low_frac} if low_frac is not None else {})
                ref = quantize_layer(method, W, H, reference_mode=True, **kw)
                cor = quantize_layer(method, W, H, **kw)
                case = (
                    f"pbllm_xnor_lowfrac{low_frac}_{metric}" if method == "pbllm" else f"billm_braq_{metric}"
                )
                differ = int(((ref.weight - arrays[case]).abs() > 1e-6).sum())
                out[case] = {
                    "reference": ref.proxy_loss,
                    "corrected": cor.proxy_loss,
                    "entries_differ": differ,
                }
        mask = binarized_mask(W.abs(), 0.9, reference=False)
        a_ref, _ = binary_statistics(W, mask, reference=True)
        a_cor, _ = binary_statistics(W, mask, reference=False)
        out["pbllm_alpha_ratio_median"] = float((a_ref / a_cor).median())
    finally:
        torch.set_num_threads(before)
    return out


def directions(rows: dict) -> dict[str, dict]:
    """The papers' orderings, each with the numbers it compares and whether it holds here."""
    ppl = {k: v["ppl"] for k, v in rows.items()}
    checks = {}

    def check(label, left, right, relation):
        if left in ppl and right in ppl:
            a, b = ppl[left], ppl[right]
            holds = a < b if relation == "<" else a <= b
            checks[label] = {
                "left": left,
                "right": right,
                "ppl": [a, b],
                "relation": relation,
                "holds": holds,
            }

    check("PB-LLM 10 % < plain binarization", "pbllm-10", "plain-binary", "<")
    check("PB-LLM 20 % < plain binarization", "pbllm-20", "plain-binary", "<")
    check("Hessian ≤ magnitude (PB-LLM 10 %)", "pbllm-10", "pbllm-10-magnitude", "≤")
    check("Hessian ≤ magnitude (BiLLM)", "billm", "billm-magnitude", "≤")
    check("STBLLM 4:8 < BiLLM + magnitude 4:8", "stbllm-4:8", "billm-magnitude-4:8", "<")
    check("STBLLM 6:8 < BiLLM + magnitude 6:8", "stbllm-6:8", "billm-magnitude-6:8", "<")
    check("STBLLM 4:8, uniform N < BiLLM + magnitude 4:8", "ablation-4:8-uniform", "billm-magnitude-4:8", "<")
    check("PB-LLM 10 % QAT ≤ PTQ", "pbllm-10-qat", "pbllm-10", "≤")
    return checks


def table(fp: dict, rows: dict) -> str:
    def f(v, digits=3):
        return "—" if v is None else f"{v:.{digits}f}"

    headers = [
        "method",
        "value bits (paper)",
        "minimum bits",
        "stored bits",
        "val loss",
        "perplexity",
        "time (s)",
    ]
    cells = [["FP32", "32", "—", "32", f"{fp['val_loss']:.4f}", f"{fp['ppl']:.2f}", "—"]]
    for name, r in rows.items():
        bits = [f(r["bits_paper"]), f(r["bits_minimum"]), f(r["bits_stored"])]
        cells.append([name, *bits, f"{r['val_loss']:.4f}", f"{r['ppl']:.2f}", f"{r['quantize_s']:.1f}"])
    return text_table(headers, cells, markdown=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_compression_args(parser)
    parser.add_argument("--rows", default=",".join(["plain-binary", *ROWS]), help="comma list of rows")
    parser.add_argument("--qat-steps", type=int, default=200)
    parser.add_argument("--qat-lr", type=float, default=1e-4)
    parser.add_argument("--qat-batch", type=int, default=8)
    parser.add_argument("--hf", action="store_true", help="also quantize the exported HF Llama directory")
    parser.add_argument("--fixtures", action="store_true", help="reference vs corrected on the fixture layer")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    names = [r for r in args.rows.split(",") if r]
    unknown = [r for r in names if r != "plain-binary" and r not in ROWS]
    if unknown:
        parser.error(f"unknown rows {unknown}; known: plain-binary, {', '.join(ROWS)}")
    model = prepare_posthoc_model(args.run_dir, progress=not args.no_progress, model=args.model)

    cfg, meta = read_snapshot_config(model.snapshot)
    out_root = Path(args.run_dir) / "quantlms-binary" / args.model
    out_root.mkdir(parents=True, exist_ok=True)
    path = Path(args.out) / f"posthoc-binary-{args.model}-{today()}.json"
    previous = json.loads(path.read_text()) if path.is_file() else {}
    eval_setting = {
        "split": str(model.validation),
        "sequences": args.eval_sequences,
        "seq_len": model.seq_len,
    }
    result: dict = {
        "machine_note": "shared with other jobs",
        "model": {"snapshot": str(model.snapshot), "config": cfg.to_dict(), "params": meta.params},
        "calibration": {"split": str(model.train), "samples": args.samples, "seq_len": model.seq_len},
        "eval": eval_setting,
        "rows": previous.get("rows", {}) if previous.get("eval") == eval_setting else {},
    }
    fp_loss = evaluate(model.snapshot, model.validation, model.seq_len, args.eval_sequences)
    result["fp"] = {"val_loss": fp_loss, "ppl": math.exp(fp_loss)}
    print(f"FP: val loss {fp_loss:.4f}, perplexity {math.exp(fp_loss):.2f}", flush=True)
    for key in ("hf", "fixtures"):
        if key in previous and previous.get("eval") == eval_setting:
            result[key] = previous[key]
    if args.fixtures:
        result["fixtures"] = fixture_comparison()
        for case, v in result["fixtures"].items():
            if isinstance(v, dict):
                print(
                    f"{case}: proxy {v['reference']:.3f} (reference mode, {v['entries_differ']} entries "
                    f"off the stored output) → {v['corrected']:.3f} (corrected)",
                    flush=True,
                )
        print(
            f"PB-LLM α reference/corrected (median row): {result['fixtures']['pbllm_alpha_ratio_median']:.3f}"
        )
    for name in names:
        if name == "plain-binary":
            out = out_root / name
            row = plain_binary(model, out)
            row["val_loss"] = evaluate(out, model.validation, model.seq_len, args.eval_sequences)
        else:
            row = quantize_row(model, name, args, out_root)
        row["ppl"] = math.exp(row["val_loss"])
        result["rows"][name] = row
        minimum = "n/a" if row["bits_minimum"] is None else f"{row['bits_minimum']:.3f}"
        print(
            f"{name}: ppl {row['ppl']:.2f}, bits {row['bits_paper']:.3f} (paper) / {minimum} (minimum) / "
            f"{row['bits_stored']:.3f} (stored), {row['quantize_s']:.1f} s",
            flush=True,
        )
        result["directions"] = directions(result["rows"])
        _save(path, result, argv)
    if args.hf:
        result["hf"] = hf_rows(model, args, out_root)
        print(f"Hugging Face Llama directory: {result['hf']}", flush=True)
        _save(path, result, argv)
    print(table(result["fp"], result["rows"]))
    for label, c in result["directions"].items():
        print(
            f"{'holds' if c['holds'] else 'DOES NOT HOLD'}: {label}: {c['ppl'][0]:.2f} vs {c['ppl'][1]:.2f}"
        )
    print(f"results: {path}")
    return 0


def _save(path: Path, result: dict, argv: list[str] | None) -> None:
    payload = {**result, "table": table(result["fp"], result["rows"])}
    write_result(path, payload, module=__spec__.name, argv=argv, indent=2)


if __name__ == "__main__":
    sys.exit(main())
