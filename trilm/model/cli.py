"""``trilm model info --preset trilm-3.9b`` / ``trilm model list``: sizes, parameter counts, FLOPs."""

from __future__ import annotations

import argparse

from trilm.families import FAMILIES
from trilm.model.config import ModelConfig, preset, preset_names
from trilm.model.flops import flops_per_token, parameter_counts


def build_parser(parser: argparse.ArgumentParser, command: str) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    info = sub.add_parser("info", help="parameter counts and FLOPs per token of a preset or config")
    src = info.add_mutually_exclusive_group(required=True)
    src.add_argument("--preset", help="e.g. trilm-99m, floatlm-3.9b, bilm-tiny")
    src.add_argument("--config", help="a model YAML file (ModelConfig fields)")
    info.add_argument("overrides", nargs="*", help="dotted overrides, e.g. layers=8 quant.scale_group=row")
    info.add_argument(
        "--seq-len", type=int, default=None, help="sequence length for FLOPs (default: context)"
    )
    sub.add_parser("list", help="all preset names")


def describe(cfg: ModelConfig, seq_len: int | None = None) -> str:
    c = parameter_counts(cfg)
    fpt = flops_per_token(cfg, seq_len)
    bits = FAMILIES[cfg.family].linear_bits
    size_gb = (c.linear * bits + 16 * (c.total - c.linear)) / 8 / 1e9
    rows = [
        ("preset", cfg.name),
        ("family", f"{cfg.family} ({cfg.weight_format} block linears)"),
        (
            "shape",
            f"hidden {cfg.hidden}, ffn {cfg.ffn}, heads {cfg.heads} (kv {cfg.num_kv_heads}), "
            f"layers {cfg.layers}, context {cfg.context}, vocab {cfg.padded_vocab}",
        ),
        ("parameters", f"{c.total:,} ({c.total / 1e6:,.2f}M)"),
        ("non-embedding", f"{c.nonembedding:,} ({c.nonembedding / 1e6:,.2f}M)"),
        ("block linears", f"{c.linear:,} ({c.linear / 1e6:,.2f}M)"),
        ("embedding + head", f"{c.embedding + c.head:,}"),
        ("FLOPs/token (train)", f"{fpt:.4g} (seq {seq_len or cfg.context}; 6N-style + attention)"),
        ("FLOPs/token (fwd)", f"{flops_per_token(cfg, seq_len, training=False):.4g}"),
        ("deployed size", f"{size_gb:.3f} GB ({bits:.3f} bits/linear weight, 16 elsewhere)"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def run(args) -> int:
    if args.action == "list":
        print("\n".join(preset_names()))
        return 0
    cfg = preset(args.preset) if args.preset else ModelConfig.from_yaml(args.config)
    if args.overrides:
        cfg = cfg.with_overrides(args.overrides)
    print(describe(cfg, args.seq_len))
    return 0
