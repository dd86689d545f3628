"""``trilm prune MODEL --method pg --granularity {head,channel,layer} --keep R --calib DATA --out DIR``."""

from __future__ import annotations

import argparse

from trilm.cli_options import add_device, add_no_progress
from trilm.prune.metrics import METRICS
from trilm.prune.run import METHODS, PRUNE_DTYPES, PruneConfig, prune
from trilm.prune.search import LR_DEFAULTS, PGConfig


def build_parser(parser: argparse.ArgumentParser, command: str = "prune") -> None:
    parser.description = (
        "Structured pruning of a FloatLM (or a TriLM/BiLM's latent weights): policy-gradient mask search "
        "(forward passes only) or a metric baseline; writes a physically smaller snapshot."
    )
    parser.add_argument("model", help="a trilm snapshot directory or a Hugging Face Llama directory")
    parser.add_argument("--method", default="pg", choices=METHODS, help="pg (default) or a baseline metric")
    parser.add_argument(
        "--granularity",
        required=True,
        help="head (KV-head groups), channel (MLP intermediate channels), layer (blocks) or head,channel",
    )
    parser.add_argument("--keep", type=float, required=True, help="fraction of units kept, in (0, 1]")
    parser.add_argument("--calib", default="", help="calibration text: prepared split, folder, .jsonl, .txt")
    parser.add_argument("--out", required=True, help="output snapshot directory (must not exist or be empty)")
    parser.add_argument("--split", default="train", help="split of a SlimPajama root folder (default train)")
    parser.add_argument("--calib-samples", type=int, default=128, help="windows for the metric statistics")
    parser.add_argument(
        "--calib-seq-len", type=int, default=0, help="tokens per statistics window (0: min(context, 1024))"
    )
    parser.add_argument(
        "--per-layer", action="store_true", help="keep the same fraction in every block (default: global)"
    )
    pg = PGConfig()
    group = parser.add_argument_group("policy-gradient search (--method pg)")
    group.add_argument("--steps", type=int, default=pg.steps, help=f"search steps (default {pg.steps})")
    group.add_argument("--batch-size", type=int, default=pg.batch_size, help="windows per step")
    group.add_argument("--pg-seq-len", type=int, default=pg.seq_len, help="tokens per search window")
    group.add_argument("--mask-samples", type=int, default=pg.mask_samples, help="K masks per step (>= 2)")
    defaults = ", ".join(f"{k} {v}" for k, v in LR_DEFAULTS.items())
    group.add_argument("--lr", type=float, default=pg.lr, help=f"peak learning rate (default: {defaults})")
    group.add_argument("--min-lr-ratio", type=float, default=pg.min_lr_ratio, help="final lr / peak lr")
    group.add_argument("--warmup", type=int, default=pg.warmup, help="linear warmup steps")
    group.add_argument("--baseline-window", type=float, default=pg.baseline_window, help="W of the baseline")
    group.add_argument("--penalty", type=float, default=pg.penalty, help="λ of the optional entropy penalty")
    group.add_argument(
        "--init",
        default=pg.init,
        choices=["auto", *METRICS, "uniform"],
        help="score initialisation (auto: wanda for heads/channels, block-importance for layers)",
    )
    parser.add_argument("--seed", type=int, default=0, help="calibration sampling and mask sampling seed")
    add_device(parser, help="cpu, cuda, cuda:1 or auto")
    parser.add_argument("--dtype", default="float32", choices=PRUNE_DTYPES)
    add_no_progress(parser)


def config_from_args(args) -> PruneConfig:
    pg = PGConfig(
        steps=args.steps,
        batch_size=args.batch_size,
        seq_len=args.pg_seq_len,
        mask_samples=args.mask_samples,
        lr=args.lr,
        min_lr_ratio=args.min_lr_ratio,
        warmup=args.warmup,
        baseline_window=args.baseline_window,
        penalty=args.penalty,
        init=args.init,
        seed=args.seed,
    )
    return PruneConfig(
        model=args.model,
        method=args.method,
        granularity=args.granularity,
        keep=args.keep,
        calib=args.calib,
        out=args.out,
        split=args.split,
        calib_samples=args.calib_samples,
        calib_seq_len=args.calib_seq_len,
        per_layer=args.per_layer,
        device=args.device,
        dtype=args.dtype,
        pg=pg,
    )


def run(args) -> int:

    report = prune(config_from_args(args), progress=not args.no_progress)
    print(f"wrote {report.out}")
    return 0
