"""``trilm eval``: perplexity, the whole suite into the results table, lm-eval tasks.

Usage::

    trilm eval ppl   runs/quickstart/trilm-tiny/snapshots/step-120 --data runs/quickstart/data/validation
    trilm eval ppl   out/trilm-tiny-hf --data notes.txt --seq-len 256 --stride 128 --json ppl.json
    trilm eval suite runs/quickstart/trilm-tiny runs/quickstart/floatlm-tiny --table results.csv \\
                     [--data runs/quickstart/data/validation] [--tasks trilm_local --limit 20]
    trilm eval lm-eval runs/quickstart/trilm-tiny/snapshots/step-120 --tasks trilm_local [--limit 20]

MODEL is a snapshot, a packed snapshot (QuantLM, packed export) or a Hugging Face LLaMA directory.
``--data`` is a prepared split, a SlimPajama folder, a .jsonl file (field "text") or a .txt file. The
shipped offline lm-eval tasks are trilm_cloze, trilm_lastword, trilm_rolling, trilm_continue (group
trilm_local); lm-eval's own tasks work too when their datasets are available.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from trilm.atomic import write_text
from trilm.cli_options import add_device, add_no_progress, add_tokenizer
from trilm.dtypes import DTYPE_NAMES
from trilm.eval.harness import run_lm_eval


def build_parser(parser: argparse.ArgumentParser, command: str = "eval") -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = __doc__.split("\n\n", 1)[1]
    sub = parser.add_subparsers(dest="action", required=True)

    p = sub.add_parser("ppl", help="loss, perplexity, bits per token and per byte with rolling windows")
    p.add_argument("model", help="snapshot, packed snapshot or Hugging Face directory")
    p.add_argument("--data", required=True, help="prepared split, SlimPajama folder, .jsonl or .txt")
    p.add_argument("--split", default="validation", help="split of a SlimPajama root folder")
    p.add_argument("--seq-len", type=int, default=0, help="window length (default: the model's context)")
    p.add_argument("--stride", type=int, default=0, help="new tokens per window (default: seq-len)")
    p.add_argument("--max-tokens", type=int, default=0, help="only the first N tokens (0: all)")
    p.add_argument("--batch-size", type=int, default=8)
    add_device(p)
    add_tokenizer(p)
    p.add_argument("--json", type=Path, default=None, help="also write the result as JSON here")
    add_no_progress(p)

    p = sub.add_parser("suite", help="evaluate every checkpoint into the results table")
    p.add_argument("paths", nargs="+", help="run directories, exported suites, snapshots or HF directories")
    p.add_argument("--table", type=Path, required=True, help="results table (.csv, .json, .jsonl)")
    p.add_argument("--data", action="append", default=[], help="perplexity source (repeatable)")
    p.add_argument("--seq-len", type=int, default=0)
    p.add_argument("--stride", type=int, default=0)
    p.add_argument("--max-tokens", type=int, default=0)
    p.add_argument("--tasks", default="", help="comma-separated lm-eval tasks (metrics as extra columns)")
    p.add_argument("--limit", type=float, default=0.0, help="lm-eval examples per task (0: all)")
    p.add_argument("--batch-size", type=int, default=8)
    add_device(p)
    p.add_argument("--no-recorded", action="store_true", help="skip the recorded val_loss rows")
    p.add_argument("--replace", action="store_true", help="re-evaluate and overwrite rows already there")
    add_no_progress(p)

    p = sub.add_parser(
        "lm-eval", help="lm-evaluation-harness tasks with trilm's model (offline tasks shipped)"
    )
    p.add_argument("model", help="snapshot, packed snapshot or Hugging Face directory")
    p.add_argument("--tasks", required=True, help="comma-separated task or group names, e.g. trilm_local")
    p.add_argument("--limit", type=float, default=0.0, help="examples per task (0: all)")
    p.add_argument("--num-fewshot", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=8)
    add_device(p)
    p.add_argument("--dtype", default="float32", choices=DTYPE_NAMES)
    p.add_argument("--packed", action="store_true", help="run TriLM/BiLM linears as packed layers")
    p.add_argument("--include-path", action="append", default=[], help="more task YAML directories")
    p.add_argument("--output", type=Path, default=None, help="write lm-eval's results JSON here")


def run(args: argparse.Namespace) -> int:
    return {"ppl": _ppl, "suite": _suite, "lm-eval": _lm_eval}[args.action](args)


def _ppl(args) -> int:
    # deferred for start-up time: torch (keeps `trilm eval --help` fast)
    from trilm.eval.model import load_eval_model
    from trilm.eval.ppl import evaluate_perplexity

    em = load_eval_model(
        args.model, device=args.device, tokenizer=args.tokenizer, force_tokenizer=args.force_tokenizer
    )
    if em.tokenizer_forced:
        print(f"warning: --force-tokenizer: {em.tokenizer_forced}", file=sys.stderr)
    result = evaluate_perplexity(
        em,
        args.data,
        seq_len=args.seq_len or None,
        stride=args.stride or None,
        max_tokens=args.max_tokens or None,
        batch_size=args.batch_size,
        split=args.split,
        progress=not args.no_progress,
    )
    print(result.summary())
    if args.json:
        write_text(args.json, json.dumps(result.to_dict(), indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


def _suite(args) -> int:
    # deferred for start-up time: torch (keeps `trilm eval --help` fast)
    from trilm.eval.suite import SuiteEvalConfig, evaluate_suite

    evals = SuiteEvalConfig(
        data=list(args.data),
        seq_len=args.seq_len,
        stride=args.stride,
        max_tokens=args.max_tokens,
        tasks=[t.strip() for t in args.tasks.split(",") if t.strip()],
        limit=args.limit,
        batch_size=args.batch_size,
        device=args.device,
        recorded=not args.no_recorded,
        replace=args.replace,
        progress=not args.no_progress,
    )
    rows = evaluate_suite(args.paths, args.table, evals)
    checkpoints = len({(r.run, r.step) for r in rows})
    print(f"{args.table}: {len(rows)} rows from {checkpoints} checkpoints evaluated now")
    for r in rows:
        bits = f"{r.bits_per_param:.3f} bits/param"
        print(f"  {r.run:<28} step {r.step:>7}  {r.eval:<20} loss {r.loss:.4f}  {bits}")
    return 0


def _lm_eval(args) -> int:
    # deferred for start-up time: lm_eval (keeps `trilm eval --help` fast)
    from lm_eval.utils import make_table

    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    results = run_lm_eval(
        args.model,
        tasks,
        limit=args.limit or None,
        batch_size=args.batch_size,
        num_fewshot=args.num_fewshot,
        device=args.device,
        dtype=args.dtype,
        packed=args.packed,
        include_path=args.include_path,
    )
    print(make_table(results))
    if args.output:
        write_text(args.output, json.dumps(results, indent=2, default=str) + "\n")
        print(f"wrote {args.output}")
    return 0
