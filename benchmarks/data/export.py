"""Export sizes for the Spectra ladder, and the parity of every export path on a small random model.

Launch::

    python -m benchmarks.data.export                         # both parts, prints tables, writes JSON
    python -m benchmarks.data.export --sizes 99m,1.1b --json out.json --skip-parity

Part 1, sizes (TriLM at its training TP): bytes of the packed export (one layer of each matrix packed by the
codec, times the layers, plus fp16 embedding, head and norms) and of GGUF TQ2_0/TQ1_0 (block bytes from
gguf's quant table, fp16 embedding and output, F32 norms), against the fp16 model; whether every 256-block of
every matrix is TQ-exact as trained or needs its partition scales folded (o_proj of 1.1B and 1.5B).

Part 2, parity (fp32, CPU): a FloatLM and a TriLM with 2 scale partitions, hidden 256, 2 layers —
max |Δ logits| of the HF export under transformers, of the packed export under trilm.infer, of the GGUF
(dequantized and run with llama.cpp's interleaved RoPE); max |Δ log-likelihood| between trilm's lm-eval
model and lm-eval's ``hf`` model (prefix token = EOS) on the shipped task prompts.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

import trilm.eval.tasks
from benchmarks.common import write_result
from trilm.model import preset
from trilm.model.config import SPECTRA_SIZES
from trilm.model.flops import parameter_counts
from trilm.model.spec import LINEARS
from trilm.train.models import save_model


def ladder_sizes(sizes: list[str]) -> list[dict]:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    from trilm.export.gguf import single_magnitude_blocks
    from trilm.formats import TernaryWeight, partition_scales

    rows = []
    for size in sizes:
        parts = SPECTRA_SIZES[size][4]
        cfg = preset(f"trilm-{size}", quant={"partitions": parts})
        counts = parameter_counts(cfg)
        layer = cfg.layer_shape(
            0
        )  # partitions split a column-parallel matrix's outputs, a row-parallel's inputs
        shapes = {
            lin.leaf: (*lin.shape(cfg, layer), "out" if lin.parallel == "column" else "in") for lin in LINEARS
        }
        packed_bits, straddle = 0, []
        gen = torch.Generator().manual_seed(0)
        for name, (n, k, axis) in shapes.items():
            codes = torch.randint(-1, 2, (n, k), generator=gen, dtype=torch.int8)
            gammas = torch.rand(parts, generator=gen) + 0.5
            w = TernaryWeight.pack(codes, partition_scales(gammas, n, k, axis))
            packed_bits += w.storage_bits()
            if not single_magnitude_blocks(w.dequantize()):
                straddle.append(name)
            del codes, w
        other = counts.total - counts.linear
        fp16 = 2 * counts.total
        packed = packed_bits / 8 * cfg.layers + 2 * other
        row = {"size": size, "partitions": parts, "params": counts.total, "fp16_bytes": fp16,
               "packed_bytes": packed, "packed_vs_fp16": packed / fp16, "tq_fold": straddle}  # fmt: skip
        for qtype in ("TQ2_0", "TQ1_0"):
            block, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType[qtype]]
            size_bytes = (
                counts.linear // block * nbytes + 2 * (counts.embedding + counts.head) + 4 * counts.norm
            )
            row[f"{qtype.lower()}_bytes"] = size_bytes
            row[f"{qtype.lower()}_vs_fp16"] = size_bytes / fp16
        rows.append(row)
        print(
            f"{size:>5} P={parts}  fp16 {fp16 / 1e9:6.3f} GB  packed {packed / 1e9:6.3f} GB "
            f"({row['packed_vs_fp16']:.3f}×)  TQ2_0 {row['tq2_0_bytes'] / 1e9:6.3f} GB  TQ1_0 "
            f"{row['tq1_0_bytes'] / 1e9:6.3f} GB  folded for TQ: {', '.join(straddle) or 'none'}"
        )
    return rows


def _corpus_texts(limit: int) -> list[str]:
    import itertools

    from trilm.data import embedded_corpus_dir
    from trilm.data.slimpajama import read_documents, split_files

    docs = itertools.chain.from_iterable(
        read_documents(f) for f in split_files(embedded_corpus_dir(), "train")
    )
    return [d.text for d in itertools.islice(docs, limit)]


def _snapshot(root: Path, model, tok) -> Path:
    """A complete run-shaped snapshot (``root/snapshots/step-1``) with the run's tokenizer."""

    snap = root / "snapshots" / "step-1"
    save_model(
        model,
        snap,
        meta={"step": 1, "run": root.name, "family": model.cfg.family, "tokenizer_hash": tok.hash},
    )
    (snap / "COMPLETE").write_text("{}")
    (root / "tokenizer.model").write_bytes(tok.path.read_bytes())
    return snap


def parity() -> dict:
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM
    from transformers import AutoModelForCausalLM

    from trilm.data.tokenizer import train_tokenizer
    from trilm.eval.lm_eval_model import TrilmLM
    from trilm.export.gguf import export_snapshot_gguf
    from trilm.export.hf import export_snapshot_hf
    from trilm.export.packed import export_snapshot_packed
    from trilm.infer import load_inference_model
    from trilm.model import build_model

    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        tok = train_tokenizer(_corpus_texts(60), root / "tok/tokenizer.model", vocab_size=512)
        ids = torch.randint(0, 512, (2, 48), generator=torch.Generator().manual_seed(0))
        task_file = Path(trilm.eval.tasks.__file__).parent / "trilm_lastword.jsonl"
        prompts = [json.loads(line) for line in task_file.read_text().splitlines()][:20]
        for family in ("floatlm", "trilm"):
            cfg = preset(f"{family}-nano", vocab_size=512, hidden=256, ffn=512, layers=2, context=64,
                         quant={"partitions": 2})  # fmt: skip
            snap = _snapshot(root / family, build_model(cfg, tp=1, seed=1), tok)
            with torch.no_grad():
                want = load_inference_model(snap)(ids)
                hf_dir = export_snapshot_hf(snap, root / f"{family}-hf", dtype="float32")
                hf = AutoModelForCausalLM.from_pretrained(hf_dir, attn_implementation="eager").eval()
                row = {"hf_logits": float((hf(ids).logits - want).abs().max())}
                if family == "trilm":
                    export_snapshot_packed(snap, root / "packed", dtype="float32")
                    got = load_inference_model(root / "packed")(ids)
                    row["packed_logits"] = float((got - want).abs().max())
                gguf = export_snapshot_gguf(
                    snap, root / f"{family}.gguf", qtype="f16" if family == "floatlm" else "tq2_0"
                )
                row["gguf_readback"] = max(gguf.max_error.values())
            texts = [p["text"] for p in prompts]
            reqs = [Instance("loglikelihood", {}, (t.rsplit(" ", 1)[0], " " + t.rsplit(" ", 1)[1]), i)
                    for i, t in enumerate(texts)]  # fmt: skip
            a = TrilmLM(pretrained=str(snap)).loglikelihood(reqs)
            b = HFLM(pretrained=str(hf_dir), prefix_token_id=2, device="cpu", dtype="float32").loglikelihood(
                reqs
            )
            row["lm_eval_loglikelihood"] = max(abs(x[0] - y[0]) for x, y in zip(a, b))
            out[family] = row
            print(f"{family:>8}: " + ", ".join(f"{k} max|Δ| {v:.2e}" for k, v in row.items()))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(SPECTRA_SIZES))
    parser.add_argument("--skip-parity", action="store_true")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    start = time.perf_counter()
    result: dict = {}
    result["sizes"] = ladder_sizes([s for s in args.sizes.split(",") if s])
    if not args.skip_parity:
        result["parity"] = parity()
    result["seconds"] = time.perf_counter() - start
    if args.json:
        write_result(args.json, result, module=__spec__.name)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
