"""``trilm export hf|packed|gguf SNAPSHOT OUT``, ``trilm export suite RUN… --out S``, ``trilm import …``.

Usage::

    trilm export hf     runs/quickstart/trilm-tiny/snapshots/step-120 out/trilm-tiny-hf [--dtype float16]
    trilm export packed runs/quickstart/trilm-tiny/snapshots/step-120 out/trilm-tiny-packed
    trilm export gguf   runs/quickstart/trilm-tiny/snapshots/step-120 out/t.gguf [--type q4_0 …]
    trilm export compressed-tensors runs/q/gptq-w4g128 out/q-ct [--dtype float16] [--dequantized]
    trilm export suite  runs/quickstart/trilm-tiny runs/quickstart/floatlm-tiny --out runs/quickstart/suite
    trilm import hf     out/trilm-tiny-hf out/snapshot [--family trilm]
    trilm import gguf   SmolLM2-135M-Instruct.Q4_1.gguf out/smollm2   # any llama GGUF, dequantized to fp32

Exports refuse a snapshot without its COMPLETE marker and an output that holds another export.
"""

from __future__ import annotations

import argparse

from trilm.cli_options import add_no_progress
from trilm.config import ConfigError
from trilm.dtypes import DTYPE_NAMES


def build_parser(parser: argparse.ArgumentParser, command: str) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = __doc__.split("\n\n", 1)[1]
    sub = parser.add_subparsers(dest="target", required=True)
    if command == "import":
        hf = sub.add_parser("hf", help="a Hugging Face LlamaForCausalLM directory → trilm snapshot")
        hf.add_argument(
            "hf_dir", help="directory with config.json and model.safetensors (or a sharded index)"
        )
        hf.add_argument("out", help="output trilm snapshot directory (new or empty)")
        hf.add_argument(
            "--family",
            choices=["floatlm", "trilm", "bilm"],
            default=None,
            help="default: from the config's trilm section, else floatlm",
        )
        gg = sub.add_parser(
            "gguf", help="a llama-architecture GGUF file (any type gguf dequantizes) → snapshot"
        )
        gg.add_argument("gguf_file", help="the .gguf file")
        gg.add_argument("out", help="output trilm snapshot directory (new or empty)")
        parser.set_defaults(command=command)
        return
    snapshot_help = "trilm snapshot directory (with its COMPLETE marker)"
    tok_help = "tokenizer.model to use when none is next to the snapshot or in its run (hash-checked)"
    hf = sub.add_parser(
        "hf", help="unpacked LlamaForCausalLM directory with tokenizer files and a model card"
    )
    hf.add_argument("snapshot", help=snapshot_help)
    hf.add_argument("out", help="output directory (new, empty, or an earlier export of this snapshot)")
    hf.add_argument(
        "--dtype",
        choices=DTYPE_NAMES,
        default="float16",
        help="weight dtype (default: float16)",
    )
    hf.add_argument("--tokenizer", default=None, help=tok_help)

    ct = sub.add_parser(
        "compressed-tensors",
        help="int weight-only QuantLM (GPTQ/RTN) as llmcompressor writes it (pack-quantized)",
    )
    ct.add_argument("snapshot", help="QuantLM directory (with its COMPLETE marker)")
    ct.add_argument("out", help="output directory (new, empty, or an earlier export of this QuantLM)")
    ct.add_argument(
        "--dtype", choices=DTYPE_NAMES, default="float16", help="scales and dense tensors (default: float16)"
    )
    ct.add_argument(
        "--dequantized",
        action="store_true",
        help="write the dense HF export instead (what compressed-tensors cannot hold is refused otherwise)",
    )
    ct.add_argument("--tokenizer", default=None, help=tok_help)

    packed = sub.add_parser("packed", help="packed snapshot: ternary/binary codes + partition scales")
    packed.add_argument("snapshot", help=snapshot_help)
    packed.add_argument("out", help="output directory (new, empty, or an earlier export of this snapshot)")
    packed.add_argument(
        "--dtype",
        choices=DTYPE_NAMES,
        default="float16",
        help="dtype of the float tensors: embedding, norms, head (default: float16)",
    )
    packed.add_argument("--tokenizer", default=None, help=tok_help)

    suite = sub.add_parser("suite", help="every checkpoint of runs as latent, HF, packed and GGUF + index")
    suite.add_argument("runs", nargs="+", help="run directories (with snapshots/) or snapshots")
    suite.add_argument("--out", required=True, help="suite directory (reruns skip finished checkpoints)")
    suite.add_argument("--steps", default="", help="comma-separated steps to export (default: all)")
    suite.add_argument("--hf-dtype", choices=DTYPE_NAMES, default="float16")
    suite.add_argument("--no-packed", action="store_true")
    suite.add_argument("--no-gguf", action="store_true")
    suite.add_argument("--table", default="", help="results table whose rows go into the model cards")
    add_no_progress(suite)

    gguf = sub.add_parser(
        "gguf", help="GGUF file for llama.cpp (F16/Q8_0/Q4_0/Q4_1; TriLM/BiLM also TQ1_0/TQ2_0)"
    )
    gguf.add_argument("snapshot", help=snapshot_help)
    gguf.add_argument("out", help="output .gguf file")
    gguf.add_argument(
        "--type",
        choices=["f16", "q8_0", "q4_0", "q4_1", "tq1_0", "tq2_0"],
        default=None,
        help="block weight type (default: a QuantLM's own llama.cpp grid, exactly; else tq2_0 for "
        "TriLM/BiLM, f16 for FloatLM)",
    )
    gguf.add_argument(
        "--fallback",
        choices=["f16", "q8_0"],
        default=None,
        help="with tq1_0/tq2_0: write the tensors whose rows are not a multiple of 256 in this type "
        "(named in the report and the file's trilm.fallback_tensors) instead of refusing the model",
    )
    gguf.add_argument("--tokenizer", default=None, help=tok_help)
    gguf.add_argument(
        "--tokenizer-pre",
        default=None,
        help="llama.cpp pre-tokenizer name for a tokenizer.json (default: the one recorded at GGUF import)",
    )
    parser.set_defaults(command=command)


def open_tied(path) -> bool:
    # deferred for start-up time: torch (keeps `trilm export --help` fast)
    from trilm.store import open_model

    return bool(open_model(path, verify=False).meta.extra.get("tied_embeddings"))


def run(args) -> int:
    if args.command == "import" and args.target == "gguf":
        # deferred for start-up time: torch (keeps `trilm export --help` fast)
        from trilm.export.gguf_import import import_gguf

        print(import_gguf(args.gguf_file, args.out).summary())
        return 0
    if args.command == "import":
        # deferred for start-up time: torch (keeps `trilm export --help` fast)
        from trilm.export.hf import import_snapshot_hf

        out = import_snapshot_hf(args.hf_dir, args.out, family=args.family)
        tied = " (tied embeddings: head.weight holds a copy of the embedding; exports tie them again)"
        print(f"wrote snapshot {out}{tied if open_tied(out) else ''}")
        return 0
    if args.target == "hf":
        # deferred for start-up time: torch (keeps `trilm export --help` fast)
        from trilm.export.hf import export_snapshot_hf

        out = export_snapshot_hf(args.snapshot, args.out, dtype=args.dtype, tokenizer=args.tokenizer)
        print(f"wrote {out} (LlamaForCausalLM, {args.dtype}, tokenizer files, model card)")
        return 0
    if args.target == "compressed-tensors":
        # deferred for start-up time: torch (keeps `trilm export --help` fast)
        from trilm.export.ctensors import export_snapshot_ctensors

        report = export_snapshot_ctensors(
            args.snapshot, args.out, dtype=args.dtype, dequantized=args.dequantized, tokenizer=args.tokenizer
        )
        print(report.summary())
        return 0
    if args.target == "packed":
        # deferred for start-up time: torch (keeps `trilm export --help` fast)
        from trilm.export.packed import export_snapshot_packed

        packed = export_snapshot_packed(args.snapshot, args.out, dtype=args.dtype, tokenizer=args.tokenizer)
        print(packed.summary())
        return 0
    if args.target == "suite":
        # deferred for start-up time: torch (keeps `trilm export --help` fast)
        from trilm.export.suite import SuiteExportConfig, export_suite

        cfg = SuiteExportConfig(
            out=args.out,
            hf_dtype=args.hf_dtype,
            packed=not args.no_packed,
            gguf=not args.no_gguf,
            steps=[int(s) for s in args.steps.split(",") if s.strip()],
            table=args.table,
            progress=not args.no_progress,
        )
        entries, written = export_suite(args.runs, cfg)
        print(f"{args.out}: {written} checkpoints written now, {len(entries)} in the suite index")
        for e in entries:
            sizes = ", ".join(f"{k} {v / 2**20:.2f} MiB" for k, v in e["bytes"].items())
            print(f"  {e['run']:<24} step {e['step']:>7}  {sizes}")
        return 0
    if args.target == "gguf":
        # deferred for start-up time: torch (keeps `trilm export --help` fast)
        from trilm.export.gguf import export_snapshot_gguf

        gguf_report = export_snapshot_gguf(
            args.snapshot,
            args.out,
            qtype=args.type,
            tokenizer=args.tokenizer,
            tokenizer_pre=args.tokenizer_pre,
            fallback=args.fallback,
        )
        print(gguf_report.summary())
        return 0
    raise ConfigError(f"unknown export target {args.target!r}")
