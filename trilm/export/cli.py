"""``trilm export hf SNAPSHOT OUT`` and ``trilm import hf HF_DIR OUT``.

Export writes an ordinary ``LlamaForCausalLM`` directory (TriLM/BiLM weights materialised as γ·Ŵ, Spectra's
"unpacked" release format); import turns such a directory into a trilm snapshot.
"""

from __future__ import annotations

import argparse

import torch
from safetensors.torch import load_file

from trilm.model.hf import export_hf, import_hf
from trilm.model.io import build_model, save_model
from trilm.model.snapshot import WEIGHTS_FILE, SnapshotMeta, read_snapshot

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def build_parser(parser: argparse.ArgumentParser, command: str) -> None:
    sub = parser.add_subparsers(dest="target", required=True)
    hf = sub.add_parser("hf", help="Hugging Face LlamaForCausalLM directory")
    if command == "export":
        hf.add_argument("snapshot", help="trilm snapshot directory (model.safetensors + config.json)")
        hf.add_argument("out", help="output directory")
        hf.add_argument("--dtype", choices=list(_DTYPES), default="float16")
    else:
        hf.add_argument("hf_dir", help="directory with config.json and *.safetensors")
        hf.add_argument("out", help="output trilm snapshot directory")
        hf.add_argument(
            "--family",
            choices=["floatlm", "trilm", "bilm"],
            default=None,
            help="default: from the config's trilm section, else floatlm",
        )
    parser.set_defaults(command=command)


def run(args) -> int:
    if args.command == "export":
        cfg, _ = read_snapshot(args.snapshot)
        state = load_file(f"{args.snapshot}/{WEIGHTS_FILE}")
        out = export_hf(cfg, state, args.out, dtype=_DTYPES[args.dtype])
        print(f"wrote {out} ({cfg.family}, {cfg.name}, scale partitions {cfg.scale_partitions(1)})")
        return 0
    cfg, state = import_hf(args.hf_dir, family=args.family)
    model = build_model(cfg, tp=1, seed=None)
    model.load_full_state_dict(state)
    save_model(model, args.out, meta=SnapshotMeta(imported_from=str(args.hf_dir)))
    print(f"wrote snapshot {args.out} ({cfg.family}, hidden {cfg.hidden}, layers {cfg.layers})")
    return 0
