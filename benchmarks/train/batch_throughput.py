"""What a CPU budget buys: training tokens per CPU-second per model size and batch size.

    python -m benchmarks.train.batch_throughput --out benchmarks/results          # the ladder's shapes
    python -m benchmarks.train.batch_throughput --shapes 64x2,192x4 --batches 8,32 --threads 2

A small model on a CPU pays a fixed cost per optimizer step (the optimizer over every tensor, gradient
clipping, Python and DeepSpeed bookkeeping) on top of the matmuls, so halving the batch does not halve the
step time. This measures it through the trainer's own engine (``build_engine``: AdamW, clipping, ZeRO 0):
every (shape, batch) runs its warm-up and then timed steps, each timed by the **process CPU time** (the
machine is shared, so wall clock mostly measures the other jobs; it is printed too). The rounds alternate
between contenders, and the median counts. It prints tokens per CPU-second and the step's fixed overhead, the
intercept of step time against batch size per shape (least squares over the batches measured).

Shapes are ``<hidden>x<layers>`` (FFN ``hidden·8/3`` rounded up to 64, head dim 32 for widths below 128,
else 32·k heads: the ladder's rule, ``configs/suites/ladder.yaml``); batches are sequences of ``--seq``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from benchmarks.common import today, write_result


def shape_fields(spec: str) -> dict:
    """``192x4`` → hidden 192, layers 4, ffn 512, heads 6 (the ladder's shape rule)."""
    hidden, layers = (int(v) for v in spec.lower().split("x"))
    ffn = -(-hidden * 8 // 3 // 64) * 64
    return {"hidden": hidden, "layers": layers, "ffn": ffn, "heads": max(hidden // 32, 1)}


def build(family: str, shape: str, batch: int, seq: int):
    from trilm.model.flops import parameter_counts
    from trilm.model.transformer import Decoder
    from trilm.parallel import init_parallel
    from trilm.train.config import TrainConfig
    from trilm.train.engine import build_engine, set_optimizer_hparams

    info = init_parallel()
    cfg = TrainConfig.from_dict(
        {
            "model": {"preset": f"{family}-nano", "vocab_size": 2048, "context": seq, **shape_fields(shape)},
            "data": {"train_dir": "unused"},
            "seq_len": seq,
            "batch_tokens": batch * seq,
            "tokens": batch * seq * 1000,
            "micro_batch": batch,
            "zero_stage": 0,
            "precision": "fp32",
        }
    )
    model = Decoder(cfg.model.resolved(1), info, seed=0)
    engine = build_engine(model, cfg, 1, info)
    set_optimizer_hparams(engine, 1e-3, 0.1)
    data = torch.randint(0, 2048, (batch, seq + 1))

    def step() -> None:
        engine.backward(engine(data[:, :-1], labels=data[:, 1:]).mean())
        engine.step()

    return step, parameter_counts(cfg.model)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--family", default="floatlm", choices=["floatlm", "trilm", "bilm"])
    p.add_argument("--shapes", default="64x2,96x3,128x4,192x4", help="comma-separated <hidden>x<layers>")
    p.add_argument("--batches", default="4,8,16,32,64", help="sequences per step, comma-separated")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=3, help="timed steps per round")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=None, help="directory for the results JSON")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    batches = [int(b) for b in args.batches.split(",")]
    contenders = {}
    counts = {}
    for shape in shapes:
        for batch in batches:
            step, counts[shape] = build(args.family, shape, batch, args.seq)
            step()  # warm-up
            contenders[(shape, batch)] = step
    times: dict[tuple[str, int], list[float]] = {k: [] for k in contenders}
    walls: dict[tuple[str, int], list[float]] = {k: [] for k in contenders}
    for r in range(args.rounds):
        for key, step in contenders.items():
            c, w = time.process_time(), time.perf_counter()
            for _ in range(args.steps):
                step()
            times[key].append((time.process_time() - c) / args.steps)
            walls[key].append((time.perf_counter() - w) / args.steps)
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    results = []
    print(f"{'shape':>7} {'non-emb':>8} {'batch':>5} {'ms/step':>8} {'tok/CPU-s':>10} {'wall ms':>8}")
    for shape in shapes:
        xs, ys = [], []
        for batch in batches:
            sec = statistics.median(times[(shape, batch)])
            wall = statistics.median(walls[(shape, batch)])
            xs.append(batch)
            ys.append(sec)
            tok = batch * args.seq / sec
            results.append(
                {
                    "shape": shape,
                    **shape_fields(shape),
                    "nonembedding_params": counts[shape].nonembedding,
                    "params": counts[shape].total,
                    "batch_sequences": batch,
                    "batch_tokens": batch * args.seq,
                    "step_cpu_seconds": sec,
                    "step_wall_seconds": wall,
                    "tokens_per_cpu_second": tok,
                }
            )
            print(
                f"{shape:>7} {counts[shape].nonembedding:>8,} {batch:>5} {sec * 1e3:>8.1f} {tok:>10.0f}"
                f" {wall * 1e3:>8.1f}"
            )
        if len(xs) >= 2:
            mx, my = statistics.fmean(xs), statistics.fmean(ys)
            slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
            print(f"{shape:>7} fixed cost per step ≈ {(my - slope * mx) * 1e3:.1f} ms, per sequence"
                  f" {slope * 1e3:.2f} ms")  # fmt: skip
    if args.out:
        path = Path(args.out) / f"batch-throughput-{args.family}-{today()}.json"
        meta = {
            "family": args.family,
            "seq": args.seq,
            "threads": args.threads,
            "rounds": args.rounds,
            "steps_per_round": args.steps,
            "timing": "process CPU time, median of rounds (the machine is shared)",
        }
        write_result(path, {"config": meta, "results": results}, module=__spec__.name)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
