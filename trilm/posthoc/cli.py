"""``trilm quantize SNAPSHOT_OR_HF_DIR --method {rtn,gptq,omniquant,...} --bits B --calib DATA --out DIR``.

``--target gguf-q4_0`` (``gguf-q4_1``, ``gguf-q8_0``) quantizes GPTQ/RTN onto llama.cpp's block grid, so
``trilm export gguf`` writes that block type holding exactly the QuantLM's values.

Method options come from the methods' config dataclasses (``UniformConfig``, ``OmniQuantConfig``, and
whatever later methods register), so a new method's settings appear here without touching this file; an
option that the chosen method does not have is refused, naming the method.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import types
import typing
from pathlib import Path
from typing import Any, get_args, get_origin

from trilm.cli_options import add_device, add_no_progress, add_tokenizer
from trilm.config import ConfigError
from trilm.dtypes import parse_dtype
from trilm.posthoc import METHODS as methods
from trilm.posthoc.calibration import CalibrationConfig
from trilm.posthoc.engine import EngineConfig
from trilm.posthoc.omniquant import mode_config
from trilm.posthoc.quantlm import QuantizeJob, open_source, quantize_to_quantlm
from trilm.posthoc.registry import MethodOptions, get_method

ENGINE_DESTS = ("device", "forward_batch")
SCALE_DTYPES = ("float16", "float32")


def _base_type(tp: Any) -> Any:
    if get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        return args[0] if len(args) == 1 else str
    return tp


def _method_options(parser: argparse.ArgumentParser, methods: dict) -> dict[str, set[str]]:
    """Add one option per config field of every method; returns field → methods that have it."""
    owners: dict[str, set[str]] = {}
    fields: dict[str, tuple[Any, dict[str, Any]]] = {}
    for name, method in methods.items():
        hints = typing.get_type_hints(method.config_cls)
        for f in dataclasses.fields(method.config_cls):
            owners.setdefault(f.name, set()).add(name)
            fields.setdefault(f.name, (_base_type(hints[f.name]), {}))[1][name] = f.default
    group = parser.add_argument_group("method settings (each names the methods that have it)")
    for field, (tp, defaults) in fields.items():
        flag = "--" + field.replace("_", "-")
        values = {repr(v) for v in defaults.values()}
        default = values.pop() if len(values) == 1 else "per method"
        help_text = f"{', '.join(sorted(owners[field]))}; default {default}"
        if tp is bool:
            action = argparse.BooleanOptionalAction
            group.add_argument(flag, dest=field, action=action, default=argparse.SUPPRESS, help=help_text)
        else:
            kind = tp if tp in (int, float, str) else str
            group.add_argument(flag, dest=field, type=kind, default=argparse.SUPPRESS, help=help_text)
    return owners


def build_parser(parser: argparse.ArgumentParser, command: str = "quantize") -> None:

    parser.add_argument("model", type=Path, help="FloatLM snapshot or Hugging Face Llama directory")
    parser.add_argument(
        "--method",
        required=True,
        choices=sorted(methods),
        help="; ".join(f"{n}: {m.description}" for n, m in sorted(methods.items())),
    )
    parser.add_argument("--out", type=Path, required=True, help="QuantLM directory to write")
    parser.add_argument(
        "--mode", default=None, help="omniquant shorthand for bits/act-bits/group-size: W4A16, W3A16g128, …"
    )
    cal = parser.add_argument_group("calibration")
    cal.add_argument(
        "--calib",
        default=None,
        help="prepared split, SlimPajama folder, .jsonl(.zst) or .txt (not needed by data-free methods: "
        + ", ".join(sorted(n for n, m in methods.items() if m.data_free))
        + ")",
    )
    cal.add_argument("--calib-split", default="train", help="split of a SlimPajama root folder (train)")
    cal.add_argument("--samples", type=int, default=128, help="calibration sequences N (128)")
    cal.add_argument(
        "--seq-len", type=int, default=None, help="tokens per sequence (default: min(2048, context))"
    )
    cal.add_argument("--seed", type=int, default=0, help="calibration sampling seed (0)")
    add_tokenizer(cal, type=Path)
    eng = parser.add_argument_group("engine")
    add_device(eng)
    eng.add_argument("--forward-batch", type=int, default=8, help="sequences per block forward (8)")
    eng.add_argument(
        "--true-sequential",
        action="store_true",
        help="calibrate [k,v,q] → [o] → [up,gate] → [down] in turn (GPTQ-family methods)",
    )
    scale_help = "precision of the stored scales (default: the formats', trilm.formats.SCALE_DTYPE)"
    eng.add_argument("--scale-dtype", choices=SCALE_DTYPES, help=scale_help)
    add_no_progress(eng)
    ev = parser.add_argument_group("evaluation")
    ev.add_argument(
        "--eval", type=Path, default=None, help="prepared split: validation loss of the written QuantLM"
    )
    ev.add_argument("--eval-sequences", type=int, default=0, help="0 = every validation sequence")
    parser.set_defaults(_owners=_method_options(parser, methods))


def job_from_args(args) -> Any:
    """The QuantizeJob an argument namespace asks for (all validation errors name the option)."""

    method = get_method(args.method)
    own = {f.name for f in dataclasses.fields(method.config_cls)}
    given = {k: v for k, v in vars(args).items() if k in args._owners}
    foreign = sorted(set(given) - own)
    if foreign:
        flags = ", ".join("--" + k.replace("_", "-") for k in foreign)
        raise ConfigError(f"{flags}: not a setting of --method {args.method} (its settings: {sorted(own)})")
    values: dict[str, Any] = {}
    if args.mode:
        if args.method != "omniquant":
            raise ConfigError("--mode: only --method omniquant takes a mode (use --bits/--group-size)")

        values = mode_config(args.mode).to_dict()
    values.update(given)
    implied = getattr(method.config_cls, "implied_settings", None)
    if implied is not None:  # e.g. --target gguf-q4_0 fixes bits, group size and sym unless given
        values = {**implied(values), **values}
    config = method.config(**values)
    opened = open_source(args.model, args.tokenizer, args.force_tokenizer)  # once: the job below reuses it
    if opened.tokenizer.forced:
        print(f"warning: --force-tokenizer: {opened.tokenizer.forced}", file=sys.stderr)
    cfg = opened.config
    seq_len = args.seq_len or min(2048, cfg.context)
    calib = None  # a data-free method reads none (quantize_to_quantlm names --calib when one is missing)
    if args.calib is not None and not method.data_free:
        calib = CalibrationConfig(
            source=str(args.calib),
            samples=args.samples,
            seq_len=seq_len,
            seed=args.seed,
            split=args.calib_split,
        )
    options = MethodOptions(true_sequential=args.true_sequential, seed=args.seed)
    if args.scale_dtype is not None:
        options = dataclasses.replace(options, scale_dtype=parse_dtype(args.scale_dtype, "--scale-dtype"))
    return QuantizeJob(
        source=args.model,
        method=args.method,
        config=config,
        calib=calib,
        out=args.out,
        engine=EngineConfig(device=args.device, batch_size=args.forward_batch, progress=not args.no_progress),
        options=options,
        tokenizer=args.tokenizer,
        force_tokenizer=args.force_tokenizer,
        eval_split=args.eval,
        eval_sequences=args.eval_sequences,
        eval_seq_len=seq_len,
        opened=opened,
    )


def run(args) -> int:

    job = job_from_args(args)
    if args.calib is not None and job.calib is None:
        print(f"note: --method {job.method} uses no calibration data; --calib {args.calib} is not read")
    summary = quantize_to_quantlm(job)
    q = summary.quant
    bits = q["bits"]

    def fmt(value) -> str:
        return f"{value:.3f}" if value is not None else "n/a"

    print(f"wrote {summary.out}: {job.method} {q['method_settings']}")
    if any("minimum_bits" in rec for rec in q["layers"].values()):
        print("  bits/weight per layer: paper (value bits) / information-theoretic minimum / stored")
        for name, rec in q["layers"].items():
            print(
                f"    {name:<24} {fmt(rec.get('value_bits'))} / {fmt(rec.get('minimum_bits'))} / "
                f"{rec['bits_per_weight']:.3f}"
            )
    print(
        f"  bits/weight: {fmt(bits['paper'])} as the paper counts, {fmt(bits.get('minimum'))} minimum, "
        f"{bits['stored']:.3f} as stored"
    )
    print(f"  time: {q['seconds']['quantize']:.1f} s quantizing, {q['seconds']['total']:.1f} s in all")
    print(f"  memory: {summary.report.memory_line()}")
    if summary.val_loss is not None:
        print(f"  validation loss {summary.val_loss:.4f} (perplexity {math.exp(summary.val_loss):.2f})")
    return 0
