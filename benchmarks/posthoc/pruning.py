"""Benchmark: policy-gradient structured pruning vs its baselines on the post-hoc FloatLM.

Launch::

    python -m benchmarks.posthoc.pruning --snapshot runs/posthoc/floatlm/snapshots/step-192 \\
        --data-dir runs/posthoc/data --work-dir runs/pruning-bench
    python -m benchmarks.posthoc.pruning --quick ...          # tiny budgets: a smoke run of every path

For every granularity (KV-head groups, MLP channels, blocks) and keep ratio (0.9, 0.8, 0.7) it prunes the
model with each method through :func:`trilm.prune.prune` — PG (initialised from Wanda-SP for heads and
channels, from block importance for blocks), magnitude, Wanda-SP, block importance — writes the smaller
snapshot, loads it back with ``trilm.infer.load_inference_model`` and measures the validation perplexity on
fixed windows of the validation split (calibration uses the train split only). Each row also has the
parameter count, the wall time of the pruning run and, for PG, the peak memory of a search step.

Memory, side by side on one batch of the search: the weights, a plain inference forward + loss, a PG step
(K masked forward passes, measured inside the search) and a forward + backward through continuous masks
(what a gradient-based mask search would hold). The machine may be shared with other jobs: times are noisy,
the memory ratios are not (they count allocator bytes, not wall time).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.common import RESULTS, today, write_result
from trilm.data.sampler import ValidationSet
from trilm.data.shards import TokenShards
from trilm.infer import load_inference_model
from trilm.memory import measure_peak, model_bytes
from trilm.model.flops import parameter_counts
from trilm.prune import PGConfig, PruneConfig, prune
from trilm.prune.units import unit_group
from trilm.store.snapshot import read_snapshot_config

METHODS = {
    "head": ("magnitude", "wanda", "pg"),
    "channel": ("magnitude", "wanda", "pg"),
    "layer": ("block-importance", "pg"),
}
PG_INIT = {"head": "wanda", "channel": "wanda", "layer": "block-importance"}


def latest_snapshot(run_dir: Path) -> Path:
    steps = sorted(
        (int(p.name.split("-")[1]), p)
        for p in (run_dir / "snapshots").glob("step-*")
        if (p / "config.json").is_file() and (p / "COMPLETE").exists()
    )
    if not steps:
        raise SystemExit(f"{run_dir}/snapshots: no complete snapshot (train the model first)")
    return steps[-1][1]


@torch.no_grad()
def validation_loss(model, batches: list[torch.Tensor]) -> float:
    total, count = 0.0, 0
    for batch in batches:
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten(), reduction="sum")
        total += float(loss)
        count += batch[:, 1:].numel()
    return total / count


def backprop_peak(model, batch: torch.Tensor, groups) -> int:
    """Peak bytes of forward + backward through continuous unit masks (the weights frozen)."""
    from trilm.prune.masks import UnitMasks

    masks = {g.granularity: torch.full((g.total,), 0.5, requires_grad=True) for g in groups}
    with UnitMasks(model, groups) as hooks, measure_peak("cpu") as peak:
        hooks.set(masks, detach=False)
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())
        loss.backward()
    return peak.peak_bytes


def memory_rows(snapshot: Path, pg: PGConfig, train_dir: Path) -> dict:
    model = load_inference_model(snapshot)
    shards = TokenShards.open(train_dir)
    n = pg.batch_size * (pg.seq_len + 1)
    batch = torch.from_numpy(shards.tokens(0, n).astype("int64")).view(pg.batch_size, pg.seq_len + 1)
    with torch.inference_mode(), measure_peak("cpu") as forward:
        logits = model(batch[:, :-1])
        F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())
    out = {"weights_bytes": model_bytes(model), "inference_forward_bytes": forward.peak_bytes}
    for granularity in ("head", "channel"):  # (a block mask enters as a python float: no graph)
        out[f"backprop_{granularity}_bytes"] = backprop_peak(
            model, batch, [unit_group(model.cfg, granularity)]
        )
    return out


def run_one(args, snapshot, granularity, keep, method, pg: PGConfig, work: Path) -> dict:
    out = work / f"{granularity}-{keep:g}-{method}"
    reused = out.is_dir() and (out / "config.json").is_file()
    if not reused:
        cfg = PruneConfig(
            model=str(snapshot),
            method=method,
            granularity=granularity,
            keep=keep,
            calib=str(args.data_dir / "train"),
            out=str(out),
            calib_samples=args.calib_samples,
            pg=pg.replace(init=PG_INIT[granularity]),
        )
        prune(cfg, progress=not args.no_progress, log=None)
    _, meta = read_snapshot_config(out)
    record = meta.extra["pruning"]
    row = {
        "granularity": granularity,
        "keep": keep,
        "method": method,
        "units_kept": record["units"][granularity]["kept"],
        "units_total": record["units"][granularity]["total"],
        "kept_per_layer": record["units"][granularity]["kept_per_layer"],
        "params": record["params_after"],
        "seconds": record["seconds"],
        "reused": reused,
        "snapshot": str(out),
    }
    if record.get("pg"):
        row["pg_first_loss"] = record["pg"]["first_loss"]
        row["pg_last_loss"] = record["pg"]["last_loss"]
        row["pg_step_peak_bytes"] = record["pg"]["peak_step_bytes"]
        row["inference_forward_bytes"] = record["pg"]["inference_forward_bytes"]
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--snapshot", type=Path, default=None, help="the dense FloatLM snapshot")
    parser.add_argument("--run-dir", type=Path, default=Path("runs/posthoc/floatlm"), help="or its run")
    parser.add_argument("--data-dir", type=Path, default=Path("runs/posthoc/data"), help="train/ validation/")
    parser.add_argument("--work-dir", type=Path, default=Path("runs/pruning-bench"))
    parser.add_argument("--keeps", default="0.9,0.8,0.7")
    parser.add_argument("--granularities", default="head,channel,layer")
    parser.add_argument("--steps", type=int, default=PGConfig.steps)
    parser.add_argument("--lr", type=float, default=0.0, help="0: the per-granularity defaults")
    parser.add_argument("--batch-size", type=int, default=PGConfig.batch_size)
    parser.add_argument("--pg-seq-len", type=int, default=PGConfig.seq_len)
    parser.add_argument("--calib-samples", type=int, default=128)
    parser.add_argument("--eval-sequences", type=int, default=64, help="validation windows (model context)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None, help="results file (default benchmarks/results/…)")
    parser.add_argument("--quick", action="store_true", help="tiny budgets: checks every path runs")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    snapshot = args.snapshot or latest_snapshot(args.run_dir)
    if args.quick:
        args.steps, args.calib_samples, args.eval_sequences = 4, 8, 8
    pg = PGConfig(steps=args.steps, lr=args.lr, batch_size=args.batch_size, seq_len=args.pg_seq_len)
    keeps = [float(k) for k in args.keeps.split(",")]
    granularities = args.granularities.split(",")
    work = args.work_dir / ("quick" if args.quick else f"steps{pg.steps}-lr{pg.lr or 'auto'}")
    work.mkdir(parents=True, exist_ok=True)

    cfg, _ = read_snapshot_config(snapshot)
    seq = cfg.context
    valid = ValidationSet(TokenShards.open(args.data_dir / "validation"), seq, args.eval_sequences)
    batches = list(valid.batches(8))
    dense_loss = validation_loss(load_inference_model(snapshot), batches)
    print(
        f"{cfg.name} ({snapshot}): {parameter_counts(cfg).total:,} params, validation loss {dense_loss:.4f} "
        f"(ppl {math.exp(dense_loss):.3f}) on {len(valid)} windows of {seq} tokens"
    )
    started = time.perf_counter()
    memory = memory_rows(snapshot, pg, args.data_dir / "train")
    rows = []
    for granularity in granularities:
        for keep in keeps:
            for method in METHODS[granularity]:
                row = run_one(args, snapshot, granularity, keep, method, pg, work)
                row["val_loss"] = validation_loss(load_inference_model(row["snapshot"]), batches)
                row["val_ppl"] = math.exp(row["val_loss"])
                rows.append(row)
                print(
                    f"{granularity:>7} keep {keep:.1f} {method:>16}: ppl {row['val_ppl']:8.3f}  "
                    f"params {row['params']:>10,}  units {row['units_kept']}/{row['units_total']}  "
                    f"{row['seconds']:7.1f}s" + ("  (reused)" if row["reused"] else "")
                )
    pg_peaks = [r["pg_step_peak_bytes"] for r in rows if r.get("pg_step_peak_bytes") is not None]
    memory["pg_step_bytes_max"] = max(pg_peaks) if pg_peaks else None
    direction = []
    for granularity in granularities:
        for keep in keeps:
            by = {r["method"]: r for r in rows if r["granularity"] == granularity and r["keep"] == keep}
            init = PG_INIT[granularity]
            if "pg" in by and init in by:
                direction.append(
                    {
                        "granularity": granularity,
                        "keep": keep,
                        "pg_ppl": by["pg"]["val_ppl"],
                        f"{init}_ppl": by[init]["val_ppl"],
                        "pg_at_most_init": by["pg"]["val_ppl"] <= by[init]["val_ppl"],
                    }
                )
    result = {
        "benchmark": "pruning",
        "threads": args.threads,
        "machine_note": "shared machine: wall times are noisy; memory is allocator bytes",
        "snapshot": str(snapshot),
        "model": cfg.name,
        "dense": {
            "params": parameter_counts(cfg).total,
            "val_loss": dense_loss,
            "val_ppl": math.exp(dense_loss),
        },
        "eval": {"split": str(args.data_dir / "validation"), "windows": len(valid), "seq_len": seq},
        "calibration": {"split": str(args.data_dir / "train"), "stats_windows": args.calib_samples},
        "pg": pg.to_dict(),
        "memory": memory,
        "rows": rows,
        "direction": direction,
        "seconds": time.perf_counter() - started,
    }
    path = args.json or RESULTS / f"pruning-cpu-{today()}.json"
    if args.quick and args.json is None:
        path = work / "pruning-quick.json"
    write_result(path, result, module=__spec__.name, argv=argv, indent=2)
    mib = 2**20
    print(
        f"memory on one search batch ({pg.batch_size}×{pg.seq_len}): "
        f"weights {memory['weights_bytes'] / mib:.1f} MiB; above them: "
        f"inference forward {memory['inference_forward_bytes'] / mib:.1f} MiB, "
        f"PG step {(memory['pg_step_bytes_max'] or 0) / mib:.1f} MiB, "
        f"forward+backward through channel masks {memory['backprop_channel_bytes'] / mib:.1f} MiB"
    )
    for d in direction:
        init = PG_INIT[d["granularity"]]
        verdict = "PG ≤ its init metric" if d["pg_at_most_init"] else "PG worse than its init metric"
        print(
            f"{d['granularity']:>7} keep {d['keep']:.1f}: PG {d['pg_ppl']:.3f} vs "
            f"{init} {d[f'{init}_ppl']:.3f} → {verdict}"
        )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
