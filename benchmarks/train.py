"""Training-speed ratios measured side by side in one run.

    python benchmarks/train.py                       # CPU: TriLM/FloatLM step time, trilm vs HF Llama
    python benchmarks/train.py --engine --out benchmarks/results   # GPU: MFU of FloatLM/TriLM-1.1B, bf16

CPU (targets): TriLM step time / FloatLM step time ≤ 1.10 (fake-quant must be cheap); trilm FloatLM
training tokens/s ÷ transformers' ``LlamaForCausalLM`` with the same shape, batch and threads ≥ 1.0.
Each contender runs in alternating rounds and the median round counts, so machine noise hits all alike.

GPU: FloatLM-1.1B on one device in bf16 through the trainer's own DeepSpeed engine, MFU from the one
FLOPs function (target ≥ 40% on an H200) and TriLM-1.1B within 10% of it; a JSON with the device name and
date goes to ``--out``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trilm.model import build_model, flops_per_token, preset
from trilm.model.hf import export_hf


def _trainer_step(model, opt, batch):
    loss = model(batch[:, :-1], labels=batch[:, 1:]).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def _hf_step(model, opt, batch):
    # transformers shifts labels itself: the same next-token loss over the same window as _trainer_step
    inputs = batch[:, :-1]
    loss = model(input_ids=inputs, labels=inputs).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def cpu_benchmark(size: str, batch: int, seq: int, rounds: int, steps: int) -> dict:
    import tempfile

    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    base = preset(f"floatlm-{size}", vocab_size=2048, context=seq)
    contenders = {}
    for family in ("floatlm", "trilm"):
        model = build_model(base.replace(family=family, name=f"{family}-{size}"), seed=0)
        contenders[family] = (model, torch.optim.AdamW(model.parameters(), lr=1e-4), _trainer_step)
    with tempfile.TemporaryDirectory() as tmp:
        export_hf(base, contenders["floatlm"][0].full_state_dict(), tmp)
        hf = LlamaForCausalLM.from_pretrained(tmp, torch_dtype=torch.float32, attn_implementation="sdpa")
    hf.train()
    contenders["hf-llama"] = (hf, torch.optim.AdamW(hf.parameters(), lr=1e-4), _hf_step)
    data = torch.randint(0, 2048, (batch, seq + 1))
    times: dict[str, list[float]] = {k: [] for k in contenders}
    for model, opt, step in contenders.values():
        step(model, opt, data)  # warm-up
    for _ in range(rounds):
        for name, (model, opt, step) in contenders.items():
            t = time.perf_counter()
            for _ in range(steps):
                step(model, opt, data)
            times[name].append((time.perf_counter() - t) / steps)
    med = {k: statistics.median(v) for k, v in times.items()}
    tokens = batch * seq
    return {
        "config": {
            "size": size,
            "batch": batch,
            "seq": seq,
            "threads": torch.get_num_threads(),
            "rounds": rounds,
            "steps_per_round": steps,
        },
        "step_seconds": med,
        "tokens_per_s": {k: tokens / v for k, v in med.items()},
        "trilm_over_floatlm_step_time": med["trilm"] / med["floatlm"],
        "floatlm_over_hf_tokens_per_s": med["hf-llama"] / med["floatlm"],
    }


def _engine_step(engine, batch):
    engine.backward(engine(batch[:, :-1], labels=batch[:, 1:]).mean())
    engine.step()


def engine_benchmark(size: str, micro_batch: int, seq: int, steps: int, compile_model: bool) -> dict:
    """Step time and MFU through the trainer's own DeepSpeed engine (bf16 on GPU, fp32 on CPU)."""
    from trilm.model.transformer import Decoder
    from trilm.parallel import init_parallel
    from trilm.train.config import TrainConfig
    from trilm.train.engine import build_engine, set_optimizer_hparams
    from trilm.train.metrics import device_name, peak_flops

    info = init_parallel()
    cuda = info.device.type == "cuda"

    def now() -> float:
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    results = {}
    for family in ("floatlm", "trilm"):
        cfg = TrainConfig.from_dict(
            {
                "model": {"preset": f"{family}-{size}", "context": max(seq, 128)},
                "seq_len": seq,
                "batch_tokens": micro_batch * seq,
                "tokens": micro_batch * seq * steps,
                "micro_batch": micro_batch,
                "zero_stage": 0,
                "precision": "bf16" if cuda else "fp32",
                "compile": compile_model,
            }
        )
        model = Decoder(cfg.model.resolved(1), info, seed=0).to(info.device)
        engine = build_engine(model, cfg, 1, info)
        if compile_model:
            engine.compile()
        set_optimizer_hparams(engine, 1e-4, 0.1)
        data = torch.randint(0, cfg.model.vocab_size, (micro_batch, seq + 1), device=info.device)

        for _ in range(3):
            _engine_step(engine, data)
        t = now()
        for _ in range(steps):
            _engine_step(engine, data)
        seconds = (now() - t) / steps
        tok_s = micro_batch * seq / seconds
        fpt = flops_per_token(cfg.model, seq)
        peak = peak_flops()
        results[family] = {
            "step_seconds": seconds,
            "tokens_per_s": tok_s,
            "tflops": tok_s * fpt / 1e12,
            "mfu": tok_s * fpt / peak if peak else None,
            "max_memory_gb": torch.cuda.max_memory_allocated() / 1e9 if cuda else None,
        }
        del engine, model
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
    return {
        "device": device_name(),
        "peak_flops": peak_flops(),
        "config": {
            "size": size,
            "micro_batch": micro_batch,
            "seq": seq,
            "steps": steps,
            "precision": "bf16" if cuda else "fp32",
            "compile": compile_model,
            "torch": torch.__version__,
        },
        "results": results,
        "trilm_over_floatlm_step_time": results["trilm"]["step_seconds"] / results["floatlm"]["step_seconds"],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--engine",
        action="store_true",
        help="step time and MFU through the DeepSpeed engine (the GPU benchmark; on CPU a smoke run)",
    )
    p.add_argument("--size", default=None, help="preset size (CPU default micro, GPU default 1.1b)")
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--seq", type=int, default=None)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--compile", action="store_true", help="GPU: torch.compile the model")
    p.add_argument("--out", default=None, help="directory for the results JSON")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="CPU threads for every contender (1: multi-threaded timings swing on a busy machine)",
    )
    args = p.parse_args()
    if not args.engine or not torch.cuda.is_available():
        torch.set_num_threads(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.engine:
        res = engine_benchmark(
            args.size or "1.1b", args.batch or 8, args.seq or 2048, args.steps * 4, args.compile
        )
        for fam, r in res["results"].items():
            print(
                f"{fam:8s} {r['tokens_per_s']:>10.0f} tok/s  {r['tflops']:7.1f} TFLOP/s  MFU "
                f"{(r['mfu'] or 0) * 100:5.1f}%  step {r['step_seconds'] * 1e3:7.1f} ms  "
                f"mem {r['max_memory_gb'] or 0:.1f} GB"
            )
        print(f"TriLM / FloatLM step time: {res['trilm_over_floatlm_step_time']:.3f} (target ≤ 1.10)")
        tag = "engine-compile" if args.compile else "engine"
    else:
        res = cpu_benchmark(args.size or "micro", args.batch or 16, args.seq or 256, args.rounds, args.steps)
        for name, tok in res["tokens_per_s"].items():
            print(f"{name:9s} {tok:>9.0f} tok/s  ({res['step_seconds'][name] * 1e3:.0f} ms/step)")
        print(f"TriLM / FloatLM step time:       {res['trilm_over_floatlm_step_time']:.3f} (target ≤ 1.10)")
        print(f"trilm FloatLM / HF Llama tok/s:  {res['floatlm_over_hf_tokens_per_s']:.3f} (target ≥ 1.0)")
        tag = "cpu"
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        res["date"] = datetime.date.today().isoformat()
        name = f"train-{tag}-{res.get('device', 'cpu').replace(' ', '_')}-{res['date']}.json"
        (out / name).write_text(json.dumps(res, indent=2))
        print(f"wrote {out / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
